"""Command line: parses arguments, calls the pipeline, renders results. No logic of its own.

Exit codes (README "Exit codes"): 0 success; 1 a check found a mismatch; 2 unusable input or a
refused request; 3 an internal error (a bug); 128 + N ended by signal N. Errors are printed as
one clear line on stderr, never as a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from mxconvert.cli.startup import FastApp, LazyConsole, escape
from mxconvert.cli.terminal import EscapingHook, OutputError, Stdout, quiet_stdout
from mxconvert.core.errors import (
    Interrupted,
    MxconvertError,
    install_signal_handlers,
    note_outcome,
    raise_if_lost,
    reported,
)

app = FastApp(
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run.",
    pretty_exceptions_enable=False,
)


def _make_out_console():
    from rich.console import Console

    console = Console(soft_wrap=True, file=STDOUT)
    if not console.is_terminal and not os.environ.get("COLUMNS"):  # piped or in CI: tables do not wrap
        console = Console(soft_wrap=True, width=200, file=STDOUT)
    console.push_render_hook(EscapingHook())  # names from files never drive the terminal
    return console


def _make_err_console():
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    console.push_render_hook(EscapingHook())
    return console


#: The command's results go through this stdout: a write that fails is an `OutputError`.
STDOUT = Stdout()


#: rich is imported on the first print (`--version` and `--json` output never import it).
out_console = LazyConsole(_make_out_console)
err_console = LazyConsole(_make_err_console)


def _guard(fn):
    """Turn our errors (and anything unexpected) into a one-line message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        note_outcome("")
        try:
            result = fn(*args, **kwargs)
            STDOUT.flush()  # a full or closed stdout is found while the exit code can still say so
            raise_if_lost()  # a signal whose Interrupted was swallowed still ends the run as one
            return result
        except OutputError as exc:  # the work stands; only its report is lost
            quiet_stdout()
            err_console.print(exc.message(_outcome_now()), highlight=False, markup=False)
            raise typer.Exit(exc.exit_code) from None
        except MxconvertError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
            if kwargs.get("as_json"):  # a --json consumer gets the error as JSON too
                try:
                    _print_json(_error_json(exc))
                    STDOUT.flush()
                except OutputError:
                    quiet_stdout()  # the error is on stderr; its exit code stands
            raise typer.Exit(exc.exit_code) from None
        except Interrupted as exc:
            reported(exc)
            err_console.print(exc.message(), highlight=False, markup=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:  # SIGINT where our handler is not installed (e.g. in-process use)
            err_console.print("interrupted by SIGINT; nothing was written")
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except OSError as exc:  # the user's disk or files, not a bug: say which file and why
            where = f"{exc.filename}: " if exc.filename else ""
            err_console.print(f"[bold red]error:[/] {escape(where + (exc.strerror or str(exc)))}", highlight=False)
            raise typer.Exit(2) from None
        except Exception as exc:  # a bug in mxconvert: still no traceback, but say so
            err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
            err_console.print("please report this with the command you ran (set MXCONVERT_DEBUG=1 for a traceback)")
            import os

            if os.environ.get("MXCONVERT_DEBUG"):
                raise
            raise typer.Exit(3) from None

    return wrapper


#: Version of the JSON printed for an error under --json (stdout; the message is on stderr too).
ERROR_JSON_SCHEMA = "mxconvert.error/1"


def _error_json(exc: MxconvertError) -> dict:
    return {
        "schema": ERROR_JSON_SCHEMA,
        "ok": False,
        "error": {"kind": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code},
    }


def _table(*columns: str, title: str | None = None, key: int = 0, values=()):
    """A table that wraps and never cuts: every column folds, the key column is as wide as its
    longest value, so two backends or tensors that share a prefix stay distinguishable at 80 columns."""
    from rich.table import Table

    table = Table(title=title)
    longest = max((len(str(row[key])) for row in values), default=0)
    for i, col in enumerate(columns):
        if i == key:
            table.add_column(col, overflow="fold", no_wrap=True, min_width=max(len(col), longest))
        else:
            table.add_column(col, overflow="fold")
    return table


def _version_callback(value: bool) -> None:
    if value:
        from mxconvert.core.version import __version__

        sys.stdout.write(f"mxconvert {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run."""


def _warn_line(text: str) -> None:
    """Print a warning about the checkpoint (e.g. NVFP4 gate/up global scales that differ) on stderr."""
    err_console.print(f"[yellow]warning:[/] {text}", highlight=False)


def _print_json(data: object) -> None:
    """JSON as RFC 8259 has it: a NaN or infinity reaching here is a bug (inputs refuse them)."""
    STDOUT.write(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _outcome_now() -> str:
    """What the output folder holds, as the run last noted it (`errors.note_outcome`)."""
    from mxconvert.core.errors import current_outcome

    return current_outcome()


# ---- shared options ------------------------------------------------------------------------------
ProfileOpt = Annotated[
    list[str],
    typer.Option(
        "--profile",
        "-p",
        help="Target device: a built-in name (see `mxconvert profiles`) or a .json/.toml profile file.",
    ),
]
RuntimeOpt = Annotated[
    str | None,
    typer.Option(
        "--runtime",
        help="Runtime revision: vllm-0.33 (default), vllm-0.20 (MXFP4) or vllm-0.15 (NVFP4); see `mxconvert backends`.",
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        "-b",
        help="auto, a vLLM --moe-backend name (flashinfer_trtllm, triton, marlin, ...) or a backend name as printed (TRITON, FLASHINFER_TRTLLM_MXFP4_BF16, ...).",
    ),
]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel size (the MoE is then not TP-sliced).")]
DpOpt = Annotated[int, typer.Option("--dp", help="Data-parallel size (dp > 1 rules out monolithic kernels).")]
ActOpt = Annotated[
    str,
    typer.Option(
        "--activation", help="Activation dtype: bf16, or mxfp8 (quantization_config.moe.activation override)."
    ),
]
LoraOpt = Annotated[bool, typer.Option("--lora", help="LoRA enabled (only LoRA-capable kernels qualify).")]
BatchedOpt = Annotated[bool, typer.Option("--batched", help="Batched activation format (e.g. DeepEP low-latency).")]
All2allOpt = Annotated[
    str | None,
    typer.Option("--all2all", help="vLLM all2all backend (deepep_low_latency, allgather_reducescatter, ...), if any."),
]
EplbOpt = Annotated[bool, typer.Option("--eplb", help="Expert-parallel load balancing on.")]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        help="Runtime env override KEY=VALUE (e.g. VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 for vllm-0.20); wins over the same VLLM_* variable of the environment, which is read too. Repeatable.",
    ),
]
MarlinOpt = Annotated[str | None, typer.Option("--marlin-input-dtype", help="VLLM_MARLIN_INPUT_DTYPE (fp8).")]
HubRevOpt = Annotated[
    str | None, typer.Option("--revision", help="Hugging Face revision (branch, tag or commit) of a hub MODEL.")
]
CacheOpt = Annotated[
    str | None, typer.Option("--cache-dir", help="Hugging Face cache folder (default: HF_HUB_CACHE / HF_HOME).")
]
LayoutOpt = Annotated[str | None, typer.Option("--layout", help="Checkpoint layout: hf or original (default: detect).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
JobsOpt = Annotated[
    int | None,
    typer.Option("--jobs", "-j", min=1, help="Worker threads (default: the cores available to this process)."),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="Where the layouts run: cpu (default) or cuda / cuda:N (needs a GPU; the bytes are the same)."
    ),
]


def _make_plan(
    model,
    profile: list[str],
    backend,
    runtime,
    tp,
    ep,
    dp,
    rank,
    activation,
    lora,
    batched,
    all2all,
    eplb,
    env,
    marlin,
    revision,
    cache_dir,
    layout,
    max_shard_size,
):
    """One target (`select`): one --profile only."""
    from mxconvert.core.errors import InputError
    from mxconvert.pipeline.targets import plan

    if len(profile) != 1:
        raise InputError(
            f"--profile given {len(profile)} times ({', '.join(profile)}); select takes one (convert takes several)"
        )
    return plan(
        model,
        profile=profile,
        tp=[tp],
        backend=backend,
        runtime=runtime,
        ep=ep,
        dp=dp,
        rank=rank,
        activation=activation,
        lora=lora,
        batched=batched,
        all2all=all2all,
        eplb=eplb,
        env=env,
        marlin_input_dtype=marlin,
        revision=revision,
        cache_dir=cache_dir,
        layout=layout,
        max_shard_size=max_shard_size,
        warn=_warn_line,
    )[0]


# ---- commands --------------------------------------------------------------------------------------
@app.command()
@_guard
def profiles(as_json: JsonOpt = False) -> None:
    """List the built-in device profiles."""
    from mxconvert.target.profiles import BUILTIN_PROFILES

    if as_json:
        _print_json([p.to_json() for p in BUILTIN_PROFILES])
        return
    rows = []
    for p in BUILTIN_PROFILES:
        libs = [
            n
            for n, on in (
                ("flashinfer", p.has_flashinfer),
                ("triton_kernels", p.has_triton_kernels),
                ("aiter", p.rocm_use_aiter),
            )
            if on
        ]
        rows.append((p.name, p.description, p.summary(), ", ".join(p.aliases), ", ".join(libs)))
    table = _table("name", "device", "platform", "aliases", "libraries", title="device profiles", values=rows)
    for row in rows:
        table.add_row(*row)
    out_console.print(table)


@app.command()
@_guard
def backends(as_json: JsonOpt = False) -> None:
    """List every backend per model format and runtime revision, with the profiles that select it."""
    from mxconvert.selection.vocabulary import backend_rows

    rows = backend_rows()
    if as_json:
        _print_json(rows)
        return
    for fmt in ("mxfp4", "nvfp4"):
        for rev in dict.fromkeys(r["revision"] for r in rows if r["format"] == fmt):
            part = [r for r in rows if r["format"] == fmt and r["revision"] == rev]
            table = _table(
                "backend",
                "--moe-backend",
                "selected by default on",
                title=f"{fmt.upper()}, {rev} (vLLM {part[0]['vllm']})",
                values=[(r["backend"],) for r in part],
            )
            for r in part:
                table.add_row(r["backend"], r["moe_backend"] or "-", ", ".join(r["selected_on"]) or "-")
            out_console.print(table)
    out_console.print("--backend takes either column; any other runtime version is refused (see README).")


@app.command()
@_guard
def select(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: TpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    activation: ActOpt = "bf16",
    lora: LoraOpt = False,
    batched: BatchedOpt = False,
    all2all: All2allOpt = None,
    eplb: EplbOpt = False,
    env: EnvOpt = None,
    marlin_input_dtype: MarlinOpt = None,
    revision: HubRevOpt = None,
    cache_dir: CacheOpt = None,
    layout: LayoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the backend the runtime would choose on PROFILE, and why others were passed over (runs every check convert runs)."""
    planned = _make_plan(
        model,
        profile,
        backend,
        runtime,
        tp,
        ep,
        dp,
        None,
        activation,
        lora,
        batched,
        all2all,
        eplb,
        env,
        marlin_input_dtype,
        revision,
        cache_dir,
        layout,
        "4GB",
    )
    plan = planned.plan
    sel, prof, rev = plan.selection, plan.profile, plan.revision
    hp, ip = plan.geometry.hidden, plan.geometry.intermediate
    if as_json:
        _print_json(
            sel.to_json()
            | {
                "hidden_size_padded": hp,
                "intermediate_size_padded": ip,
                "warnings": planned.warnings,
                "environment": planned.environment,
                "profile": prof.name,
                "profile_base": prof.base,
            }
        )
        return
    out_console.print(
        f"profile [bold]{escape(prof.label)}[/] ({prof.summary()}), runtime {rev.name}, "
        f"requested backend {sel.requested}"
    )
    _render_environment(planned.environment)
    table = _table("backend", "kernel class", "result", values=[(c.backend.value,) for c in sel.considered])
    for c in sel.considered:
        table.add_row(c.backend.value, c.kernel_class or "-", "[green]chosen[/]" if c.chosen else escape(c.reason))
    out_console.print(table)
    out_console.print(
        f"[bold green]{sel.backend.value}[/] ({sel.kernel_class}), activation {sel.activation}, "
        f"padded hidden {hp}, intermediate {ip}"
    )


@app.command()
@_guard
def convert(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Artifact folder to write.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: Annotated[
        list[int] | None,
        typer.Option(
            "--tp",
            help="Tensor-parallel size; repeat (and repeat --profile) for several targets, "
            "written to OUT/<profile>-tp<N>/.",
        ),
    ] = None,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    rank: Annotated[int | None, typer.Option("--rank", help="Write only this rank (default: all).")] = None,
    activation: ActOpt = "bf16",
    lora: LoraOpt = False,
    batched: BatchedOpt = False,
    all2all: All2allOpt = None,
    eplb: EplbOpt = False,
    env: EnvOpt = None,
    marlin_input_dtype: MarlinOpt = None,
    revision: HubRevOpt = None,
    cache_dir: CacheOpt = None,
    layout: LayoutOpt = None,
    max_shard_size: Annotated[
        str, typer.Option("--max-shard-size", help="Largest output file, e.g. 4GB, 500MB.")
    ] = "4GB",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing artifact at OUT.")] = False,
    threads: JobsOpt = None,
    device: DeviceOpt = "cpu",
    as_json: JsonOpt = False,
) -> None:
    """Convert MODEL for a target and write a pre-laid-out artifact to OUT (several targets: OUT/<profile>-tp<N>/)."""
    from mxconvert.pipeline.targets import TargetResult
    from mxconvert.pipeline.targets import convert as convert_targets

    def progress(name: str | None, total: int):
        return _progress_bar(f"converting {name}" if name else "converting", total, as_json)

    def done(target: TargetResult) -> None:
        if target.status == "up_to_date" and (as_json or multi):  # a CI log shows why nothing happened
            err_console.print(
                f"up to date: {target.artifact} already holds this conversion; nothing written", highlight=False
            )

    multi = len(profile) * len(tp or [1]) > 1
    result = convert_targets(
        model,
        out,
        profile=profile,
        tp=tp or [1],
        backend=backend,
        runtime=runtime,
        ep=ep,
        dp=dp,
        rank=rank,
        activation=activation,
        lora=lora,
        batched=batched,
        all2all=all2all,
        eplb=eplb,
        env=env,
        marlin_input_dtype=marlin_input_dtype,
        revision=revision,
        cache_dir=cache_dir,
        layout=layout,
        max_shard_size=max_shard_size,
        dry_run=dry_run,
        force=force,
        jobs=threads,
        device=device,
        progress=progress,
        on_target=done,
        warn=_warn_line,
    )
    if result.multi:
        if as_json:
            _print_json(result.to_json())
        else:
            _render_targets([t.to_json() for t in result.targets])
        return
    (target,) = result.targets
    doc = target.to_json()
    if as_json:
        _print_json(doc)
        return
    _render_environment(target.planned.environment)
    _render_plan(target.planned.plan.summary(), out, dry_run=doc["status"] == "planned")
    if doc["status"] == "up_to_date":
        out_console.print(
            f"up to date: {out} already holds this conversion (fingerprint {doc['fingerprint']}); "
            "nothing written (--force rewrites it)"
        )
    elif doc["status"] == "written":
        out_console.print(
            f"wrote {out} ({doc['bytes'] / 1e6:.1f} MB in {doc['files']} files), fingerprint {doc['fingerprint']}"
        )


@contextlib.contextmanager
def _progress_bar(label: str, total: int, as_json: bool) -> Iterator[Callable[[str, int], None]]:
    from mxconvert.core.progress import Progress

    with Progress(label, total, json_mode=as_json) as bar:
        yield lambda desc, n: bar.advance(n, desc)


def _render_targets(results: list[dict]) -> None:
    rows = [
        (
            Path(r["artifact"]).name,
            r["target"]["backend"],
            r["status"].replace("_", " "),
            f"{r['bytes'] / 1e6:.1f}",
            (r["fingerprint"] or "-")[:19],
        )
        for r in results
    ]
    table = _table("target", "backend", "status", "MB", "fingerprint", title="targets", values=rows)
    for row in rows:
        table.add_row(*row)
    out_console.print(table)


def _render_environment(report: dict) -> None:
    for key, entry in sorted(report.items()):
        if "ignored" in entry:
            err_console.print(
                f"[yellow]note:[/] {key}={entry['value']} (environment) is ignored: {entry['ignored']}", highlight=False
            )
        else:
            out_console.print(f"{key}={entry['value']} (from {entry['from']})", highlight=False, markup=False)


@app.command()
@_guard
def inspect(
    paths: Annotated[list[str], typer.Argument(help="One checkpoint/artifact to describe, or two to diff.")],
    layer: Annotated[int | None, typer.Option("--layer", help="Only this layer.")] = None,
    tensor: Annotated[str | None, typer.Option("--tensor", help="Only this tensor (e.g. w13_weight_scale).")] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", help="Rank of an artifact to show (default: its first).")
    ] = None,
    revision: HubRevOpt = None,
    cache_dir: CacheOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw where each element of a small canonical tile lands in the kernel buffer (PNG; needs matplotlib: mxconvert[plot]). The move is the same for every layer and expert.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show layouts of a checkpoint or artifact; with two paths, diff them (exit 1 if they differ)."""
    from mxconvert.core.errors import InputError
    from mxconvert.pipeline.inspect import describe, diff

    if len(paths) not in (1, 2):
        raise InputError("inspect takes one path (describe) or two (diff)")
    descs = [describe(p, rank=rank, layer=layer, tensor=tensor, revision=revision, cache_dir=cache_dir) for p in paths]
    if plot is not None:
        from mxconvert.pipeline.plot import plot_layouts

        short = tensor.rsplit(".", 1)[-1] if tensor else None
        drawn = plot_layouts(descs, plot, short)
        err_console.print(f"drew {drawn['panels']} panel(s) into {drawn['plot']}", highlight=False)
    if len(descs) == 1:
        d = descs[0]
        if as_json:
            _print_json(d.to_json())
        else:
            _render_description(d)
        return
    from mxconvert.core.progress import Progress

    with Progress("comparing", 0, json_mode=as_json) as bar:
        result = diff(*descs, progress=bar)
    if as_json:
        _print_json(result)
    else:
        _render_diff(result)
    if not result["same"]:
        raise typer.Exit(1)


@app.command()
@_guard
def verify(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder.")],
    source: Annotated[
        str | None, typer.Option("--source", help="Source checkpoint (default: the one recorded in the manifest).")
    ] = None,
    sample_layers: Annotated[
        int, typer.Option("--sample-layers", help="Layers whose experts are dequantized and compared.")
    ] = 2,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Hub revision of the source (default: the commit recorded in the manifest)."),
    ] = None,
    cache_dir: CacheOpt = None,
    threads: JobsOpt = None,
    device: DeviceOpt = "cpu",
    as_json: JsonOpt = False,
) -> None:
    """Prove ARTIFACT matches its source (checksums, inverse layout bit for bit, padding, dequantized values, other tensors); exit 0 verified, 1 mismatch, 2 unusable input."""
    from mxconvert.core.progress import Progress
    from mxconvert.layouts.device import compute_for
    from mxconvert.pipeline.verify import verify_artifact

    compute = compute_for(device)  # an unusable --device fails before anything is read
    with Progress("verifying", 0, json_mode=as_json) as bar:
        report = verify_artifact(
            artifact,
            source,
            sample_layers=sample_layers,
            progress=bar,
            revision=revision,
            cache_dir=cache_dir,
            jobs=threads,
            device=compute,
        )
    if as_json:
        _print_json(report.to_json())
    else:
        status = "[bold green]verified[/]" if report.ok else f"[bold red]{len(report.problems)} problem(s)[/]"
        out_console.print(f"{status}: {report.artifact} against {report.source}")
        out_console.print(
            f"  {report.files_checked} files, {report.tensors_checked} expert tensors, "
            f"{report.passthrough_checked} other tensors checked; fingerprint {report.fingerprint}"
        )
        if report.max_dequant_diff:
            worst = max(report.max_dequant_diff.values())
            out_console.print(
                f"  largest dequantized difference over {len(report.max_dequant_diff)} sampled tensors: {worst}"
            )
        for problem in report.problems:
            out_console.print(f"  [red]{problem.kind}[/]: {escape(problem.message)}", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def _render_description(d) -> None:
    if d.kind == "artifact":
        t = d.target
        out_console.print(f"[bold]artifact[/] {d.path}  rank {d.summary['rank']} of ranks {d.summary['ranks']}")
        out_console.print(
            f"  target {t.get('profile')} ({t.get('platform')} {t.get('capability') or t.get('gfx') or ''}), "
            f"backend [bold]{t.get('backend')}[/] ({t.get('kernel_class')}), activation {t.get('activation')}, "
            f"runtime {t.get('runtime_revision')}, tp {t.get('tp_size')} ep {t.get('ep_size')}, "
            f"padded H {t.get('hidden_size_padded')} I {t.get('intermediate_size_padded')}"
        )
        out_console.print(f"  fingerprint {d.summary['fingerprint']}")
    else:
        m = d.summary["model"]
        out_console.print(
            f"[bold]checkpoint[/] {d.path}  ({d.summary['format']['quant_method']}, "
            f"{d.summary['format']['layout']} layout)"
        )
        top = f" (top-{m['experts_per_token']})" if "experts_per_token" in m else ""
        out_console.print(
            f"  {m['num_layers']} layers x {m['num_experts']} experts{top}, "
            f"hidden {m['hidden_size']}, intermediate {m['intermediate_size']}"
        )
    table = _table(
        "tensor",
        "dtype",
        "shape",
        "view (shape / strides)",
        "row order",
        "layout",
        title="expert tensors",
        values=[(f"L{v['layer']} {v['name']}",) for v in d.tensors.values()],
    )
    for v in d.tensors.values():
        layout = v.get("layout_class") or (", ".join(v["steps"]) if v["steps"] else "as stored")
        if v.get("swizzle") and v.get("swizzle") not in ("none", v.get("layout_class")):
            layout += f"; swizzle {v['swizzle']}"
        table.add_row(
            *(
                escape(str(c))
                for c in (
                    f"L{v['layer']} {v['name']}",
                    v["dtype"],
                    v["shape"],
                    f"{v['view_shape']} / {v['view_stride']}",
                    v["row_order"],
                    layout,
                )
            )
        )
    out_console.print(table)
    if d.kind == "artifact":
        files = _table("file", "bytes", "sha256", title="files", values=[(f["file"],) for f in d.files])
        for f in d.files:
            files.add_row(f["file"], str(f["size"]), f["sha256"][:16] + "...")
        out_console.print(files)


def _render_diff(result: dict) -> None:
    if result["same"]:
        out_console.print(f"[green]same[/]: {result['a']} and {result['b']}")
        return
    out_console.print(f"[bold red]different[/]: A = {result['a']}, B = {result['b']}")
    for t in result["target"]:
        out_console.print(f"  target {t['field']}: {t['a']} vs {t['b']}", highlight=False, markup=False)
    for key in result["only_in_a"]:
        out_console.print(f"  only in A: {key}", markup=False)
    for key in result["only_in_b"]:
        out_console.print(f"  only in B: {key}", markup=False)
    for d in result["descriptors"]:
        for c in d["changes"]:
            out_console.print(f"  {c['text']}", highlight=False, markup=False)
    for b in result["bytes"]:
        out_console.print(f"  {b['text']}", highlight=False, markup=False)
    for section, label in (("other_tensors", "other tensor"), ("copied_files", "copied"), ("source", "")):
        for item in result.get(section, []):
            out_console.print(f"  {label + ' ' if label else ''}{item['text']}", highlight=False, markup=False)


def _render_plan(summary: dict, out: Path, dry_run: bool) -> None:
    t = summary["target"]
    m = summary["model"]
    out_console.print(
        f"{'plan (dry run, nothing written)' if dry_run else 'converted'}: {m['num_layers']} layers x "
        f"{m['num_experts']} experts, H={m['hidden_size']} I={m['intermediate_size']}\n"
        f"target {t['profile']} ({t['platform']} {t['capability'] or t['gfx'] or ''}), "
        f"runtime {t['runtime_revision']}, "
        f"backend [bold]{t['backend']}[/] ({t['kernel_class']}), activation {t['activation']}, "
        f"tp {t['tp_size']} ep {t['ep_size']}, padded H {t['hidden_size_padded']} I {t['intermediate_size_padded']}"
    )
    names = [(f["file"],) for r in summary["ranks"] for f in r["files"]] + [
        (f["file"],) for f in summary["shared_files"]
    ]
    table = _table("file", "tensors", "MB", title=str(out), values=names)
    for r in summary["ranks"]:
        for f in r["files"]:
            table.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    for f in summary["shared_files"]:
        table.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    out_console.print(table)


def main() -> None:
    install_signal_handlers(unblock=True)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
