"""`verify`: prove an artifact matches its source checkpoint.

1. the manifest's fingerprint, and every file's size and sha256;
2. the source checkpoint's files against the hashes recorded at conversion;
3. every rank, layer and expert tensor: the recorded descriptor equals the one the layout gives,
   the inverse layout of the stored bytes (which also proves all padding is zero) equals, bit
   for bit, the canonical tensor rebuilt from the source;
4. the dequantized experts of sampled layers (largest difference; 0 for layouts that only move bytes);
5. every non-expert tensor is byte-identical to the source;
6. completeness: from the source and the recorded target it recomputes which ranks (with which
   experts and rows), expert tensors, pass-through tensors and source files the artifact must
   hold, and compares all of it with the manifest and the files' headers, so an edited and
   re-sealed manifest (a rank relabelled, a layer or a pass-through tensor removed) fails.

It reports every problem it finds (not only the first), each naming the file, tensor, expert and
the first differing index. It streams a chunk of experts at a time, like `convert`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from mxconvert.artifact.manifest import MANIFEST_NAME, fingerprint, read_manifest, target_format
from mxconvert.artifact.manifest_schema import refuse_ambiguous_parallel
from mxconvert.artifact.parts import stored_files
from mxconvert.core.digest import CHUNKED_KEY, file_digests
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.core.parallel import (
    REUSED_BYTES,
    chunk_bytes_for,
    chunk_workers,
    default_jobs,
    ordered_map,
    reused_buffers,
    torch_threads,
)
from mxconvert.formats.base import RankPlan
from mxconvert.formats.registry import Geometry, format_named
from mxconvert.layouts.device import HOST, AnyCompute, compute_for
from mxconvert.layouts.engine.plans import prepare_all
from mxconvert.pipeline.verify_completeness import check_completeness
from mxconvert.pipeline.verify_files import check_files, files_inside, open_source, source_hash_check, tree_only
from mxconvert.pipeline.verify_report import Problem, VerifyReport
from mxconvert.pipeline.verify_tensors import check_passthrough, dequant_check, tensor_checks
from mxconvert.pipeline.verify_tensors import first_difference as _first_difference  # noqa: F401 - tests, bench
from mxconvert.pipeline.verify_tensors import same_bytes as _same_bytes  # noqa: F401 - tests, bench
from mxconvert.storage.files import sha256_file
from mxconvert.storage.safetensors_io import ShardReader

__all__ = ["Problem", "VerifyReport", "verify", "verify_artifact", "work_bytes"]


def _hash_all(
    pool: ThreadPoolExecutor,
    paths,
    chunk_bytes: dict | None = None,
    pieces: ThreadPoolExecutor | None = None,
    tree_only: set | None = None,
) -> dict:
    """Start the digests of every existing file on `pool` (files in parallel; hashlib releases the
    GIL), largest first (the whole-file sha256 of the largest file is the longest single task):
    path -> future of (sha256, chunked digest or None). `chunk_bytes` maps the paths whose chunked
    digest is wanted to its piece size; their pieces hash on `pieces` (file_digests); those of
    `tree_only` get no whole-file sha256 (None)."""
    chunk_bytes = chunk_bytes or {}

    def digests(path: Path):
        if path not in chunk_bytes:
            return sha256_file(path), None
        try:
            return file_digests(path, chunk_bytes[path], pieces, whole=path not in (tree_only or ()))
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:  # gone since: its digest task reports it
            return 0

    existing = [path for path in dict.fromkeys(paths) if path.is_file()]
    existing.sort(key=size, reverse=True)
    return {path: pool.submit(digests, path) for path in existing}


def _tensor_bytes(info: dict) -> int:
    """Bytes of a tensor recorded in the manifest (dtype name and shape), for progress."""
    try:
        itemsize = dtype_named(info.get("dtype", "uint8")).itemsize
    except ValueError:
        itemsize = 1
    count = 1
    for dim in info.get("shape") or []:
        count *= int(dim)
    return count * itemsize


def work_bytes(manifest: dict) -> int:
    """What `verify_artifact` reads, in the units it reports progress in: the artifact's files
    (checksums), the source files (checksums) and every stored tensor (layout and bytes)."""
    files = (
        [f for r in manifest.get("ranks", []) for f in r.get("files", [])]
        + manifest.get("shared", {}).get("files", [])
        + manifest.get("aux_files", [])
    )
    tensors = [t for r in manifest.get("ranks", []) for t in r.get("tensors", {}).values()] + list(
        manifest.get("shared", {}).get("tensors", {}).values()
    )
    return (
        sum(int(f.get("size") or 0) for f in files)
        + sum(int(f.get("size") or 0) for f in manifest.get("source", {}).get("files", []))
        + sum(_tensor_bytes(t) for t in tensors)
    )


def verify(
    artifact: str | Path,
    *,
    source: str | None = None,
    sample_layers: int = 2,
    chunk_bytes: int | None = None,
    progress=None,
    revision: str | None = None,
    cache_dir: str | None = None,
    jobs: int | None = None,
    device: str | AnyCompute | None = None,
) -> VerifyReport:
    """Prove that the artifact at `artifact` holds exactly what its source and recorded target give.

    It checks the manifest's fingerprint and structure, every file's size and sha256, the source's
    files against the hashes recorded at conversion, what the artifact must hold (ranks, expert
    and pass-through tensors), every expert tensor bit for bit through its inverse layout, the
    pass-through tensors byte for byte, and the dequantized experts of sampled layers. Every
    problem found is reported (not only the first), in the same order whatever the thread count.

    Args:
        artifact (`str` or `os.PathLike`):
            The artifact folder (the one holding `mxconvert.json`).
        source (`str`, *optional*):
            The source checkpoint: a folder or a hub repo id. Defaults to the one the manifest
            records (a hub source at the recorded commit; a local one at the path where it was
            converted, whose files must still hash to the sealed values).
        sample_layers (`int`, *optional*, defaults to 2):
            MoE layers (spread over the model, first and last included) whose experts are
            dequantized and compared; 0 for none.
        chunk_bytes (`int`, *optional*):
            Bytes of experts compared at a time (default: from `jobs`).
        progress (*optional*):
            An object with `total` and `advance(nbytes, detail)` (`mxconvert.core.progress.Progress`).
        revision (`str`, *optional*):
            Hub revision of the source (default: the commit recorded in the manifest).
        cache_dir (`str`, *optional*):
            Hub cache folder.
        jobs (`int`, *optional*):
            Threads that hash files and check chunks (default: the cores available).
        device (`str`, *optional*):
            Where the inverse layouts run and chunks are compared: `"cpu"` (default) or `"cuda[:N]"`.

    Returns:
        `VerifyReport`: `ok` is True when no problem was found; `problems` lists each one (kind,
        message, file, tensor, rank, expert, index); `to_json()` is `mxconvert verify --json`.

    Raises:
        `InputError`: the artifact or its source is unusable (no or a malformed manifest, a file
            entry that leaves the folder, a source that cannot be opened, a device this machine
            lacks). Differences are problems in the report, not exceptions.

    Example:

    ```python
    from mxconvert.pipeline.verify import verify

    report = verify("gpt-oss-h100", source="openai/gpt-oss-20b", jobs=8)
    if not report.ok:
        for problem in report.problems:
            print(problem.kind, problem.message)
    ```
    """
    compute = compute_for(device)  # refuses a device this machine lacks before anything is read
    jobs = jobs or default_jobs()
    with (
        ThreadPoolExecutor(max(1, jobs), thread_name_prefix="mxconvert-sha256") as hash_pool,
        ThreadPoolExecutor(max(1, jobs), thread_name_prefix="mxconvert-sha256-piece") as piece_pool,
        ExitStack() as scope,
        reused_buffers(REUSED_BYTES),  # chunk buffers reused, not fresh pages per chunk (as convert's)
    ):
        return _verify(
            Path(artifact),
            source,
            sample_layers,
            chunk_bytes or chunk_bytes_for(jobs),
            jobs,
            hash_pool,
            progress,
            revision,
            cache_dir,
            compute,
            piece_pool,
            scope,
        )


def verify_artifact(
    artifact: str | Path,
    source: str | None = None,
    sample_layers: int = 2,
    chunk_bytes: int | None = None,
    progress=None,
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    jobs: int | None = None,
    device: str | AnyCompute | None = None,
) -> VerifyReport:
    """`verify` under its earlier name, `source`, `sample_layers`, `chunk_bytes` and `progress`
    also by position (the command line and existing callers use it)."""
    return verify(
        artifact,
        source=source,
        sample_layers=sample_layers,
        chunk_bytes=chunk_bytes,
        progress=progress,
        revision=revision,
        cache_dir=cache_dir,
        jobs=jobs,
        device=device,
    )


def _verify(
    root: Path,
    source: str | None,
    sample_layers: int,
    chunk_bytes: int,
    jobs: int,
    hash_pool: ThreadPoolExecutor,
    progress,
    revision: str | None,
    cache_dir: str | None,
    compute: AnyCompute = HOST,
    piece_pool: ThreadPoolExecutor | None = None,
    scope: ExitStack | None = None,
) -> VerifyReport:
    manifest = read_manifest(root)
    refuse_ambiguous_parallel(manifest, str(root / MANIFEST_NAME))
    report = VerifyReport(str(root), fingerprint=manifest.get("fingerprint"))
    if fingerprint(manifest) != manifest.get("fingerprint"):
        report.problems.append(
            Problem(
                "manifest",
                f"{MANIFEST_NAME}: fingerprint does not match the content (the manifest was edited)",
                MANIFEST_NAME,
            )
        )
    try:
        ranks = manifest["ranks"]
        shared = manifest["shared"]
        target = manifest["target"]
        files = [f for r in ranks for f in r["files"]] + shared["files"] + manifest.get("aux_files", [])
    except (KeyError, TypeError) as exc:
        raise InputError(f"{root / MANIFEST_NAME}: malformed ({exc})") from None
    if progress is not None:
        progress.total = work_bytes(manifest)
    pieces = {
        root / f["file"]: int(f[CHUNKED_KEY].get("chunk_bytes", 0))
        for f in files
        if isinstance(f.get(CHUNKED_KEY), dict) and int(f[CHUNKED_KEY].get("chunk_bytes", 0)) > 0
    }
    artifact_hashes = _hash_all(hash_pool, files_inside(root, files), pieces, piece_pool, tree_only(root, files))
    ckpt = open_source(manifest, source, revision=revision, cache_dir=cache_dir)
    source_hashes = _hash_all(hash_pool, ckpt.source_files())  # both sets hash while the rest runs
    # checksum results are compared at the end (the hashing overlaps the tensor checks); their
    # problems go back to these places in the report, so its order does not change
    deferred: list[tuple[int, Callable[[], list[Problem]]]] = []
    broken, compare_files = check_files(root, files, report, artifact_hashes, progress)
    deferred.append((len(report.problems), compare_files))

    report.source = str(ckpt.root)
    recorded = {f["file"]: f for f in manifest["source"].get("files", [])}
    for path in ckpt.source_files():
        rel = str(path.relative_to(ckpt.root))
        if progress is not None and rel in recorded:
            progress.advance(int(recorded[rel].get("size") or 0), "source checksums")
        if rel in recorded:
            differs = Problem("source", f"source file {rel} differs from the one converted", rel)
            if path.stat().st_size != recorded[rel]["size"]:
                report.problems.append(differs)
            else:
                deferred.append((len(report.problems), source_hash_check(source_hashes[path], recorded[rel], differs)))

    try:
        fmt = format_named(target_format(target))
        layout = fmt.layout_from_target(target)
        geometry = Geometry.from_target(target)
    except (KeyError, TypeError, ValueError, MxconvertError) as exc:
        raise InputError(f"{root / MANIFEST_NAME}: target cannot be resolved to a layout ({exc})") from None
    if fmt.name != ckpt.format_name:
        raise InputError(f"the source is a {ckpt.format_name} checkpoint, the artifact was made from {fmt.name}")
    if layout.describe() != target.get("layout"):
        report.problems.append(
            Problem(
                "layout",
                "the target's layout descriptor is not the one "
                f"{target['backend']} on {target.get('profile')} "
                f"({target['runtime_revision']}) gives",
            )
        )
    check_completeness(root, manifest, ckpt, fmt, layout, broken, report)
    # torch only where a check computes with values or runs on a device (mxconvert/bits.py)
    uses_torch = compute.uses_torch(fmt.loads_without_torch, layout, geometry.specs(1))
    (scope or ExitStack()).enter_context(torch_threads(jobs, uses_torch))

    sampled = _sample(ckpt.moe_layers, sample_layers)
    readers: dict[str, ShardReader] = {}
    if ranks:  # every layout plan at once, while the first chunks wait only for their own
        try:
            first = RankPlan(**{k: ranks[0]["plan"][k] for k in RankPlan.__dataclass_fields__})
            specs = geometry.specs(first.num_experts)
        except Exception:  # noqa: BLE001 - a malformed rank entry is reported by the checks below
            specs = None
        if specs is not None and _buffers_recorded(layout, specs, ranks[0]["tensors"]):
            planner = ThreadPoolExecutor(1, thread_name_prefix="mxconvert-plans")
            # a plan that cannot be built is reported per tensor by the check that needs it
            planner.submit(prepare_all, layout.tensors, specs, jobs)
            # joined when verify returns: one that stops early (broken files) leaves no thread behind
            (scope or ExitStack()).callback(planner.shutdown)
    for entry in ranks:
        plan = RankPlan(**{k: entry["plan"][k] for k in RankPlan.__dataclass_fields__})

        def checks(
            entry=entry, plan=plan
        ):  # one callable per chunk of experts, in order; each returns (problems, stop)
            for key, info in entry["tensors"].items():
                report.tensors_checked += 1
                if progress is not None:
                    progress.advance(_tensor_bytes(info), f"rank {entry['rank']} layer {info.get('layer')}")
                if broken.intersection(stored_files(info)):
                    continue
                yield from tensor_checks(
                    root, readers, ckpt, fmt, layout, plan, entry["rank"], key, info, geometry, chunk_bytes, compute
                )

        stopped: set[str] = set()
        checked: set[str] = set()  # tensors whose every chunk was compared
        flagged: set[str] = set()  # ... and those with any problem
        # the artifact's and the source's whole-file sha256 streams run beside the chunk checks
        for key, (problems, stop) in ordered_map(
            lambda job: (job[0], compute.run(job[1])), checks(), chunk_workers(jobs, 2)
        ):
            checked.add(key)
            if key in stopped:
                continue
            report.problems.extend(problems)
            if problems or stop:
                flagged.add(key)
            if stop:
                stopped.add(key)
        for layer in sorted(sampled):
            dequant_check(
                root,
                readers,
                ckpt,
                fmt,
                layout,
                plan,
                entry,
                layer,
                geometry,
                report,
                jobs,
                chunk_bytes,
                proven=checked - flagged,
                compute=compute,
            )

    def passthrough_checks():  # one job per tensor, in manifest order; each compares it in row chunks
        for key, info in shared["tensors"].items():
            report.passthrough_checked += 1
            if progress is not None:
                progress.advance(_tensor_bytes(info), "non-expert tensors")
            if info["file"] in broken:
                continue
            yield lambda key=key, info=info: check_passthrough(root, readers, ckpt, key, info["file"], chunk_bytes)

    for problems in ordered_map(lambda job: job(), passthrough_checks(), jobs):
        report.problems.extend(problems)
    for at, check in reversed(deferred):  # later places first, so the earlier places stay valid
        report.problems[at:at] = check()
    return report


def _buffers_recorded(layout, specs, tensors: dict) -> bool:
    """Whether the target's layout gives every moved tensor the buffer shape the manifest records
    for it in the first rank (shapes the manifest check bounds by the files' sizes,
    artifact/manifest_schema.py). Only then are all layout plans built ahead of the checks: a plan
    is as large as its tensor, and a sealed but forged target could name any size. Otherwise each
    check builds the plan it needs once its file's header has matched the layout."""
    recorded = {info["name"]: info["layout"]["buffer_shape"] for info in tensors.values()}
    for name in layout.tensors:
        try:
            _, shape = layout.buffer_spec(name, specs)
        except Exception:  # noqa: BLE001 - reported by the check of the tensor
            return False
        if recorded.get(name) != list(shape):
            return False
    return True


def _sample(layers: list[int], count: int) -> set[int]:
    """`count` layers spread over the MoE layers (first and last included)."""
    if count <= 0 or not layers:
        return set()
    if count >= len(layers):
        return set(layers)
    step = (len(layers) - 1) / max(1, count - 1)
    return {layers[round(i * step)] for i in range(count)}
