"""`plan` and `convert` as a library: one or several targets (profiles x TP sizes) of one model.

The command line's `select`, `convert --dry-run` and `convert` are these functions plus argument
parsing and rendering (mxconvert/cli/commands.py and render.py): it builds the target options once,
as a `TargetRequest` (pipeline/plan.py), and calls `plan_targets` / `convert_targets`, which the
public `plan` / `convert` call with the request built from their keywords. Every check runs before
anything is written: a refused target refuses the whole call, and several targets never share or
leave their folders.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from mxconvert.artifact.manifest import MANIFEST_NAME
from mxconvert.core.errors import InputError, UnsupportedError, signals_handled
from mxconvert.pipeline import durable, output
from mxconvert.pipeline.plan import TargetRequest
from mxconvert.pipeline.results import ConvertResult, Planned, TargetResult
from mxconvert.pipeline.sizes import parse_size
from mxconvert.target.profiles import DeviceProfile


# ---- planning ----------------------------------------------------------------------------------------
def plan(
    model: str,
    *,
    profile: str | DeviceProfile | Sequence[str | DeviceProfile],
    runtime: str | None = None,
    backend: str = "auto",
    tp: int | Sequence[int] = 1,
    ep: int = 1,
    dp: int = 1,
    enable_expert_parallel: bool = False,
    rank: int | None = None,
    activation: str = "bf16",
    lora: bool = False,
    batched: bool = False,
    all2all: str | None = None,
    eplb: bool = False,
    env: Mapping[str, str] | Sequence[str] | None = None,
    marlin_input_dtype: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
    layout: str | None = None,
    max_shard_size: int | str = "4GB",
    warn: Callable[[str], None] | None = None,
) -> list[Planned]:
    """Plan the conversion of `model` for every profile x TP size, without writing anything.

    Opens the model once and, for each target, runs every check `convert` runs before it writes:
    the backend selection (as vLLM of `runtime` would select), an explicit `backend`, the
    environment, the parallel sizes, the rank range, the layout of every tensor and the shard
    sizes. Reads no weights beyond the safetensors headers.

    Args:
        model (`str`):
            A checkpoint folder or a Hugging Face repo id.
        profile (`str`, `DeviceProfile` or a sequence of them):
            Target devices: built-in names or aliases (`"h100"`, `"B200"`), `.json`/`.toml` profile
            files, or `DeviceProfile` objects.
        runtime (`str`, *optional*):
            `"auto"` (default: the installed vLLM's release, else `vllm-0.33`), a covered vLLM release
            `"vllm==X.Y.Z"` or a revision row's name (`"vllm-0.20"`); see `mxconvert runtimes`.
        backend (`str`, *optional*, defaults to `"auto"`):
            `"auto"`, a vLLM `--moe-backend` name or a backend name as mxconvert prints it.
        tp (`int` or a sequence of `int`, *optional*, defaults to 1):
            vLLM's tensor-parallel sizes, `--tensor-parallel-size` (one target per profile and size).
        dp (`int`, *optional*, defaults to 1):
            vLLM's `--data-parallel-size`. Without expert parallelism vLLM's MoE layers run TP x DP
            ranks as one TP group, so the artifact holds `tp * dp` ranks (selection/deployment.py).
        ep (`int`, *optional*, defaults to 1), enable_expert_parallel (`bool`, *optional*, defaults to `False`):
            Expert parallelism: vLLM's `--enable-expert-parallel` makes the EP group TP x DP ranks;
            `ep` is that group's size (alone, it gives TP = ep / dp). A contradiction is refused.
        rank (`int`, *optional*):
            Plan this rank only.
        activation, lora, batched, all2all, eplb, marlin_input_dtype:
            The runtime switches that change vLLM's backend choice (see `mxconvert convert --help`).
        env (`Mapping[str, str]` or a sequence of `"KEY=VALUE"`, *optional*):
            VLLM_* overrides; they win over the same variables of the environment, which are read too.
        revision (`str`, *optional*), cache_dir (`str`, *optional*), layout (`str`, *optional*):
            Hub revision, Hugging Face cache folder, checkpoint layout (`"hf"` or `"original"`).
        max_shard_size (`int` or `str`, *optional*, defaults to `"4GB"`):
            The largest output file, in bytes or as `"500MB"`, `"4GiB"`, ...
        warn (`Callable[[str], None]`, *optional*):
            Called with each warning about the checkpoint as soon as it is opened.

    Returns:
        `list[Planned]`: one per target, profiles outer and TP sizes inner; `.plan.summary()` is
        what `convert --dry-run --json` prints of it.

    Raises:
        `InputError`: an unusable model or option (the CLI's exit 2).
        `UnsupportedError`: a target vLLM cannot run this model on, or a backend it would not pick.

    Example:

    ```python
    from mxconvert.pipeline.targets import plan

    (target,) = plan("openai/gpt-oss-20b", profile="h100", tp=2)
    print(target.plan.selection.backend.value, target.plan.summary()["total_bytes"])
    ```
    """
    return plan_targets(model, TargetRequest.from_keywords(locals()), warn=warn)


def plan_targets(model: str, request: TargetRequest, *, warn: Callable[[str], None] | None = None) -> list[Planned]:
    """`plan` of a request built once (`select`, `convert --dry-run` and `convert` of the CLI)."""
    from mxconvert.formats.registry import format_of, open_model
    from mxconvert.pipeline.plan import LayoutRefused, make_plan, sglang_marlin_input
    from mxconvert.selection import Deployment
    from mxconvert.selection.environment import resolve_environment
    from mxconvert.selection.vocabulary import resolve_backend_request
    from mxconvert.target.profiles import get_profile
    from mxconvert.target.releases import resolve_runtime
    from mxconvert.target.revisions import check_all2all

    names = [p if isinstance(p, str) else p.name for p in request.profile]
    if len(set(names)) != len(names) or len(set(request.tp)) != len(request.tp):
        raise InputError("a --profile or --tp value is given twice")
    profs = [get_profile(p) if isinstance(p, str) else p for p in request.profile]
    ckpt = open_model(model, revision=request.revision, cache_dir=request.cache_dir, layout=request.layout)
    fmt = format_of(ckpt)
    resolved = resolve_runtime(request.runtime, fmt.name)
    rev = resolved.revision
    act = request.activation.lower()
    if act not in ("bf16", "mxfp8"):
        raise InputError(f"--activation {request.activation!r}: expected bf16 or mxfp8")
    a2a = check_all2all(request.all2all, rev)
    shard_size = request.max_shard_size
    shard_bytes = shard_size if isinstance(shard_size, int) else parse_size(shard_size)
    for size in request.tp:  # parallel sizes vLLM cannot run, or that contradict each other, fail first
        Deployment(tp=size, ep=request.ep, dp=request.dp, expert_parallel=request.enable_expert_parallel)
    warnings = list(getattr(ckpt, "warnings", []))
    for text in warnings:
        if warn is not None:
            warn(text)
    moe_name, must_be = resolve_backend_request(request.backend, fmt.name, rev.selection)
    explicit = request.env_overrides()
    planned = []
    for prof in profs:
        overrides, marlin_dtype, env_report = resolve_environment(
            fmt.name, rev.selection, prof, explicit, request.marlin_input_dtype
        )
        marlin_dtype = sglang_marlin_input(rev, request.marlin_input_dtype, explicit, marlin_dtype, env_report)
        for size in request.tp:
            dep = Deployment(
                tp=size,
                ep=request.ep,
                dp=request.dp,
                expert_parallel=request.enable_expert_parallel,
                all2all=a2a,
                eplb=request.eplb,
                batched=request.batched,
                lora=request.lora,
                activation=None if act == "bf16" else "mxfp8",
                env=overrides,
                marlin_input_dtype=marlin_dtype,
            )
            try:
                made = make_plan(ckpt, prof, rev, dep, moe_name, rank=request.rank, max_shard_bytes=shard_bytes)
            except LayoutRefused as exc:
                exc.environment = env_report
                raise
            made.runtime_release = resolved.release
            got = made.selection.backend.value
            if must_be is not None and got != must_be:
                via = f"--moe-backend {moe_name}" if moe_name != "auto" else "its automatic selection"
                passed = [
                    f"{c.backend.value}: {c.reason}"
                    for c in made.selection.considered
                    if c.backend.value == must_be and not c.chosen
                ]
                raise UnsupportedError(
                    f"--backend {request.backend}: vLLM {rev.name} on {prof.label} reaches {must_be} "
                    f"only through {via}, which picks {got} here"
                    + (f" ({passed[0]})" if passed else f" ({must_be} is not tried there)")
                )
            planned.append(Planned(ckpt, made, warnings, env_report))
    return planned


# ---- where each target goes ---------------------------------------------------------------------------
#: A target folder's profile part: a letter or digit, then letters, digits, '.', '_' or '-'; it can
#: be neither `.` nor `..`, nor hold a separator, so OUT/<name>-tp<N> is always one folder of OUT.
_SAFE_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def target_folders(targets: list[Planned]) -> list[str]:
    """The sub-folder of OUT for each of several targets, checked: a profile name that would not
    make one plain folder name is refused (never renamed silently), and so are two targets whose
    folders would be the same (after alias resolution, and ignoring case, as a case-insensitive
    filesystem would), before anything is written."""
    names = []
    for planned in targets:
        prof = planned.plan.profile
        if not _SAFE_PROFILE_NAME.fullmatch(prof.name):
            raise InputError(
                f"profile name {prof.name!r} cannot name a target folder: several targets are written to "
                "OUT/<profile>-tp<N>/, so a profile's name must be up to 100 letters, digits, '.', '_' or "
                "'-', starting with a letter or digit; set `name` in the profile file to such a name"
            )
        names.append(planned.folder_name)
    seen: dict[str, str] = {}
    for planned, name in zip(targets, names, strict=True):
        key = name.casefold()
        if key in seen:
            raise InputError(
                f"two targets would both be written to OUT/{name}/ ({seen[key]} and {planned.plan.profile.label}); "
                "give each profile its own name (a profile file's `name`), or convert them to separate -o folders"
            )
        seen[key] = planned.plan.profile.label
    return names


#: Top-level names of an artifact's own entries (docs/artifact.md): a copied checkpoint file of the
#: same name (any case: case-insensitive filesystems) would collide with them.
_ARTIFACT_ENTRY = re.compile(rf"{re.escape(MANIFEST_NAME)}|shared|rank-\d+", re.IGNORECASE)


def check_copied_names(planned: Planned) -> None:
    """Refuse a checkpoint whose copied files (config, tokenizer, ...) include one named like an
    entry of the artifact (`mxconvert.json`, `shared`, `rank-NNNNN`): it would overwrite or be
    overwritten by mxconvert's own, so it is refused up front rather than renamed."""
    for path in planned.ckpt.aux_files():
        if _ARTIFACT_ENTRY.fullmatch(path.name):
            raise InputError(
                f"{path}: the checkpoint folder holds a file named like an entry of the artifact "
                f"({MANIFEST_NAME}, shared/, rank-NNNNN/), which would be copied into it; move or rename it"
            )


# ---- converting --------------------------------------------------------------------------------------
#: Opens the progress display of one target as it is written: (its folder name, None for a single
#: target; total bytes) -> a context manager whose value is called with (what, bytes written).
ProgressFactory = Callable[[str | None, int], AbstractContextManager[Callable[[str, int], None]]]


def convert(
    model: str,
    out: str | Path,
    *,
    profile: str | DeviceProfile | Sequence[str | DeviceProfile],
    runtime: str | None = None,
    backend: str = "auto",
    tp: int | Sequence[int] = 1,
    ep: int = 1,
    dp: int = 1,
    enable_expert_parallel: bool = False,
    rank: int | None = None,
    activation: str = "bf16",
    lora: bool = False,
    batched: bool = False,
    all2all: str | None = None,
    eplb: bool = False,
    env: Mapping[str, str] | Sequence[str] | None = None,
    marlin_input_dtype: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
    layout: str | None = None,
    max_shard_size: int | str = "4GB",
    dry_run: bool = False,
    force: bool = False,
    jobs: int | None = None,
    device: str = "cpu",
    file_sha256: bool = False,
    write_mode: str = "auto",
    progress: ProgressFactory | None = None,
    on_target: Callable[[TargetResult], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Convert `model` for one or several targets and write each artifact (or only plan them).

    One target is written to `out`; several (profiles x TP sizes) to `out/<profile>-tp<N>/`. Every
    target is planned and every output checked before anything is written. A target whose folder
    already holds exactly this conversion is left as it is ("up_to_date"); any other existing
    folder is refused unless `force`, and even then replaced only when it is an mxconvert artifact
    holding nothing but its own files (pipeline/output.py). Each artifact is written to a staging
    folder under a lock on its folder and swapped in atomically, so it holds the previous artifact
    or the new one at every instant.

    Args:
        model (`str`):
            A checkpoint folder or a Hugging Face repo id.
        out (`str` or `os.PathLike`):
            The artifact folder (several targets: the folder of their folders).
        profile, runtime, backend, tp, ep, dp, enable_expert_parallel, rank, activation, lora, batched, all2all,
        eplb, env, marlin_input_dtype, revision, cache_dir, layout, max_shard_size, warn:
            The targets, as for `plan` (`profile` and `tp` may name several).
        dry_run (`bool`, *optional*, defaults to `False`):
            Plan and check only; write nothing.
        force (`bool`, *optional*, defaults to `False`):
            Replace an existing artifact (one of ours: see above).
        jobs (`int`, *optional*):
            Worker threads (default: the cores available).
        device (`str`, *optional*, defaults to `"cpu"`):
            Where the layouts run: `"cpu"` or `"cuda[:N]"`; the bytes are the same.
        file_sha256 (`bool`, *optional*, defaults to `False`):
            Also record each written file's whole-file sha256 (for `sha256sum -c`); every file
            always gets its tree digest (docs/artifact.md).
        write_mode (`str`, *optional*, defaults to `"auto"`):
            `"direct"` (past the page cache: O_DIRECT), `"buffered"` or `"auto"` (direct on fewer
            than 8 cores; docs/artifact.md, "Writing OUT"); the bytes are the same.
        progress (`ProgressFactory`, *optional*):
            Opens a progress display for each target written.
        on_target (`Callable[[TargetResult], None]`, *optional*):
            Called as each target is done (written, found up to date, or planned).

    Returns:
        `ConvertResult`: a `TargetResult` per target (status, folder, sealed manifest);
        `.to_json()` is what `convert --json` prints.

    Raises:
        `InputError`: an unusable model, option or output (nothing was written), or a write that
            failed (the message says what OUT holds).
        `UnsupportedError`: a target vLLM cannot run.
        `Interrupted`: SIGINT, SIGTERM or SIGHUP during the write (the staging folder is removed).

    Example:

    ```python
    from mxconvert.pipeline.targets import convert

    result = convert("openai/gpt-oss-20b", "out/gpt-oss-20b-h100", profile="h100", tp=2)
    print(result.targets[0].status, result.targets[0].manifest["fingerprint"])
    ```
    """
    return convert_targets(
        model,
        out,
        TargetRequest.from_keywords(locals()),
        dry_run=dry_run,
        force=force,
        jobs=jobs,
        device=device,
        file_sha256=file_sha256,
        write_mode=write_mode,
        progress=progress,
        on_target=on_target,
        warn=warn,
    )


def convert_targets(
    model: str,
    out: str | Path,
    request: TargetRequest,
    *,
    dry_run: bool = False,
    force: bool = False,
    jobs: int | None = None,
    device: str = "cpu",
    file_sha256: bool = False,
    write_mode: str = "auto",
    progress: ProgressFactory | None = None,
    on_target: Callable[[TargetResult], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> ConvertResult:
    """`convert` of a request built once (`convert` of the CLI); the other arguments as for `convert`."""
    from mxconvert.artifact.uptodate import up_to_date
    from mxconvert.pipeline import convert as writing  # looked up at call time (tests replace `execute`)

    durable.check_write_mode(write_mode)
    compute: Any = device  # the host ("cpu", the default) needs no check, nor torch (dry runs)
    if device.strip().lower() != "cpu":
        from mxconvert.layouts.device import compute_for

        compute = compute_for(device)  # an unusable device fails before anything is read
    out = Path(out)
    targets = plan_targets(model, request, warn=warn)
    multi = len(targets) > 1
    dests = [out / name for name in target_folders(targets)] if multi else [out]
    for planned in targets:
        check_copied_names(planned)

    def decide(planned: Planned, dest: Path) -> dict | None:
        """The manifest of `dest` when it already holds this conversion, else None once `dest` is
        checked writable and replaceable (the one check a dry run and a run share)."""
        current = None if force else up_to_date(dest, planned.plan, file_sha256=file_sha256)
        if current is None:
            output.check_output(dest, planned.ckpt.root, force)
        return current

    with contextlib.ExitStack() as held:
        for planned, dest in zip(targets, dests, strict=True):
            output.check_place(dest, planned.ckpt.root)  # nothing is created for a refused target
        if not dry_run:
            for dest in dests:
                output.make_parent(dest)
                held.enter_context(output.locked(dest))  # held to the end: no other run shares a folder
                output.recover_interrupted(dest)
        decided = [decide(planned, dest) for planned, dest in zip(targets, dests, strict=True)]
        results = []
        for planned, dest, current in zip(targets, dests, decided, strict=True):
            summary = planned.plan.summary()
            if current is not None:
                status = "up_to_date"
            elif dry_run:
                status = "planned"
            else:
                # SIGINT/SIGTERM/SIGHUP (timeouts, preempted jobs) unwind, so the staging folder is removed
                with signals_handled():
                    bar = progress(planned.folder_name if multi else None, summary["total_bytes"]) if progress else None
                    with bar if bar is not None else contextlib.nullcontext(None) as tick:
                        current = writing.execute(
                            planned.plan,
                            dest,
                            force=force,
                            jobs=jobs,
                            device=compute,
                            progress=tick,
                            file_sha256=file_sha256,
                            write_mode=write_mode,
                        )
                status = "written"
            result = TargetResult(status, dest, planned, current, summary)
            results.append(result)
            if on_target is not None:
                on_target(result)
    return ConvertResult(out, results)
