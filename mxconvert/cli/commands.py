"""The commands: each parses its arguments (typer annotations), calls the library (mxconvert.pipeline,
mxconvert.target) and hands the result to a renderer (mxconvert/cli/render.py) or to `print_json`.
The library is imported inside each command, so that `--help`, `--version`, `profiles` and `backends`
start without torch (tests/test_startup.py).

The functions are registered on the app, in this order, by mxconvert/cli/main.py, which wraps each
in `_guard` (errors to one line and an exit code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mxconvert.cli.console import err_console, print_json, warn_line
from mxconvert.cli.options import (
    TP_NAMES,
    ActOpt,
    All2allOpt,
    BackendOpt,
    BatchedOpt,
    CacheOpt,
    DeviceOpt,
    DpOpt,
    EnableEpOpt,
    EnvOpt,
    EplbOpt,
    EpOpt,
    FileSha256Opt,
    HubRevOpt,
    JobsOpt,
    JsonOpt,
    LayoutOpt,
    LoraOpt,
    MarlinOpt,
    ProfileOpt,
    RuntimeOpt,
    TpOpt,
    WriteModeOpt,
)

if TYPE_CHECKING:
    from mxconvert.pipeline.results import Planned


def profiles(as_json: JsonOpt = False) -> None:
    """List the built-in device profiles."""
    from mxconvert.target.profiles import BUILTIN_PROFILES

    if as_json:
        from mxconvert.cli.render import json_document

        print_json(json_document("profiles", {"profiles": [p.to_json() for p in BUILTIN_PROFILES]}))
        return
    from mxconvert.cli.render import render_profiles

    render_profiles(BUILTIN_PROFILES)


def backends(as_json: JsonOpt = False) -> None:
    """List every backend per model format and runtime revision: the profiles that select it, and
    whether convert writes it or select only reports it."""
    from mxconvert.selection.vocabulary import backend_rows
    from mxconvert.target.backends import LAID_OUT

    # LAID_OUT, not layouts/ itself: a quick command imports no layout code (tests/test_engine.py).
    rows = backend_rows(laid_out=lambda fmt: {backend.value for backend in LAID_OUT[fmt]})
    if as_json:
        from mxconvert.cli.render import json_document

        print_json(json_document("backends", {"backends": rows}))
        return
    from mxconvert.cli.render import render_backends

    render_backends(rows)


def runtimes(as_json: JsonOpt = False) -> None:
    """List the runtime revision rows, the vLLM releases each covers and what differs between them."""
    from mxconvert.selection.vocabulary import backend_rows
    from mxconvert.target.releases import runtimes_document

    backends: dict[str, dict[str, list[str]]] = {}
    for row in backend_rows():
        backends.setdefault(row["revision"], {}).setdefault(row["format"], []).append(row["backend"])
    document = runtimes_document(backends)
    if as_json:
        print_json(document)
        return
    from mxconvert.cli.render import render_runtimes

    render_runtimes(document)


def select(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: TpOpt = 1,
    ep: EpOpt = 1,
    enable_expert_parallel: EnableEpOpt = False,
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
    # One docstring of two adjacent literals: `mxconvert -h` keeps a docstring's line breaks.
    (
        """Print the backend the runtime would choose on PROFILE, and why others were passed over """
        """(runs every check convert runs)."""
    )
    from mxconvert.core.errors import InputError

    if len(profile) != 1:
        raise InputError(
            f"--profile given {len(profile)} times ({', '.join(profile)}); select takes one (convert takes several)"
        )
    from mxconvert.pipeline.plan import LayoutRefused, TargetRequest
    from mxconvert.pipeline.targets import plan_targets

    request = TargetRequest.from_keywords(locals())  # the options above but --json; rank and shard size default
    try:
        (planned,) = plan_targets(model, request, warn=warn_line)
    except LayoutRefused as refused:
        if not as_json:  # the report, then the refusal as the error (exit 2)
            from mxconvert.cli.render import render_refused_selection
            from mxconvert.target.releases import resolve_runtime

            resolved = resolve_runtime(request.runtime, refused.geometry.fmt)
            render_refused_selection(refused, resolved.revision, resolved.release)
        raise
    if as_json:
        from mxconvert.cli.render import json_document

        print_json(json_document("select", _selection_json(planned)))
        return
    from mxconvert.cli.render import render_selection

    render_selection(planned)


def _selection_json(planned: Planned) -> dict:
    """`select --json`: the selection report with the padded sizes, warnings, environment and profile."""
    from mxconvert.pipeline.plan import serve_command

    plan = planned.plan
    return plan.selection.to_json() | {
        "serve_command": serve_command(plan.target(), "ART"),
        "hidden_size_padded": plan.geometry.hidden,
        "intermediate_size_padded": plan.geometry.intermediate,
        "warnings": planned.warnings,
        "environment": planned.environment,
        "profile": plan.profile.name,
        "profile_base": plan.profile.base,
    }


def convert(
    model: Annotated[str, typer.Argument(help="Checkpoint folder or Hugging Face repo id.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Artifact folder to write.")],
    profile: ProfileOpt,
    backend: BackendOpt = "auto",
    runtime: RuntimeOpt = None,
    tp: Annotated[
        list[int] | None,
        typer.Option(
            *TP_NAMES,
            help="vLLM's tensor-parallel size; repeat (and repeat --profile) for several targets, "
            "written to OUT/<profile>-tp<N>/.",
        ),
    ] = None,
    ep: EpOpt = 1,
    enable_expert_parallel: EnableEpOpt = False,
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
        str,
        typer.Option(
            "--max-shard-size",
            help="Largest output file: bytes, or 5G / 500M / 4GB (powers of 1000) or 5GiB / 500MiB "
            "(powers of 1024), in any case.",
        ),
    ] = "4GB",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing artifact at OUT.")] = False,
    threads: JobsOpt = None,
    device: DeviceOpt = "cpu",
    file_sha256: FileSha256Opt = False,
    write_mode: WriteModeOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Convert MODEL for a target and write a pre-laid-out artifact to OUT (several targets: OUT/<profile>-tp<N>/)."""
    from mxconvert.pipeline.plan import TargetRequest
    from mxconvert.pipeline.results import TargetResult
    from mxconvert.pipeline.targets import convert_targets

    # every target option above, built once; no --tp is one target of TP 1
    request = TargetRequest.from_keywords(locals() | {"tp": tp or [1]})

    def progress(name: str | None, total: int):
        return _progress_bar(f"converting {name}" if name else "converting", total, as_json)

    def done(target: TargetResult) -> None:
        if target.status == "up_to_date" and (as_json or multi):  # a CI log shows why nothing happened
            err_console.print(
                f"up to date: {target.artifact} already holds this conversion; nothing written", highlight=False
            )

    multi = len(request.profile) * len(request.tp) > 1
    result = convert_targets(
        model,
        out,
        request,
        dry_run=dry_run,
        force=force,
        jobs=threads,
        device=device,
        file_sha256=file_sha256,
        write_mode=write_mode,
        progress=progress,
        on_target=done,
        warn=warn_line,
    )
    if as_json:
        print_json(result.to_json() if result.multi else result.targets[0].to_json())
        return
    from mxconvert.cli.render import render_environment, render_plan, render_targets, render_written

    if result.multi:
        render_targets([t.to_json() for t in result.targets])
        return
    (target,) = result.targets
    doc = target.to_json()
    render_environment(target.planned.environment)
    render_plan(target.planned.plan.summary(), out, dry_run=doc["status"] == "planned")
    render_written(doc, out)


@contextlib.contextmanager
def _progress_bar(label: str, total: int, as_json: bool) -> Iterator[Callable[[str, int], None]]:
    from mxconvert.core.progress import Progress

    with Progress(label, total, json_mode=as_json) as bar:
        yield lambda desc, n: bar.advance(n, desc)


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
            help="Also draw where each element of a small canonical tile lands in the kernel buffer "
            "(PNG; needs matplotlib: mxconvert[plot]). The move is the same for every layer and expert.",
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
        if as_json:
            from mxconvert.cli.render import json_document

            print_json(json_document("inspect", descs[0].to_json()))
        else:
            from mxconvert.cli.render import render_description

            render_description(descs[0])
        return
    from mxconvert.core.progress import Progress

    with Progress("comparing", 0, json_mode=as_json) as bar:
        result = diff(*descs, progress=bar)
    if as_json:
        from mxconvert.cli.render import json_document

        print_json(json_document("inspect-diff", result))
    else:
        from mxconvert.cli.render import render_diff

        render_diff(result)
    if not result["same"]:
        raise typer.Exit(1)


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
    # One docstring of two adjacent literals: `mxconvert -h` keeps a docstring's line breaks.
    (
        """Prove ARTIFACT matches its source (checksums, inverse layout bit for bit, padding, dequantized values, """
        """other tensors); exit 0 verified, 1 mismatch, 2 unusable input."""
    )
    from mxconvert.core.progress import Progress
    from mxconvert.layouts.device import compute_for
    from mxconvert.pipeline.verify import verify

    compute = compute_for(device)  # an unusable --device fails before anything is read
    with Progress("verifying", 0, json_mode=as_json) as bar:
        report = verify(
            artifact,
            source=source,
            sample_layers=sample_layers,
            progress=bar,
            revision=revision,
            cache_dir=cache_dir,
            jobs=threads,
            device=compute,
        )
    if as_json:
        from mxconvert.cli.render import json_document

        print_json(json_document("verify", report.to_json()))
    else:
        from mxconvert.cli.render import render_verify

        render_verify(report)
    if not report.ok:
        raise typer.Exit(1)
