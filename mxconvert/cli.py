"""Command line: parses arguments, calls the pipeline, renders results. No logic of its own.

Exit codes (README "Exit codes"): 0 success; 1 a check found a mismatch; 2 unusable input or a
refused request; 3 an internal error (a bug); 128 + N ended by signal N. Errors are printed as
one clear line on stderr, never as a traceback.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import Interrupted, MxconvertError, install_signal_handlers, note_outcome, signals_handled

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run.",
    pretty_exceptions_enable=False,
)
out_console = Console(soft_wrap=True)
if not out_console.is_terminal:  # piped or in CI: wide enough that tables do not wrap
    out_console = Console(soft_wrap=True, width=200)
err_console = Console(stderr=True, soft_wrap=True)


def _guard(fn):
    """Turn our errors (and anything unexpected) into a one-line message and an exit code."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        note_outcome("")
        try:
            return fn(*args, **kwargs)
        except MxconvertError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
            raise typer.Exit(exc.exit_code) from None
        except Interrupted as exc:
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


def _warn(ckpt) -> list[str]:
    """Print the checkpoint's warnings (e.g. NVFP4 gate/up global scales that differ) on stderr."""
    warnings = list(getattr(ckpt, "warnings", []))
    for text in warnings:
        err_console.print(f"[yellow]warning:[/] {text}", highlight=False)
    return warnings


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ---- shared options ------------------------------------------------------------------------------
ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="Target device: a built-in name (see `mxconvert profiles`) or a .json/.toml profile file.")]
RuntimeOpt = Annotated[Optional[str], typer.Option("--runtime", help="Runtime revision: vllm-0.33 (default, newest) or vllm-0.20.")]
BackendOpt = Annotated[str, typer.Option("--backend", "-b", help="auto, or a vLLM --moe-backend name (flashinfer_trtllm, triton, marlin, ...).")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel size (the MoE is then not TP-sliced).")]
DpOpt = Annotated[int, typer.Option("--dp", help="Data-parallel size (dp > 1 rules out monolithic kernels).")]
ActOpt = Annotated[str, typer.Option("--activation", help="Activation dtype: bf16, or mxfp8 (quantization_config.moe.activation override).")]
LoraOpt = Annotated[bool, typer.Option("--lora", help="LoRA enabled (only LoRA-capable kernels qualify).")]
BatchedOpt = Annotated[bool, typer.Option("--batched", help="Batched activation format (e.g. DeepEP low-latency).")]
All2allOpt = Annotated[Optional[str], typer.Option("--all2all", help="All2all backend name, if any.")]
EplbOpt = Annotated[bool, typer.Option("--eplb", help="Expert-parallel load balancing on.")]
EnvOpt = Annotated[Optional[list[str]], typer.Option("--env", help="Runtime env override KEY=VALUE (vllm-0.20 style, e.g. VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1). Repeatable.")]
MarlinOpt = Annotated[Optional[str], typer.Option("--marlin-input-dtype", help="VLLM_MARLIN_INPUT_DTYPE (fp8).")]
HubRevOpt = Annotated[Optional[str], typer.Option("--revision", help="Hugging Face revision (branch, tag or commit) of a hub MODEL.")]
CacheOpt = Annotated[Optional[str], typer.Option("--cache-dir", help="Hugging Face cache folder (default: HF_HUB_CACHE / HF_HOME).")]
LayoutOpt = Annotated[Optional[str], typer.Option("--layout", help="Checkpoint layout: hf or original (default: detect).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def _deployment(tp, ep, dp, activation, lora, batched, all2all, eplb, env, marlin):
    from .errors import InputError
    from .selection import Deployment

    overrides = {}
    for item in env or []:
        if "=" not in item:
            raise InputError(f"--env {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    act = activation.lower()
    if act not in ("bf16", "mxfp8"):
        raise InputError(f"--activation {activation!r}: expected bf16 or mxfp8")
    return Deployment(tp=tp, ep=ep, dp=dp, all2all=all2all, eplb=eplb, batched=batched, lora=lora,
                      activation=None if act == "bf16" else "mxfp8", env=overrides,
                      marlin_input_dtype=marlin)


# ---- commands --------------------------------------------------------------------------------------
@app.command()
@_guard
def profiles(as_json: JsonOpt = False) -> None:
    """List the built-in device profiles."""
    from .profiles import BUILTIN_PROFILES

    if as_json:
        _print_json([p.to_json() for p in BUILTIN_PROFILES])
        return
    table = Table(title="device profiles")
    for col in ("name", "device", "platform", "aliases", "libraries"):
        table.add_column(col)
    for p in BUILTIN_PROFILES:
        libs = [n for n, on in (("flashinfer", p.has_flashinfer), ("triton_kernels", p.has_triton_kernels),
                                ("aiter", p.rocm_use_aiter)) if on]
        table.add_row(p.name, p.description, p.summary(), ", ".join(p.aliases), ", ".join(libs))
    out_console.print(table)


@app.command()
@_guard
def select(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: TpOpt = 1, ep: EpOpt = 1, dp: DpOpt = 1,
    activation: ActOpt = "bf16", lora: LoraOpt = False, batched: BatchedOpt = False,
    all2all: All2allOpt = None, eplb: EplbOpt = False, env: EnvOpt = None, marlin_input_dtype: MarlinOpt = None,
    revision: HubRevOpt = None, cache_dir: CacheOpt = None, layout: LayoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the backend the runtime would choose on PROFILE, and why others were passed over."""
    from .formats import format_of, open_model
    from .profiles import get_profile
    from .revisions import get_revision

    ckpt = open_model(model, revision=revision, cache_dir=cache_dir, layout=layout)
    fmt = format_of(ckpt)
    prof, rev = get_profile(profile), get_revision(runtime, fmt.name)
    dep = _deployment(tp, ep, dp, activation, lora, batched, all2all, eplb, env, marlin_input_dtype)
    warnings = _warn(ckpt)
    sel = fmt.select(ckpt, prof, rev, dep, backend)
    geometry = fmt.geometry(ckpt, sel, rev, prof, dep)
    hp, ip = geometry.hidden, geometry.intermediate
    if as_json:
        _print_json(sel.to_json() | {"hidden_size_padded": hp, "intermediate_size_padded": ip,
                                     "warnings": warnings})
        return
    out_console.print(f"profile [bold]{prof.name}[/] ({prof.summary()}), runtime {rev.name}, "
                      f"requested backend {sel.requested}")
    table = Table(show_header=True)
    table.add_column("backend")
    table.add_column("kernel class")
    table.add_column("result")
    for c in sel.considered:
        table.add_row(c.backend.value, c.kernel_class or "-", "[green]chosen[/]" if c.chosen else escape(c.reason))
    out_console.print(table)
    out_console.print(f"[bold green]{sel.backend.value}[/] ({sel.kernel_class}), activation {sel.activation}, "
                      f"padded hidden {hp}, intermediate {ip}")


@app.command()
@_guard
def convert(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Artifact folder to write.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: TpOpt = 1, ep: EpOpt = 1, dp: DpOpt = 1,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Write only this rank (default: all).")] = None,
    activation: ActOpt = "bf16", lora: LoraOpt = False, batched: BatchedOpt = False,
    all2all: All2allOpt = None, eplb: EplbOpt = False, env: EnvOpt = None, marlin_input_dtype: MarlinOpt = None,
    revision: HubRevOpt = None, cache_dir: CacheOpt = None, layout: LayoutOpt = None,
    max_shard_size: Annotated[str, typer.Option("--max-shard-size", help="Largest output file, e.g. 4GB, 500MB.")] = "4GB",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing artifact at OUT.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Convert MODEL for a target and write a pre-laid-out artifact to OUT."""
    from .convert import execute, make_plan
    from .formats import format_of, open_model
    from .profiles import get_profile
    from .revisions import get_revision

    ckpt = open_model(model, revision=revision, cache_dir=cache_dir, layout=layout)
    prof, rev = get_profile(profile), get_revision(runtime, format_of(ckpt).name)
    warnings = _warn(ckpt)
    dep = _deployment(tp, ep, dp, activation, lora, batched, all2all, eplb, env, marlin_input_dtype)
    plan = make_plan(ckpt, prof, rev, dep, backend, rank=rank, max_shard_bytes=_parse_size(max_shard_size))
    summary = plan.summary()
    if dry_run:
        if as_json:
            _print_json({"dry_run": True, **summary})
        else:
            _render_plan(summary, out, dry_run=True)
        return
    from .convert import check_replaceable
    check_replaceable(out.resolve(), force)
    total = sum(len(f.tensors) for fs in plan.rank_files.values() for f in fs) + sum(
        len(f.tensors) for f in plan.shared_files)
    # SIGINT/SIGTERM/SIGHUP (timeouts, preempted jobs) unwind, so the staging folder is removed
    with signals_handled():
        if out_console.is_terminal and not as_json:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=err_console, transient=True) as bar:
                task = bar.add_task("converting", total=total)
                manifest = execute(plan, out, force=force,
                                   progress=lambda desc, n: bar.update(task, advance=n, description=desc))
        else:
            manifest = execute(plan, out, force=force)
    files = [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]
    result = {"artifact": str(out), "fingerprint": manifest["fingerprint"], "target": manifest["target"],
              "ranks": [r["rank"] for r in manifest["ranks"]], "files": len(files),
              "bytes": sum(f["size"] for f in files), "warnings": warnings}
    if as_json:
        _print_json(result)
    else:
        _render_plan(summary, out, dry_run=False)
        out_console.print(f"wrote {out} ({result['bytes'] / 1e6:.1f} MB in {result['files']} files), "
                          f"fingerprint {manifest['fingerprint']}")


@app.command()
@_guard
def inspect(
    paths: Annotated[list[str], typer.Argument(help="One checkpoint/artifact to describe, or two to diff.")],
    layer: Annotated[Optional[int], typer.Option("--layer", help="Only this layer.")] = None,
    tensor: Annotated[Optional[str], typer.Option("--tensor", help="Only this tensor (e.g. w13_weight_scale).")] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Rank of an artifact to show (default: its first).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show layouts of a checkpoint or artifact; with two paths, diff them (exit 1 if they differ)."""
    from .errors import InputError
    from .inspect import describe, diff

    if len(paths) not in (1, 2):
        raise InputError("inspect takes one path (describe) or two (diff)")
    descs = [describe(p, rank=rank, layer=layer, tensor=tensor) for p in paths]
    if len(descs) == 1:
        d = descs[0]
        if as_json:
            _print_json(d.to_json())
        else:
            _render_description(d)
        return
    result = diff(*descs)
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
    source: Annotated[Optional[str], typer.Option("--source", help="Source checkpoint (default: the one recorded in the manifest).")] = None,
    sample_layers: Annotated[int, typer.Option("--sample-layers", help="Layers whose experts are dequantized and compared.")] = 2,
    as_json: JsonOpt = False,
) -> None:
    """Prove ARTIFACT matches its source (checksums, inverse layout bit for bit, padding, dequantized values, other tensors); exit 0 verified, 1 mismatch, 2 unusable input."""
    from .verify import verify_artifact

    report = verify_artifact(artifact, source, sample_layers=sample_layers)
    if as_json:
        _print_json(report.to_json())
    else:
        status = "[bold green]verified[/]" if report.ok else f"[bold red]{len(report.problems)} problem(s)[/]"
        out_console.print(f"{status}: {report.artifact} against {report.source}")
        out_console.print(f"  {report.files_checked} files, {report.tensors_checked} expert tensors, "
                          f"{report.passthrough_checked} other tensors checked; fingerprint {report.fingerprint}")
        if report.max_dequant_diff:
            worst = max(report.max_dequant_diff.values())
            out_console.print(f"  largest dequantized difference over {len(report.max_dequant_diff)} sampled "
                              f"tensors: {worst}")
        for problem in report.problems:
            out_console.print(f"  [red]{problem.kind}[/]: {escape(problem.message)}", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def _render_description(d) -> None:
    if d.kind == "artifact":
        t = d.target
        out_console.print(f"[bold]artifact[/] {d.path}  rank {d.summary['rank']} of ranks {d.summary['ranks']}")
        out_console.print(f"  target {t.get('profile')} ({t.get('platform')} {t.get('capability') or t.get('gfx') or ''}), "
                          f"backend [bold]{t.get('backend')}[/] ({t.get('kernel_class')}), activation {t.get('activation')}, "
                          f"runtime {t.get('runtime_revision')}, tp {t.get('tp_size')} ep {t.get('ep_size')}, "
                          f"padded H {t.get('hidden_size_padded')} I {t.get('intermediate_size_padded')}")
        out_console.print(f"  fingerprint {d.summary['fingerprint']}")
    else:
        m = d.summary["model"]
        out_console.print(f"[bold]checkpoint[/] {d.path}  ({d.summary['format']['quant_method']}, "
                          f"{d.summary['format']['layout']} layout)")
        top = f" (top-{m['experts_per_token']})" if "experts_per_token" in m else ""
        out_console.print(f"  {m['num_layers']} layers x {m['num_experts']} experts{top}, "
                          f"hidden {m['hidden_size']}, intermediate {m['intermediate_size']}")
    table = Table(title="expert tensors")
    for col in ("tensor", "dtype", "shape", "view (shape / strides)", "row order", "layout"):
        table.add_column(col)
    for key, v in d.tensors.items():
        layout = v.get("layout_class") or (", ".join(v["steps"]) if v["steps"] else "as stored")
        if v.get("swizzle") and v.get("swizzle") not in ("none", v.get("layout_class")):
            layout += f"; swizzle {v['swizzle']}"
        table.add_row(*(escape(str(c)) for c in (f"L{v['layer']} {v['name']}", v["dtype"], v["shape"],
                                                 f"{v['view_shape']} / {v['view_stride']}", v["row_order"], layout)))
    out_console.print(table)
    if d.kind == "artifact":
        files = Table(title="files")
        for col in ("file", "bytes", "sha256"):
            files.add_column(col)
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
    table = Table(title=str(out))
    table.add_column("file")
    table.add_column("tensors", justify="right")
    table.add_column("MB", justify="right")
    for r in summary["ranks"]:
        for f in r["files"]:
            table.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    for f in summary["shared_files"]:
        table.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    out_console.print(table)


def _parse_size(text: str) -> int:
    from .errors import InputError

    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
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
