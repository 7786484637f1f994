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

import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.artifact.loader import check_rank_entry, check_rank_metadata
from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file, fingerprint, read_manifest
from mxconvert.artifact.parts import StoredRows, stored_files, stored_keys, stored_parts
from mxconvert.core.bits import first_index, host_bits, is_host_bits, to_torch
from mxconvert.core.digest import CHUNKED_KEY, file_digests
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.core.parallel import chunk_bytes_for, chunk_workers, default_jobs, ordered_map, torch_threads
from mxconvert.formats.base import RankPlan
from mxconvert.formats.registry import Geometry, format_named, open_model
from mxconvert.layouts import InverseError
from mxconvert.layouts.base import PaddingError, prepare_all
from mxconvert.layouts.engine.device import HOST, AnyCompute, compute_for
from mxconvert.pipeline.plan import expert_key
from mxconvert.storage.files import sha256_file
from mxconvert.storage.safetensors_io import ShardReader

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # the host path compares numpy arrays of bits (mxconvert/bits.py); torch where a device runs
    from mxconvert.core.lazy_import import np, torch


@dataclass
class Problem:
    kind: str  # manifest | file | source | layout | tensor | padding | passthrough
    message: str
    file: str | None = None
    tensor: str | None = None
    rank: int | None = None
    expert: int | None = None
    index: list[int] | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class VerifyReport:
    artifact: str
    source: str | None = None
    fingerprint: str | None = None
    files_checked: int = 0
    tensors_checked: int = 0
    passthrough_checked: int = 0
    max_dequant_diff: dict[str, float] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "artifact": self.artifact,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "files_checked": self.files_checked,
            "tensors_checked": self.tensors_checked,
            "passthrough_checked": self.passthrough_checked,
            "max_dequant_diff": self.max_dequant_diff,
            "problems": [p.to_json() for p in self.problems],
        }


def _check_files(root: Path, entries: list[dict], report: VerifyReport, hashes: dict, progress=None):
    """Size and sha256 of each file. Returns the files that are unreadable as safetensors (known
    at once) and the checksum comparisons as a deferred check: `hashes` maps each path to the
    future of its digests (computed in parallel, see `_hash_all`), and waiting for them here would
    keep the workers idle while one thread hashes a multi-GB file; `_verify` runs the deferred
    check after the tensor checks and puts its problems where they would have been."""
    broken = set()
    to_compare = []
    for entry in entries:
        report.files_checked += 1
        if progress is not None:
            progress.advance(int(entry.get("size") or 0), "checksums")
        path = root / entry["file"]
        if not (path.exists() or path.is_symlink()):
            report.problems.append(Problem("file", f"{entry['file']}: missing", entry["file"]))
            broken.add(entry["file"])
            continue
        try:
            path = artifact_file(root, entry["file"])
        except MxconvertError as exc:
            report.problems.append(Problem("file", str(exc), entry["file"]))
            broken.add(entry["file"])
            continue
        to_compare.append((entry, path, path.stat().st_size))

    def compare() -> list[Problem]:
        problems = []
        for entry, path, size in to_compare:
            if size != entry["size"]:
                problems.append(
                    Problem("file", f"{entry['file']}: size {size} bytes, manifest says {entry['size']}", entry["file"])
                )
            elif hashes[path].result()[0] != entry["sha256"]:
                problems.append(Problem("file", f"{entry['file']}: sha256 differs from the manifest", entry["file"]))
            elif CHUNKED_KEY in entry and hashes[path].result()[1] != entry[CHUNKED_KEY]:
                problems.append(
                    Problem(
                        "file",
                        f"{entry['file']}: chunked sha256 differs from the manifest (load_artifact would refuse it)",
                        entry["file"],
                    )
                )
        return problems

    return broken, compare


def _inside(root: Path, files: list[dict]) -> list[Path]:
    """The manifest's files that `_check_files` will accept (inside the artifact, regular): only
    those are read for their checksums. An edited manifest naming a file outside the folder is
    reported by `_check_files` and never read."""
    paths = []
    for entry in files:
        try:
            paths.append(artifact_file(root, entry["file"]))
        except (MxconvertError, KeyError, TypeError):
            continue
    return paths


def _hash_all(
    pool: ThreadPoolExecutor, paths, chunk_bytes: dict | None = None, pieces: ThreadPoolExecutor | None = None
) -> dict:
    """Start the digests of every existing file on `pool` (files in parallel; hashlib releases the
    GIL), largest first (the whole-file sha256 of the largest file is the longest single task):
    path -> future of (sha256, chunked digest or None). `chunk_bytes` maps the paths whose chunked
    digest is wanted to its piece size; their pieces hash on `pieces` (file_digests)."""
    chunk_bytes = chunk_bytes or {}

    def digests(path: Path):
        if path not in chunk_bytes:
            return sha256_file(path), None
        try:
            return file_digests(path, chunk_bytes[path], pieces)
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


def _open_source(manifest: dict, source: str | None, *, revision: str | None = None, cache_dir: str | None = None):
    """The source checkpoint to compare with: `source` (folder or hub repo id), else the one the
    manifest records. A hub source defaults to the commit recorded in the manifest (a hub id given
    as `source` too, when it is the recorded repo), so an artifact made from `--revision v2` is
    checked against v2, not against today's `main`."""
    layout = manifest["source"].get("layout")
    ident = manifest["source"].get("identity") or {}
    if not isinstance(ident, dict):
        raise InputError("the manifest's source identity is malformed; pass --source")
    recorded_commit = ident.get("revision") if ident.get("kind") == "hub" else None
    if source is None:
        provenance = manifest.get("provenance") or {}
        source = provenance.get("source_path") if isinstance(provenance, dict) else None
        if not isinstance(source, (str, type(None))):
            raise InputError("the manifest's provenance is malformed; pass --source")
        if ident.get("kind") == "hub" and not (source and Path(source).is_dir() and revision is None):
            return open_model(
                ident["repo_id"], revision=revision or recorded_commit, cache_dir=cache_dir, layout=layout
            )
        if not source or not Path(source).is_dir():
            raise InputError(
                f"the source checkpoint recorded in the manifest ({source}) is not available; pass --source"
            )
        return open_model(source, layout=layout)
    if Path(source).expanduser().exists():
        if revision is not None:
            raise InputError(f"--revision {revision}: --source {source} is a local folder, which has no revisions")
        return open_model(source, layout=layout)
    if revision is None and ident.get("repo_id") == source:
        revision = recorded_commit
    return open_model(source, revision=revision, cache_dir=cache_dir, layout=layout)


def _first_difference(actual: Any, expected: Any) -> list[int]:
    """Index of the first element whose bits differ (host bit arrays, or tensors on a device)."""
    actual, expected = host_bits(actual), host_bits(expected)
    a, b = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    if a.ndim == 0:
        return []
    diff = first_index(a.view(np.uint8) != b.view(np.uint8))
    diff[-1] //= actual.itemsize  # back from bytes to element index
    return diff


def _describe_index(name: str, idx: list[int], plan: RankPlan, expert0: int) -> tuple[int, str]:
    expert = expert0 + idx[0]
    where = f"expert {expert}"
    if len(idx) >= 2:
        row = idx[1]
        if name.startswith("w13"):
            half = "gate" if row % 2 == 0 else "up"
            where += f" row {row} ({half}_{plan.i_start + row // 2})"
        else:
            where += f" row {row}"
    if len(idx) >= 3:
        where += f" column {idx[2]}"
    return expert, where


def _in_padding(name: str, idx: list[int], hidden: int, inter: int) -> bool:
    """Whether a canonical index lies in the zero padding appended by the loader (mxconvert/canonical.py)."""
    rows, cols = {
        "w13_weight": (2 * inter, hidden // 2),
        "w13_weight_scale": (2 * inter, hidden // 32),
        "w13_bias": (2 * inter, None),
        "w2_weight": (hidden, inter // 2),
        "w2_weight_scale": (hidden, inter // 32),
        "w2_bias": (hidden, None),
    }[name]
    return idx[0] >= rows or (cols is not None and len(idx) > 1 and idx[1] >= cols)


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
    """Verify the artifact at `artifact` against its source. `jobs` threads (default: the cores
    available) hash files and check chunks of experts in parallel; problems are reported in the
    same order whatever the thread count.
    `progress`: an object with `total` and `advance(nbytes, detail)` (mxconvert.progress.Progress).
    `revision`/`cache_dir`: for a hub source (default: the commit recorded in the manifest).
    `device`: where the inverse layouts run and the chunks are compared ("cpu", the default, or
    "cuda[:N]"; layouts/device.py)."""
    compute = compute_for(device)  # refuses a device this machine lacks before anything is read
    jobs = jobs or default_jobs()
    with (
        ThreadPoolExecutor(max(1, jobs), thread_name_prefix="mxconvert-sha256") as hash_pool,
        ThreadPoolExecutor(max(1, jobs), thread_name_prefix="mxconvert-sha256-piece") as piece_pool,
        ExitStack() as scope,
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
    artifact_hashes = _hash_all(hash_pool, _inside(root, files), pieces, piece_pool)
    ckpt = _open_source(manifest, source, revision=revision, cache_dir=cache_dir)
    source_hashes = _hash_all(hash_pool, ckpt.source_files())  # both sets hash while the rest runs
    # checksum results are compared at the end (the hashing overlaps the tensor checks); their
    # problems go back to these places in the report, so its order does not change
    deferred: list[tuple[int, Callable[[], list[Problem]]]] = []
    broken, compare_files = _check_files(root, files, report, artifact_hashes, progress)
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
                deferred.append((len(report.problems), _source_hash_check(source_hashes[path], recorded[rel], differs)))

    try:
        fmt = format_named(target.get("format", "mxfp4"))
        layout = fmt.layout_from_target(target)
        geometry = Geometry.from_target(target)
    except (KeyError, TypeError, ValueError, MxconvertError) as exc:
        raise InputError(f"{root / MANIFEST_NAME}: target cannot be resolved to a layout ({exc})") from None
    if fmt.name != getattr(ckpt, "format_name", "mxfp4"):
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
    _check_completeness(root, manifest, ckpt, fmt, layout, broken, report)
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
        if specs is not None:
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
                yield from _tensor_checks(
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
            _dequant_check(
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
            yield lambda key=key, info=info: _check_passthrough(root, readers, ckpt, key, info["file"], chunk_bytes)

    for problems in ordered_map(lambda job: job(), passthrough_checks(), jobs):
        report.problems.extend(problems)
    for at, check in reversed(deferred):  # later places first, so the earlier places stay valid
        report.problems[at:at] = check()
    return report


def _check_passthrough(root: Path, readers: dict, ckpt, key: str, rel: str, chunk_bytes: int) -> list[Problem]:
    """A pass-through tensor is byte-identical to the source's: dtype and shape from both headers,
    then the bytes, `chunk_bytes` of rows at a time (an embedding can be over a GB; never held
    whole, nor twice)."""
    try:
        reader = _reader(readers, root, rel)
        stored = reader.get_slice(key).as_bits()
        if key not in ckpt.weight_map:
            raise InputError(f"{rel}: {key} is not a tensor of the source")
        original = ckpt.slice(key).as_bits()
        same = (stored.info.dtype, stored.info.shape) == (original.info.dtype, original.info.shape)
        if same:
            shape = stored.info.shape
            row_bytes = (stored.info.end - stored.info.begin) // shape[0] if shape and shape[0] else 0
            step = max(1, chunk_bytes // row_bytes) if row_bytes else 0
            if not step:  # 0-dim or empty: one read
                same = _same_bytes(stored[()], original[()])
            else:
                same = all(
                    _same_bytes(stored[r0 : r0 + step], original[r0 : r0 + step]) for r0 in range(0, shape[0], step)
                )  # stops at the first difference
    except MxconvertError as exc:
        return [Problem("passthrough", str(exc), rel, key)]
    except Exception as exc:  # unreadable tensor data
        return [Problem("passthrough", f"{rel}: {key}: unreadable ({exc})", rel, key)]
    if not same:
        return [Problem("passthrough", f"{rel}: {key} is not byte-identical to the source", rel, key)]
    return []


def _sample(layers: list[int], count: int) -> set[int]:
    """`count` layers spread over the MoE layers (first and last included)."""
    if count <= 0 or not layers:
        return set()
    if count >= len(layers):
        return set(layers)
    step = (len(layers) - 1) / max(1, count - 1)
    return {layers[round(i * step)] for i in range(count)}


def _reader(readers: dict, root: Path, rel: str) -> ShardReader:
    if rel not in readers:
        readers[rel] = ShardReader(artifact_file(root, rel))
    return readers[rel]


def _slices(readers: dict, root: Path):
    """The `fetch` of mxconvert/parts.py over this run's readers: lazy slices of stored tensors."""
    return lambda rel, key: _reader(readers, root, rel).get_slice(key).as_bits()


def _same_bytes(a: Any, b: Any) -> bool:
    """Bit-exact equality of the bytes of two host bit arrays (or two tensors on a device) of the
    same shape and element size (a NaN equals the same NaN; 0-dim included); False for different
    shapes or element sizes.

    The bytes are compared as 8-byte integers (the tail of fewer than 8 bytes, and storage that
    is not 8-byte aligned, byte by byte): torch.equal on uint8 runs at about 0.5 GB/s on one core,
    as slow as sha256 and the largest single cost of verify's chunk checks; on int64 views it is
    about 10x faster (bench/README.md, session 5). Contiguous arrays are not copied."""
    if is_host_bits(a) and is_host_bits(b):
        if a.shape != b.shape or a.itemsize != b.itemsize:
            return False
        ab, bb = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
        cut = ab.size - ab.size % 8
        return bool(
            np.array_equal(ab[:cut].view(np.int64), bb[:cut].view(np.int64)) and np.array_equal(ab[cut:], bb[cut:])
        )
    if a.shape != b.shape or a.element_size() != b.element_size():
        return False
    x, y = _flat_bytes(a), _flat_bytes(b)
    head = x.numel() - x.numel() % 8
    try:
        wide = torch.equal(x[:head].view(torch.int64), y[:head].view(torch.int64))
    except RuntimeError:  # a storage offset that is not a multiple of 8
        return torch.equal(x, y)
    return wide and torch.equal(x[head:], y[head:])


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t` as a 1-d uint8 tensor (a view where `t` is contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _check_completeness(root: Path, manifest: dict, ckpt, fmt, layout, broken: set[str], report: VerifyReport) -> None:
    """What the artifact must hold, recomputed from the source and the recorded target, against
    what the manifest and the files' headers say it holds."""

    def problem(message: str, file: str | None = None, tensor: str | None = None, rank: int | None = None):
        report.problems.append(Problem("completeness", message, file, tensor, rank))

    target = manifest["target"]
    if manifest["model"] != ckpt.facts.to_json():
        problem("the manifest's model facts are not those of the source checkpoint")
    recorded = sorted(f["file"] for f in manifest["source"].get("files", []))
    actual = sorted(str(p.relative_to(ckpt.root)) for p in ckpt.source_files())
    if recorded != actual:
        problem(f"the manifest records source files {recorded}, the source has {actual}")
    try:
        plans = fmt.plan_ranks(ckpt, target["tp_size"], target["ep_size"])
    except MxconvertError as exc:
        problem(f"the recorded target's TP/EP sizes give no rank plan for this source ({exc})")
        return
    present = sorted(entry["rank"] for entry in manifest["ranks"])
    if present != list(range(len(plans))) and not (len(present) == 1 and 0 <= present[0] < len(plans)):
        problem(
            f"the artifact holds ranks {present}; tp {target['tp_size']} x ep {target['ep_size']} has "
            f"{len(plans)} ranks, so it must hold all of them (or one, written with --rank)"
        )
    expected_keys = {
        expert_key(layer, name): (layer, name) for layer in ckpt.moe_layers for name in layout.kernel_names
    }
    for entry in manifest["ranks"]:
        rank = entry["rank"]
        try:
            check_rank_entry(manifest, entry, root / MANIFEST_NAME)
        except MxconvertError as exc:
            problem(str(exc), rank=rank)
        tensors = entry["tensors"]
        for key in sorted(set(expected_keys) - set(tensors)):
            problem(f"rank {rank}: expert tensor {key} is missing", tensor=key, rank=rank)
        for key in sorted(set(tensors) - set(expected_keys)):
            problem(f"rank {rank}: {key} is not an expert tensor the source and target give", tensor=key, rank=rank)
        for key in sorted(set(tensors) & set(expected_keys)):
            if (tensors[key]["layer"], tensors[key]["name"]) != expected_keys[key]:
                problem(
                    f"rank {rank}: {key} is recorded as layer {tensors[key]['layer']} {tensors[key]['name']}",
                    tensor=key,
                    rank=rank,
                )
        _check_headers(root, entry["files"], tensors, broken, problem, rank)
    shared = manifest["shared"]
    expected_shared = set(ckpt.other_tensor_names())
    for key in sorted(expected_shared - set(shared["tensors"])):
        problem(f"pass-through tensor {key} of the source is missing", tensor=key)
    for key in sorted(set(shared["tensors"]) - expected_shared):
        problem(f"shared tensor {key} is not a pass-through tensor of the source", tensor=key)
    _check_headers(root, shared["files"], shared["tensors"], broken, problem, None)


def _check_headers(root: Path, files: list[dict], tensors: dict, broken: set[str], problem, rank: int | None) -> None:
    """Each file holds exactly the tensors the manifest places in it (and a rank file, its rank)."""
    for entry in files:
        rel = entry["file"]
        if rel in broken:
            continue
        try:
            reader = ShardReader(artifact_file(root, rel))
            if rank is not None:
                check_rank_metadata(reader.path, reader.metadata, rank)
        except MxconvertError as exc:
            problem(str(exc), rel, rank=rank)
            continue
        listed = stored_keys(tensors, rel)
        if set(reader.tensors) != listed:
            extra = sorted(set(reader.tensors) - listed)
            missing = sorted(listed - set(reader.tensors))
            problem(
                f"{rel} holds tensors the manifest does not place there ({extra[:3]}) or lacks listed "
                f"ones ({missing[:3]})",
                rel,
                rank=rank,
            )


def _tensor_checks(
    root,
    readers,
    ckpt,
    fmt,
    layout,
    plan: RankPlan,
    rank: int,
    key: str,
    info: dict,
    geometry: Geometry,
    chunk_bytes: int,
    compute: AnyCompute = HOST,
):
    """The checks of one stored tensor as `(key, job)` pairs: `job()` returns `(problems, stop)`;
    `stop` drops the tensor's later chunks (it is unreadable). The descriptor and header checks
    run here, on the caller's thread; the chunk comparisons run on the workers."""
    name, layer, rel = info["name"], info["layer"], " + ".join(stored_files(info))
    specs = geometry.specs(plan.num_experts)
    if name not in layout.tensors and name not in layout.derived:
        problem = Problem("layout", f"{rel}: {key}: the target's layout has no tensor {name}", rel, key, rank)
        yield key, lambda: ([problem], True)
        return
    expected_desc = layout.describe_tensor(name, specs)
    if info.get("layout") != expected_desc:
        problem = Problem(
            "layout", f"{rel}: {key}: recorded layout descriptor differs from the target's layout", rel, key, rank
        )
        yield key, lambda: ([problem], False)
    try:
        want_dtype, want_shape = layout.buffer_spec(name, specs)
        for part in stored_parts(info):  # a split tensor: each part is experts of the layout's buffer
            part_key, part_shape = (
                part.key or key,
                (part.stop - part.start, *want_shape[1:]) if part.key else want_shape,
            )
            meta = _reader(readers, root, part.file).tensors.get(part_key)
            if meta is None:
                raise InputError(f"{part.file}: tensor {part_key} is missing")
            if meta.dtype != want_dtype or tuple(meta.shape) != tuple(part_shape):
                raise InputError(
                    f"{part.file}: {part_key} is {meta.dtype} {list(meta.shape)}, the layout gives "
                    f"{want_dtype} {list(part_shape)}"
                )
        stored_slice = StoredRows(info, key, _slices(readers, root))
    except MxconvertError as exc:
        problem = Problem("tensor", str(exc), rel, key, rank)
        yield key, lambda: ([problem], True)
        return
    if name in layout.derived:  # arithmetic from whole tensors: recompute and compare the bytes
        yield (
            key,
            lambda: _check_derived(
                ckpt, fmt, layout, plan, geometry, stored_slice, rank, key, name, layer, rel, compute
            ),
        )
        return
    t_layout = layout.tensors[name]
    dtype, _ = specs[name]
    per_expert = max(1, math.prod(want_shape[1:]) * want_dtype.itemsize)
    step = max(1, chunk_bytes // per_expert)
    for e0 in range(plan.expert_start, plan.expert_end, step):
        experts = range(e0, min(e0 + step, plan.expert_end))
        yield (
            key,
            (
                lambda experts=experts: _check_chunk(
                    ckpt,
                    fmt,
                    t_layout,
                    plan,
                    geometry,
                    stored_slice,
                    rank,
                    key,
                    name,
                    layer,
                    rel,
                    dtype,
                    experts,
                    compute,
                )
            ),
        )


def _check_derived(
    ckpt, fmt, layout, plan, geometry, stored_rows, rank, key, name, layer, rel, compute: AnyCompute = HOST
):
    derived = layout.derived[name]
    specs = fmt.canonical_specs(geometry, 1)
    expected, _ = compute.derive(
        derived,
        fmt.load_bits(ckpt, layer, plan, geometry, None, derived.inputs),
        {n: specs[n][0] for n in derived.inputs},
    )
    try:
        stored = stored_rows[:]
    except Exception as exc:
        return [Problem("tensor", f"{rel}: {key}: unreadable ({exc})", rel, key, rank)], True
    if stored.shape != expected.shape or not _same_bytes(stored, expected):
        idx = _first_difference(stored, expected) if stored.shape == expected.shape else []
        return [
            Problem(
                "tensor",
                f"rank {rank} {key} ({rel}): differs from the value computed from the source at index {idx}",
                rel,
                key,
                rank,
                None,
                idx,
            )
        ], False
    return [], False


def _check_chunk(
    ckpt,
    fmt,
    t_layout,
    plan: RankPlan,
    geometry: Geometry,
    stored_slice,
    rank: int,
    key: str,
    name: str,
    layer: int,
    rel: str,
    dtype,
    experts: range,
    compute: AnyCompute = HOST,
) -> tuple[list[Problem], bool]:
    """Inverse layout of one chunk of stored experts == the canonical chunk rebuilt from the source
    (inverted and compared on `compute`'s device)."""
    local = slice(experts.start - plan.expert_start, experts.stop - plan.expert_start)
    try:
        buffer = stored_slice[local]
    except Exception as exc:
        return [Problem("tensor", f"{rel}: {key}: unreadable ({exc})", rel, key, rank)], True
    expected = compute.put(fmt.load_bits(ckpt, layer, plan, geometry, experts, (name,))[name], dtype)
    try:
        actual = compute.inverse(t_layout, buffer, tuple(expected.shape), dtype)
    except InverseError as exc:  # wrong padding, or bytes no source value gives (a widened bias)
        kind = "padding" if isinstance(exc, PaddingError) else "tensor"
        return [
            Problem(
                kind,
                f"rank {rank} {key} ({rel}), experts {experts.start}..{experts.stop - 1}: {exc}",
                rel,
                key,
                rank,
                experts.start,
            )
        ], False
    if _same_bytes(actual, expected):
        return [], False
    idx = _first_difference(actual, expected)
    expert, where = _describe_index(name, idx, plan, experts.start)
    if fmt.name == "mxfp4" and _in_padding(name, idx[1:], ckpt.facts.hidden_size, plan.i_end - plan.i_start):
        return [
            Problem(
                "padding", f"rank {rank} {key} ({rel}): padding is not zero at {where}", rel, key, rank, expert, idx[1:]
            )
        ], False
    return [
        Problem(
            "tensor",
            f"rank {rank} {key} ({rel}): {where} differs from the source after the inverse layout",
            rel,
            key,
            rank,
            expert,
            idx[1:],
        )
    ], False


def _source_hash_check(hashed: Future, recorded: dict, differs: Problem) -> Callable[[], list[Problem]]:
    """The deferred comparison of one source file's sha256 (hashing overlaps the tensor checks)."""
    return lambda: [differs] if hashed.result()[0] != recorded["sha256"] else []


def _dequant_check(
    root,
    readers,
    ckpt,
    fmt,
    layout,
    plan: RankPlan,
    entry: dict,
    layer: int,
    geometry: Geometry,
    report: VerifyReport,
    jobs: int = 1,
    chunk_bytes: int = 64 << 20,
    proven: AbstractSet[str] = frozenset(),
    compute: AnyCompute = HOST,
) -> None:
    """Dequantize weight+scale from the artifact (through the inverse layout) and from the source,
    a chunk of experts at a time (chunks on the workers), and record the largest difference.
    Dequantization is a pure function of the (weight, scale) bytes, so where the restored bytes
    equal the source's the difference is exactly 0 and NaNs sit at the same places: the float
    tensors are then not built (they are 8x the bytes; building them for every expert of every
    worker made verify slower than convert and its memory grow with the thread count).
    `proven`: keys the bit-exact check already compared in full without a problem (inverse of the
    stored bytes == the source's canonical bytes, every expert): where weight and scale are both
    proven, the difference is 0 without inverting and reloading the layer a second time."""
    specs = geometry.specs(1)
    for weight in ("w13_weight", "w2_weight"):
        scale = weight.replace("weight", "weight_scale")
        keys = [f"model.layers.{layer}.mlp.experts.{n}" for n in (weight, scale)]
        infos = [entry["tensors"].get(k) for k in keys]
        if None in infos or not all(n in layout.tensors for n in (weight, scale)):
            continue  # a rescaled scale (NVFP4 Marlin) has no inverse: the bit-exact check covers it
        try:
            slices = [StoredRows(i, k, _slices(readers, root)) for k, i in zip(keys, infos)]
        except Exception:  # already reported by the bit-exact check
            continue
        if all(k in proven for k in keys):
            report.max_dequant_diff[f"rank {entry['rank']} layer {layer} {weight}"] = 0.0
            continue
        per_expert = sum(math.prod(specs[n][1]) * specs[n][0].itemsize for n in (weight, scale))
        step = max(1, chunk_bytes // max(1, per_expert))

        def one_chunk(e0: int, weight=weight, scale=scale, slices=slices, step=step) -> float | None:
            experts = range(e0, min(e0 + step, plan.expert_end))
            local = slice(e0 - plan.expert_start, experts.stop - plan.expert_start)
            try:
                restored: list[Any] = [
                    compute.inverse(layout.tensors[n], sl[local], (len(experts), *specs[n][1][1:]), specs[n][0])
                    for n, sl in zip((weight, scale), slices)
                ]
            except Exception:  # already reported by the bit-exact check
                return None
            source_bits = fmt.load_bits(ckpt, layer, plan, geometry, experts, (weight, scale))
            if all(_same_bytes(r, compute.put(source_bits[n], specs[n][0])) for r, n in zip(restored, (weight, scale))):
                return 0.0
            # rare (the bytes differ): dequantize on the host, with torch
            values: list[Any] = [
                to_torch(r, specs[n][0]) if is_host_bits(r) else r.cpu() for r, n in zip(restored, (weight, scale))
            ]
            source = {n: to_torch(b, specs[n][0]) for n, b in source_bits.items()}
            worst = 0.0
            for i in range(len(experts)):  # the bytes differ: the real values, one expert at a time
                a = fmt.dequantize(values[0][i], values[1][i])
                b = fmt.dequantize(source[weight][i], source[scale][i])
                if not torch.equal(a.isnan(), b.isnan()):
                    return float("inf")
                worst = max(worst, float((a - b).abs().nan_to_num(0.0).max()))
            return worst

        worst = 0.0
        for diff in ordered_map(
            lambda e0: compute.run(one_chunk, e0), range(plan.expert_start, plan.expert_end, step), jobs
        ):
            if diff is None:
                return
            worst = max(worst, diff)
        report.max_dequant_diff[f"rank {entry['rank']} layer {layer} {weight}"] = worst
