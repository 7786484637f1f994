"""Command line: parses arguments, calls the pipeline, renders results. No logic of its own.

Exit codes (README "Exit codes"): 0 success; 1 a check found a mismatch; 2 unusable input or a
refused request; 3 an internal error (a bug); 128 + N ended by signal N. Errors are printed as
one clear line on stderr, never as a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from mxconvert.cli.startup import FastApp, LazyConsole, escape
from mxconvert.core.errors import (
    Interrupted,
    MxconvertError,
    install_signal_handlers,
    note_outcome,
    raise_if_lost,
    reported,
    signals_handled,
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

    console = Console(soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):  # piped or in CI: tables do not wrap
        console = Console(soft_wrap=True, width=200)
    return console


def _make_err_console():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


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
            raise_if_lost()  # a signal whose Interrupted was swallowed still ends the run as one
            return result
        except MxconvertError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
            if kwargs.get("as_json"):  # a --json consumer gets the error as JSON too
                _print_json(_error_json(exc))
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
            err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}", highlight=False)
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


def _warn(ckpt) -> list[str]:
    """Print the checkpoint's warnings (e.g. NVFP4 gate/up global scales that differ) on stderr."""
    warnings = list(getattr(ckpt, "warnings", []))
    for text in warnings:
        err_console.print(f"[yellow]warning:[/] {text}", highlight=False)
    return warnings


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


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


def _parse_env_options(env: list[str] | None) -> dict[str, str]:
    from mxconvert.core.errors import InputError

    overrides: dict[str, str] = {}
    for item in env or []:
        if "=" not in item:
            raise InputError(f"--env {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    return overrides


@dataclass
class Planned:
    """Everything `select`, `convert --dry-run` and `convert` decide before writing, for one target."""

    ckpt: object
    plan: object
    warnings: list[str]
    environment: dict[str, dict]

    @property
    def folder_name(self) -> str:
        """Sub-folder of a multi-target OUT: `<profile>-tp<N>` (`-ep<N>` under expert parallelism)."""
        dep = self.plan.deployment
        return f"{self.plan.profile.name}-tp{dep.tp}" + (f"-ep{dep.ep}" if dep.ep > 1 else "")


def _make_plans(
    model,
    profiles: list[str],
    tps: list[int],
    backend,
    runtime,
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
) -> list[Planned]:
    """Open the model once and, for every profile x TP size, run every check `convert` runs before
    it writes (selection, the explicit backend, env, parallel sizes, rank range, layout of every
    tensor, shard sizes). Any refusal refuses the whole command before anything is written."""
    from mxconvert.core.errors import InputError, UnsupportedError
    from mxconvert.formats.registry import format_of, open_model
    from mxconvert.pipeline.plan import make_plan
    from mxconvert.selection import Deployment
    from mxconvert.selection.environment import resolve_environment
    from mxconvert.selection.vocabulary import resolve_backend_request
    from mxconvert.target.profiles import get_profile
    from mxconvert.target.revisions import check_all2all, get_revision

    if len(set(profiles)) != len(profiles) or len(set(tps)) != len(tps):
        raise InputError("a --profile or --tp value is given twice")
    profs = [get_profile(p) for p in profiles]
    ckpt = open_model(model, revision=revision, cache_dir=cache_dir, layout=layout)
    fmt = format_of(ckpt)
    rev = get_revision(runtime, fmt.name)
    act = activation.lower()
    if act not in ("bf16", "mxfp8"):
        raise InputError(f"--activation {activation!r}: expected bf16 or mxfp8")
    a2a = check_all2all(all2all, rev)
    shard_bytes = _parse_size(max_shard_size)
    for tp in tps:
        _check_dp(tp, ep, dp)
    warnings = _warn(ckpt)
    moe_name, must_be = resolve_backend_request(backend, fmt.name, rev.selection)
    planned = []
    for prof in profs:
        overrides, marlin_dtype, env_report = resolve_environment(
            fmt.name, rev.selection, prof, _parse_env_options(env), marlin
        )
        for tp in tps:
            dep = Deployment(
                tp=tp,
                ep=ep,
                dp=dp,
                all2all=a2a,
                eplb=eplb,
                batched=batched,
                lora=lora,
                activation=None if act == "bf16" else "mxfp8",
                env=overrides,
                marlin_input_dtype=marlin_dtype,
            )
            plan = make_plan(ckpt, prof, rev, dep, moe_name, rank=rank, max_shard_bytes=shard_bytes)
            got = plan.selection.backend.value
            if must_be is not None and got != must_be:
                via = f"--moe-backend {moe_name}" if moe_name != "auto" else "its automatic selection"
                passed = [
                    f"{c.backend.value}: {c.reason}"
                    for c in plan.selection.considered
                    if c.backend.value == must_be and not c.chosen
                ]
                raise UnsupportedError(
                    f"--backend {backend}: vLLM {rev.name} on {prof.label} reaches {must_be} "
                    f"only through {via}, which picks {got} here"
                    + (f" ({passed[0]})" if passed else f" ({must_be} is not tried there)")
                )
            planned.append(Planned(ckpt, plan, warnings, env_report))
    return planned


def _check_dp(tp: int, ep: int, dp: int) -> None:
    """`--dp` must divide the MoE group: vLLM 0.33.0 runs the MoE over TP x DP ranks (the EP group
    with expert parallelism, else one flattened TP group; docs/artifact.md), so `--tp` / `--ep`
    name that group's size and a DP deployment's is a multiple of DP. Anything else is a
    deployment vLLM cannot run, and its artifact would be labelled for one."""
    from mxconvert.core.errors import InputError

    flag, group = ("--ep", ep) if ep > 1 else ("--tp", tp)
    if dp > 1 and group % dp:
        raise InputError(
            f"--dp {dp} with {flag} {group}: vLLM runs the MoE over TP x DP ranks, so {flag} is that "
            f"group's size and must be a multiple of --dp; for `vllm serve --tensor-parallel-size T "
            f"--data-parallel-size {dp}` pass {flag} {dp}*T --dp {dp} (e.g. {flag} {dp * max(1, group)} "
            f"--dp {dp} for T={max(1, group)})"
        )


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
) -> Planned:
    """One target (`select`): one --profile only."""
    from mxconvert.core.errors import InputError

    if len(profile) != 1:
        raise InputError(
            f"--profile given {len(profile)} times ({', '.join(profile)}); select takes one (convert takes several)"
        )
    return _make_plans(
        model,
        profile,
        [tp],
        backend,
        runtime,
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
            help="Tensor-parallel size; repeat (and repeat --profile) for several targets, written to OUT/<profile>-tp<N>/.",
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
    from mxconvert.artifact.uptodate import up_to_date
    from mxconvert.core.progress import Progress
    from mxconvert.pipeline.convert import check_replaceable, execute

    compute: object = device  # the host ("cpu", the default) needs no check, nor torch (--dry-run)
    if device.strip().lower() != "cpu":
        from mxconvert.layouts.engine.device import compute_for

        compute = compute_for(device)  # an unusable --device fails before anything is read
    targets = _make_plans(
        model,
        profile,
        tp or [1],
        backend,
        runtime,
        ep,
        dp,
        rank,
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
        max_shard_size,
    )
    multi = len(targets) > 1
    jobs = []  # (planned, destination, manifest if already up to date)
    for planned in targets:  # every check first: nothing is written when any target is refused
        dest = out / planned.folder_name if multi else out
        current = None if force else up_to_date(dest, planned.plan)
        if current is None:
            check_replaceable(dest.resolve(), force)  # --dry-run exits as convert would
        jobs.append((planned, dest, current))
    results = []
    for planned, dest, current in jobs:
        summary = planned.plan.summary()
        if current is not None:
            status = "up_to_date"
        elif dry_run:
            status = "planned"
        else:
            # SIGINT/SIGTERM/SIGHUP (timeouts, preempted jobs) unwind, so the staging folder is removed
            with signals_handled():
                label = f"converting {planned.folder_name}" if multi else "converting"
                with Progress(label, summary["total_bytes"], json_mode=as_json) as bar:
                    current = execute(
                        planned.plan,
                        dest,
                        force=force,
                        jobs=threads,
                        device=compute,
                        progress=lambda desc, n: bar.advance(n, desc),
                    )
            status = "written"
        results.append(_convert_result(status, dest, summary, current, planned))
        if status == "up_to_date" and (as_json or multi):  # a CI log shows why nothing happened
            err_console.print(f"up to date: {dest} already holds this conversion; nothing written", highlight=False)
    if multi:
        if as_json:
            _print_json({"schema": MULTI_JSON_SCHEMA, "artifact_root": str(out), "targets": results})
        else:
            _render_targets(results)
        return
    (result,), (planned, _, _) = results, jobs[0]
    if as_json:
        _print_json(result)
        return
    _render_environment(planned.environment)
    _render_plan(planned.plan.summary(), out, dry_run=result["status"] == "planned")
    if result["status"] == "up_to_date":
        out_console.print(
            f"up to date: {out} already holds this conversion (fingerprint {result['fingerprint']}); "
            "nothing written (--force rewrites it)"
        )
    elif result["status"] == "written":
        out_console.print(
            f"wrote {out} ({result['bytes'] / 1e6:.1f} MB in {result['files']} files), "
            f"fingerprint {result['fingerprint']}"
        )


#: Version of the JSON `convert --json` prints for several targets: one convert document each.
MULTI_JSON_SCHEMA = "mxconvert.pipeline.convert-multi/1"


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


#: Version of the JSON that `convert --json` prints (dry run and real run alike); see README.
CONVERT_JSON_SCHEMA = "mxconvert.pipeline.convert/1"


def _convert_result(status: str, out: Path, summary: dict, manifest: dict | None, planned: Planned) -> dict:
    """The one `convert --json` document: the plan, plus what was written (or is already there)."""
    if manifest is not None:
        files = (
            [f for r in manifest["ranks"] for f in r["files"]]
            + manifest["shared"]["files"]
            + manifest.get("aux_files", [])
        )
        count, size, fp = len(files), sum(f["size"] for f in files), manifest["fingerprint"]
    else:
        planned_files = [f for r in summary["ranks"] for f in r["files"]] + summary["shared_files"]
        count, size, fp = len(planned_files), summary["total_bytes"], None
    return {
        "schema": CONVERT_JSON_SCHEMA,
        "status": status,
        "dry_run": status == "planned",
        "artifact": str(out),
        "fingerprint": fp,
        "files": count,
        "bytes": size,
        "environment": planned.environment,
        "warnings": planned.warnings,
        **summary,
    }


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
    from mxconvert.layouts.engine.device import compute_for
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
        f"target {t['profile']} ({t['platform']} {t['capability'] or t['gfx'] or ''}), runtime {t['runtime_revision']}, "
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


def _parse_size(text: str) -> int:
    from mxconvert.core.errors import InputError

    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = int(float(num) * units[unit])
    except (ValueError, KeyError, OverflowError):
        raise InputError(f"--max-shard-size {text!r}: expected a size like 4GB or 500MB") from None
    if value <= 0:
        raise InputError("--max-shard-size must be positive")
    return value


def main() -> None:
    install_signal_handlers(unblock=True)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
