"""`convert`: write the artifact of a plan (pipeline/plan.py).

Execution streams tensor by tensor and a chunk of experts at a time through the layout into a
staging folder, which is renamed into place only when everything, the manifest last, is written.
Everything about OUT itself (its checks, its lock, the staging folder, the atomic replace, the
recovery of what a killed run left) is pipeline/output.py; several targets, pipeline/targets.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.artifact.manifest import MANIFEST_NAME, SCHEMA, seal, write_manifest
from mxconvert.core.bits import byte_view, first_index, nan_positions
from mxconvert.core.digest import CHUNKED_KEY, WHOLE_KEY
from mxconvert.core.dtypes import DType
from mxconvert.core.errors import InputError, Interrupted, note_outcome, raise_if_lost, signals_deferred
from mxconvert.core.faults import fault_point
from mxconvert.core.parallel import REUSED_BYTES, reused_buffers
from mxconvert.core.version import __version__
from mxconvert.formats.base import RankPlan
from mxconvert.formats.registry import format_of
from mxconvert.pipeline import durable, output
from mxconvert.pipeline.plan import FilePlan, Plan, TensorPlan
from mxconvert.storage.files import sha256_file
from mxconvert.storage.safetensors_io import StreamingWriter, dtype_name

if TYPE_CHECKING:  # numpy and the layout engines are imported where a plan is executed (planning needs neither)
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from mxconvert.layouts.device import AnyCompute

# ---- execution ------------------------------------------------------------------------------------
Progress = Callable[[str, int], None]  # (description, bytes written) -> None


def execute(
    plan: Plan,
    out: Path,
    *,
    force: bool = False,
    progress: Progress | None = None,
    chunk_bytes: int | None = None,
    jobs: int | None = None,
    device: str | AnyCompute | None = None,
    file_sha256: bool = False,
    write_mode: str = "auto",
) -> dict:
    """Write the artifact for `plan` at `out` atomically and durably; return the sealed manifest.

    Everything is written into a staging folder next to OUT, which replaces OUT only when it is
    complete (manifest last), all under OUT's lock (pipeline/output.py). Any failure or signal
    removes the staging folder and leaves OUT as it was; `Interrupted` and the OSError-derived
    `InputError` say what OUT holds.

    `jobs` worker threads (default: the cores available) lay out chunks of experts of
    `chunk_bytes` output bytes (default: sized so the chunks in flight stay within a fixed memory
    budget); the chunks are written in plan order, so the bytes do not depend on `jobs`.
    `device`: where the layouts run ("cpu", the default, or "cuda[:N]"; layouts/device.py); the
    bytes do not depend on it either. Every written file's manifest entry holds its tree digest
    (core/digest.py, hashed on all cores as it is written); `file_sha256` adds the whole-file
    sha256 (one sequential stream per file) for external tools (`sha256sum -c`). `write_mode`:
    files written past the page cache ("direct", O_DIRECT where the filesystem allows), through it
    ("buffered"), or "auto" (pipeline/durable.py `direct_writes`); the bytes are the same."""
    from mxconvert.core.parallel import chunk_bytes_for, default_jobs
    from mxconvert.layouts.device import compute_for

    compute = compute_for(device)  # refuses a device this machine lacks before anything is touched

    jobs = jobs or default_jobs()
    direct = durable.direct_writes(write_mode, jobs)
    chunk_bytes = chunk_bytes or chunk_bytes_for(jobs)
    out = Path(os.path.abspath(out))
    output.check_output(out, plan.ckpt.root, force)
    output.make_parent(out)
    with output.locked(out):
        output.recover_interrupted(out)
        output.check_output(out, plan.ckpt.root, force)  # again, under the lock: what is there now
        return _write_and_replace(plan, out, force, progress, chunk_bytes, jobs, compute, file_sha256, direct)


def _write_and_replace(
    plan: Plan,
    out: Path,
    force: bool,
    progress: Progress | None,
    chunk_bytes: int,
    jobs: int,
    compute: AnyCompute,
    file_sha256: bool = False,
    direct: bool = False,
) -> dict:
    previous = out.exists()
    replaced = False
    staging = output.staging_path(out)
    tick = progress or (lambda desc, n: None)
    note_outcome(output.state(out, previous, False))
    try:
        try:
            staging.mkdir()
            with reused_buffers(REUSED_BYTES):  # chunk buffers reused, not fresh pages per chunk
                manifest = _write_staging(plan, staging, tick, chunk_bytes, jobs, compute, file_sha256, direct)
            durable.sync_tree(staging)  # on disk before it carries OUT's name (output.replace syncs the rename)
            raise_if_lost()  # never put an artifact in place after a signal, even a swallowed one
            with signals_deferred():
                output.replace(staging, out, force)
                replaced = True
                note_outcome(output.state(out, previous, True))
        finally:
            if not replaced:  # once replaced, the staging path may hold what is left of the previous OUT
                output.cleanup(staging)  # a signal held back meanwhile is raised here
    except OSError as exc:
        where = exc.filename or out
        raise InputError(
            f"{where}: {exc.strerror or exc}; nothing was written and {output.state(out, previous, replaced)}. "
            "Check free space and permissions, or choose another -o"
        ) from None
    except Interrupted as exc:
        exc.state = output.state(out, previous, replaced)
        raise
    return manifest


def _write(writer: StreamingWriter, key: str, tensor: np.ndarray, writeback: durable.Writeback | None = None) -> None:
    fault_point("write", writer.path)
    writer.write(key, tensor)
    if writeback is not None and not writer.direct:  # direct writes leave no dirty pages to start on
        writeback.written(writer.path, writer.size)


def _file_entry(rel: str, writer: StreamingWriter) -> dict:
    """A written file's manifest entry: size, tree digest, and the whole-file sha256 where computed."""
    entry = {"file": rel, "size": writer.size, CHUNKED_KEY: writer.chunked_sha256}
    if writer.sha256 is not None:
        entry[WHOLE_KEY] = writer.sha256
    return entry


def _write_staging(
    plan: Plan,
    staging: Path,
    tick: Progress,
    chunk_bytes: int,
    jobs: int,
    compute: AnyCompute | None = None,
    file_sha256: bool = False,
    direct: bool = False,
) -> dict:
    """Every file of the artifact, the manifest last; returns the sealed manifest.

    Chunks of experts are laid out on `jobs` worker threads and written in plan order; each file's
    tree digest is hashed as it is written, its leaves on `jobs` threads of their own; the source
    files are hashed meanwhile, on a thread of their own."""
    from concurrent.futures import ThreadPoolExecutor

    from mxconvert.core.parallel import chunk_workers, ordered_map, torch_threads
    from mxconvert.layouts.device import HostCompute, compute_for
    from mxconvert.layouts.engine.plans import prepare_all

    compute = compute_for(compute)
    # torch only where a step computes with values or runs on a device (mxconvert/bits.py)
    uses_torch = compute.uses_torch(
        format_of(plan.ckpt).loads_without_torch,
        plan.layout,
        plan.geometry.specs(plan.ranks[0].num_experts) if plan.ranks else {},
    )

    side = ThreadPoolExecutor(2, thread_name_prefix="mxconvert-side")
    leaves = ThreadPoolExecutor(jobs, thread_name_prefix="mxconvert-leaf")  # tree digests' leaves
    writeback = durable.Writeback(enabled=durable.writeback_pays(jobs))
    writer: StreamingWriter | None = None
    file_jobs = [_FileJob(rp, fp) for rp in plan.ranks for fp in plan.rank_files[rp.rank]]
    width = files_at_once(jobs)
    # sha256 streams beside the chunks: the source files', and with file_sha256 each open file's
    workers = chunk_workers(jobs, (min(width, max(1, len(file_jobs))) if file_sha256 else 0) + 1)
    if isinstance(compute, HostCompute) and workers < jobs:
        # cores to spare: the first chunks run their moves rather than wait for the plans building
        # beside them; on a small machine the plans' builders need the cores (bench/CHANGELOG.md,
        # "Session 7")
        compute = HostCompute(eager=True)
    try:
        source_files = side.submit(plan.ckpt.describe_files)  # hashed while the layers convert
        with torch_threads(jobs, uses_torch):
            # every layout plan at once, while the first chunks wait only for their own (eager: for none)
            plans = (
                side.submit(prepare_all, plan.layout.tensors, plan.geometry.specs(plan.ranks[0].num_experts), jobs)
                if plan.ranks
                else None
            )

            def run(item: tuple[_FileJob, Step, bool]):
                job, step, file_done = item
                return job, _run_step(plan, job.rank, step, compute), file_done

            def open_file(job: _FileJob) -> StreamingWriter:
                return _open_writer(staging, job.fp, plan, job.rank.rank, leaves, file_sha256, direct)

            for job, (tp, pieces, last), file_done in ordered_map(
                run, _interleaved_steps(plan, file_jobs, width, chunk_bytes, open_file), workers
            ):
                assert job.writer is not None
                for piece in pieces:
                    _write(job.writer, tp.key, piece, writeback)
                    if tp.whole is not None:
                        job.part_digest.update(byte_view(piece))
                if last:
                    job.records.append((tp, job.part_digest.hexdigest()))
                    job.part_digest = hashlib.sha256()
                    tick(f"rank {job.rank.rank} layer {tp.layer}", tp.nbytes)
                if file_done:
                    job.writer.close()
                    job.entry = _file_entry(job.fp.path, job.writer)
                    job.writer = None
        ranks_json = [_rank_entry(plan, rp, [job for job in file_jobs if job.rank is rp]) for rp in plan.ranks]
        shared_files, shared_tensors = [], {}
        for fp in plan.shared_files:
            writer = _open_writer(staging, fp, plan, None, leaves, file_sha256, direct)
            for tp in fp.tensors:
                _copy_tensor(writer, plan, tp.name, tp.key, chunk_bytes, writeback)
                shared_tensors[tp.key] = {"file": fp.path, "dtype": dtype_name(tp.dtype), "shape": list(tp.shape)}
                tick("non-expert tensors", tp.nbytes)
            writer.close()
            shared_files.append(_file_entry(fp.path, writer))
            writer = None
        aux = []
        for path in plan.ckpt.aux_files():
            copy = output.path_inside(staging, path.name)
            fault_point("write", copy)
            shutil.copyfile(path, copy)
            aux.append({"file": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)})
        if plans is not None:
            plans.result()  # raised already by the chunk that needed a plan that failed
        files = source_files.result()
        plan.ckpt.check_unchanged()  # everything read above came from one version of the source
        manifest = seal(
            {
                "schema": SCHEMA,
                "producer": {"name": "mxconvert", "version": __version__, "torch": _torch_version()},
                "source": {
                    "identity": _identity_for_seal(plan),
                    "layout": plan.ckpt.layout,
                    "files": files,
                    "warnings": list(getattr(plan.ckpt, "warnings", [])),
                },
                "model": plan.ckpt.facts.to_json(),
                "target": plan.target(),
                "selection": plan.selection.to_json(),
                "ranks": ranks_json,
                "shared": {"files": shared_files, "tensors": shared_tensors},
                "aux_files": aux,
                "provenance": {"source_path": str(plan.ckpt.root)},
            }
        )
        fault_point("write", output.path_inside(staging, MANIFEST_NAME))
        write_manifest(staging, manifest)
    except BaseException:
        for open_writer in [writer, *(job.writer for job in file_jobs)]:
            if open_writer is not None:
                open_writer.abort()
        side.shutdown(wait=True, cancel_futures=True)
        leaves.shutdown(wait=True, cancel_futures=True)
        writeback.close(cancel=True)
        raise
    side.shutdown(wait=True)
    leaves.shutdown(wait=True)
    writeback.close()
    return manifest


@dataclass
class _FileJob:
    """One file of a rank's artifact while it is written: its writer (open from its first chunk
    to its last), the running digest of a tensor part, and what its tensors record, in order."""

    rank: RankPlan
    fp: FilePlan
    writer: StreamingWriter | None = None
    part_digest: Any = field(default_factory=hashlib.sha256)
    records: list[tuple[TensorPlan, str]] = field(default_factory=list)
    entry: dict | None = None  # the manifest's file entry, once closed


def files_at_once(jobs: int) -> int:
    """Files written at the same time: one per 8 cores. Chosen when a file's whole-file sha256 was
    one stream of ~1.1 GB/s that bounded a conversion however many cores laid out (bench/CHANGELOG.md,
    "Session 6"); the tree digest no longer streams, but `--file-sha256` does, and the files of a
    rank are independent (their bytes do not depend on this number)."""
    return max(1, jobs // 8)


def _interleaved_steps(
    plan: Plan, files: list[_FileJob], width: int, chunk_bytes: int, open_file: Callable[[_FileJob], StreamingWriter]
):
    """(file, step, last step of the file) for every chunk of every file: the chunks of up to
    `width` files in turn, each file's in its own order (a file is opened at its first chunk and
    the next one starts as one finishes). The order depends on `width` alone, never on timing,
    and each file's bytes are those of writing it alone."""
    waiting = iter(files)
    active: list[tuple[_FileJob, list[Step]]] = []

    def start_next() -> bool:
        job = next(waiting, None)
        if job is None:
            return False
        steps = [step for tp in job.fp.tensors for step in _expert_steps(plan, job.rank, tp, chunk_bytes)]
        if not steps:  # every file holds a tensor of at least one expert (the planner's files)
            raise AssertionError(f"{job.fp.path}: a file of the plan with nothing to write")
        job.writer = open_file(job)
        active.append((job, steps[::-1]))  # popped from the end
        return True

    while len(active) < width and start_next():
        pass
    while active:
        for entry in list(active):
            job, steps = entry
            step = steps.pop()
            yield job, step, not steps
            if not steps:
                active.remove(entry)
                start_next()


def _rank_entry(plan: Plan, rp: RankPlan, files: list[_FileJob]) -> dict:
    """A rank's manifest entry, its tensors recorded in file order (as if written one by one)."""
    tensors_json: dict = {}
    for job in files:
        for tp, part_sha256 in job.records:
            _record(tensors_json, plan, rp, tp, job.fp.path, part_sha256)
    return {"rank": rp.rank, "plan": rp.to_json(), "files": [job.entry for job in files], "tensors": tensors_json}


def _identity_for_seal(plan: Plan) -> dict:
    ident = plan.ckpt.identity
    return {
        "kind": ident.kind,
        **({"repo_id": ident.repo_id, "revision": ident.revision} if ident.kind == "hub" else {}),
    }


def _open_writer(
    staging: Path,
    fp: FilePlan,
    plan: Plan,
    rank: int | None = None,
    leaves: ThreadPoolExecutor | None = None,
    whole_sha256: bool = False,
    direct: bool = False,
) -> StreamingWriter:
    (staging / fp.path).parent.mkdir(parents=True, exist_ok=True)
    path = output.path_inside(staging, fp.path)
    meta = {
        "format": "pt",
        "producer": "mxconvert",
        "backend": plan.selection.backend.value,
        "runtime_revision": plan.revision.name,
    }
    if rank is not None:  # the loader checks it: a rank's files can never pass for another rank's
        meta["rank"] = str(rank)
    specs = [(t.key, t.dtype, t.shape) for t in fp.tensors]
    return StreamingWriter(path, specs, meta, leaves=leaves, whole_sha256=whole_sha256, direct=direct)


#: One unit of work: a tensor of the plan and the experts of one chunk (None: the whole tensor).
Step = tuple[TensorPlan, "range | None", bool]


def _expert_steps(plan: Plan, rp: RankPlan, tp: TensorPlan, chunk_bytes: int):
    """The chunks of one expert tensor, in output order; the last one is flagged."""
    if tp.name in plan.layout.derived:  # small, computed from whole tensors of the rank
        yield tp, None, True
        return
    first, stop = rp.expert_start, rp.expert_end
    if tp.rows is not None:  # a part of a split tensor: its experts only
        first, stop = rp.expert_start + tp.rows[0], rp.expert_start + tp.rows[1]
    per_expert = max(1, tp.nbytes // max(1, stop - first))
    step = max(1, chunk_bytes // per_expert)
    starts = range(first, stop, step)
    for e0 in starts:
        yield tp, range(e0, min(e0 + step, stop)), e0 == starts[-1]


def _run_step(
    plan: Plan, rp: RankPlan, step: Step, compute: AnyCompute | None = None
) -> tuple[TensorPlan, list[np.ndarray], bool]:
    """Read the chunk's canonical tensor and lay it out on `compute`'s device (runs on a worker
    thread; default: the host); the result is the bits of its buffer, on the host."""
    from mxconvert.layouts.device import compute_for

    compute = compute_for(compute)
    tp, experts, last = step
    layer = tp.layer
    if layer is None:  # the planner gives expert steps only tensors of a layer
        raise AssertionError(f"{tp.key}: a pass-through tensor in an expert step")
    fmt = format_of(plan.ckpt)
    specs = fmt.canonical_specs(plan.geometry, 1)
    if experts is None:
        derived = plan.layout.derived[tp.name]
        inputs = fmt.load_bits(plan.ckpt, layer, rp, plan.geometry, None, derived.inputs)
        dtypes = {name: specs[name][0] for name in derived.inputs}
        whole, _ = compute.derive(derived, inputs, dtypes, where=f"{plan.ckpt.root}: layer {layer}")
        return tp, [whole if tp.rows is None else whole[tp.rows[0] : tp.rows[1]]], last
    dtype = specs[tp.name][0]
    canonical = fmt.load_bits(plan.ckpt, layer, rp, plan.geometry, experts, (tp.name,))[tp.name]
    _refuse_nan(canonical, dtype, plan, tp, experts)
    out, out_dtype = compute.forward(plan.layout.tensors[tp.name], canonical, dtype)
    # The file header was written from the layout's shape-only spec (`buffer_spec`); the writer
    # counts bytes only, so a spec that disagreed with the layout in shape or dtype at equal size
    # would label the bytes wrongly. Checked on every chunk: cheap, and it keeps the two honest.
    if out_dtype != tp.dtype or tuple(out.shape) != (len(experts), *tp.shape[1:]):
        raise AssertionError(
            f"{tp.key}: layout produced {out_dtype} {tuple(out.shape)} for experts "
            f"{experts.start}..{experts.stop - 1}, the header says {tp.dtype} {tp.shape}"
        )
    return tp, [out], last


def _copy_tensor(
    writer: StreamingWriter,
    plan: Plan,
    name: str,
    key: str,
    chunk_bytes: int,
    writeback: durable.Writeback | None = None,
) -> None:
    """A pass-through tensor, copied in pieces of at most `chunk_bytes` (embeddings can be GBs)."""
    info = plan.ckpt.info(name)
    rows = info.shape[0] if info.shape else 0
    row_bytes = (info.end - info.begin) // rows if rows else 0
    part = plan.ckpt.slice(name)
    if not rows or row_bytes == 0 or info.end - info.begin <= chunk_bytes:
        _write(writer, key, part.bits(()), writeback)
        return
    step = max(1, chunk_bytes // row_bytes)
    for r0 in range(0, rows, step):
        _write(writer, key, part.bits((slice(r0, min(rows, r0 + step)),)), writeback)


def _refuse_nan(canonical: np.ndarray, dtype: DType, plan: Plan, tp: TensorPlan, experts: range) -> None:
    """A NaN in a float source tensor (a bias, an FP8 block scale) is refused: the kernel would
    compute NaN from it, and a layout that converts dtypes does not keep NaN payloads, so what
    convert wrote could never be proven bit for bit by verify."""
    bad = nan_positions(canonical, dtype)
    if bad is not None and bad.any():
        idx = first_index(bad)
        raise InputError(
            f"{plan.ckpt.root}: layer {tp.layer} {tp.name} of expert {experts.start + idx[0]} holds "
            f"NaN (at index {idx[1:]}); the kernel cannot use it: fix the checkpoint"
        )


def _torch_version() -> str:
    """The installed torch's version, recorded in the manifest, without importing torch (the
    host path does not need it: mxconvert/bits.py)."""
    import importlib.metadata

    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__).split("+")[0]
    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _record(tensors_json: dict, plan: Plan, rp: RankPlan, tp: TensorPlan, file: str, part_sha256: str) -> None:
    """The manifest entry of a tensor written whole, or the next part of a split one (the entry
    lists its parts in order instead of one `file`; docs/artifact.md)."""
    if tp.whole is None or tp.rows is None:
        tensors_json[tp.key] = _tensor_entry(plan, rp, tp, file)
        return
    entry = tensors_json.get(tp.whole.key)
    if entry is None:
        entry = tensors_json[tp.whole.key] = _tensor_entry(plan, rp, tp.whole, file)
        del entry["file"]
        entry["parts"] = []
    entry["parts"].append({"file": file, "key": tp.key, "experts": list(tp.rows), "sha256": part_sha256})


def _tensor_entry(plan: Plan, rp: RankPlan, tp: TensorPlan, file: str) -> dict:
    desc = plan.layout.describe_tensor(tp.name, plan.geometry.specs(rp.num_experts))
    return {
        "file": file,
        "layer": tp.layer,
        "name": tp.name,
        "dtype": dtype_name(tp.dtype),
        "shape": list(tp.shape),
        "layout": desc,
    }
