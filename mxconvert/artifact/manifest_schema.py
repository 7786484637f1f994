"""The strict schema of `mxconvert.json`: every field that `load_artifact`, `verify`, `inspect` and
the vLLM plugin read, checked for its type and against what the other fields imply, before any
of them is used (docs/artifact.md, "Manifest").

A fingerprint proves only that the manifest was not edited after sealing; a manifest sealed by
anyone can still say anything. So each field a reader relies on is checked against what it must
be for the bytes it describes:
- file entries: relative paths inside the artifact, sizes, sha256 hex digests, and a chunked
  (tree) digest whose piece size hashes the whole file (a piece size of 0 or below hashes
  nothing); schema /2: every written file (rank, shared) has its tree digest, the whole-file
  sha256 only with `convert --file-sha256`; schema /1: every file has its sha256
  (docs/artifact.md, "The tree digest");
- expert tensors: a known dtype; a buffer whose bytes (dtype x shape) fit in the file(s) that
  hold it (so no reader allocates more than the artifact's files hold); a kernel view inside the
  buffer whose elements never alias (no two view indices on one stored element); an over-read no
  larger than any mirrored kernel's (target/revisions.py `hopper_scale_overread`);
- parts of split tensors: each part's key is derived from its tensor's key and expert range
  (`artifact/parts.py` `part_key`), so a part cannot be moved to another layer or range;
- names (tensor keys, part keys, file names) are printable: nothing read from a manifest can put
  a control character on a terminal.
Any problem is an `InputError` (exit 2) naming the manifest, the entry and the field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mxconvert.artifact.parts import part_key
from mxconvert.core.digest import CHUNKED_KEY, MAX_PARALLEL_PIECE, WHOLE_KEY
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError
from mxconvert.storage.files import check_relative
from mxconvert.target.revisions import REVISIONS

#: The manifest schema `convert` writes: every written file's integrity digest is its tree digest.
SCHEMA = "mxconvert.artifact/2"
#: The schema of artifacts written before the tree digest was the file digest: every file entry
#: holds its whole-file sha256 (the chunked digest where the writer already recorded it). Read and
#: checked as written; never written any more.
SCHEMA_V1 = "mxconvert.artifact/1"
READABLE_SCHEMAS = (SCHEMA, SCHEMA_V1)

#: Ranks, TP, EP and DP sizes above this are refused (planning them would take unbounded time).
MAX_PARALLEL = 1 << 16
#: The largest over-read of a kernel mxconvert mirrors: a recorded `overread_bytes` above it
#: would only make readers allocate memory.
MAX_OVERREAD_BYTES = max(revision.hopper_scale_overread for revision in REVISIONS.values())
#: Piece sizes of a chunked digest: powers of two from 4 KiB to `MAX_PARALLEL_PIECE` (artifacts
#: use `CHUNK_BYTES`, 4 MiB; a piece larger than a file is that whole file, one piece).
MIN_CHUNK_BYTES = 4 << 10
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PLAN_FIELDS = ("rank", "tp_size", "tp_rank", "ep_size", "ep_rank", "expert_start", "expert_end", "i_start", "i_end")


def shown(value: object) -> str:
    """`value` as text that is safe to print: non-printable characters (control characters,
    escape sequences) written as a Python literal writes them (`\\x1b`); printable text unchanged."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def need(obj: object, key: str, kind: type | tuple, where: str) -> Any:
    """`obj[key]`, which must exist and be a `kind` (a bool is never a whole number)."""
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(
            f"{where}: field {key!r} is {type(value).__name__}, expected {getattr(kind, '__name__', 'another type')}"
        )
    return value


def count(obj: object, key: str, where: str, low: int = 0, high: int | None = None) -> int:
    """`obj[key]`, a whole number in `[low, high]`."""
    value = need(obj, key, int, where)
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise InputError(f"{where}: field {key!r} is {value}, expected a whole number {bound}")
    return value


def int_list(value: object, field: str, where: str) -> list[int]:
    """A list of whole numbers, none negative."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{where}: field {field!r} must be a list of whole numbers")
    if any(v < 0 for v in value):
        raise InputError(f"{where}: field {field!r} is {value}, which has a negative number")
    return value


def name(value: object, what: str, where: str) -> str:
    """A non-empty printable string (a tensor key, part key or file name)."""
    if not isinstance(value, str) or not value or not value.isprintable():
        raise InputError(f"{where}: {what} {shown(repr(value))} is not a printable name")
    return value


def check_manifest(manifest: dict, where: str) -> None:
    """Every field a reader uses, checked (module docstring); `where` names the manifest file.
    A manifest of schema /1 is checked as /1 wrote it; any other as /2 (`read_manifest` has
    refused every schema but those two)."""
    tree = manifest.get("schema") != SCHEMA_V1  # the written files' digest: the tree digest
    target = need(manifest, "target", dict, where)
    for key in ("backend", "runtime_revision", "profile"):
        need(target, key, str, f"{where}: target")
    for key in ("tp_size", "ep_size"):
        count(target, key, f"{where}: target", 1, MAX_PARALLEL)
    if "dp_size" in target:
        count(target, "dp_size", f"{where}: target", 1, MAX_PARALLEL)
    if "serve" in target:
        check_serve(target, f"{where}: target")
    for key in ("hidden_size_padded", "intermediate_size_padded"):
        count(target, key, f"{where}: target")
    if "format" in target:
        need(target, "format", str, f"{where}: target")
    for key in ("layout", "runtime"):  # what the target's layout is rebuilt from
        if key in target:
            need(target, key, dict, f"{where}: target")
    model = need(manifest, "model", dict, where)
    for key in ("num_layers", "num_experts", "hidden_size", "intermediate_size"):
        if key in model:
            count(model, key, f"{where}: model")
    need(manifest, "fingerprint", str, where)
    source = need(manifest, "source", dict, where)
    if "files" in source:
        check_files(source["files"], f"{where}: source")
    _check_identity(source, f"{where}: source")
    # `provenance` is not sealed: no reader relies on it (verify only looks there for a default source)
    ranks = need(manifest, "ranks", list, where)
    if not ranks:
        raise InputError(f"{where}: 'ranks' is empty")
    seen: set[int] = set()
    for entry in ranks:
        rank = count(entry, "rank", f"{where}: ranks", 0, MAX_PARALLEL)
        if rank in seen:
            raise InputError(f"{where}: rank {rank} is listed twice")
        seen.add(rank)
        _check_rank(entry, f"{where}: rank {rank}", tree)
    shared = need(manifest, "shared", dict, where)
    shared_files = check_files(need(shared, "files", list, f"{where}: shared"), f"{where}: shared", tree)
    for key, info in need(shared, "tensors", dict, f"{where}: shared").items():
        t_at = f"{where}: shared tensor {name(key, 'key', f'{where}: shared tensors')}"
        if isinstance(info, dict) and "parts" in info:
            raise InputError(f"{t_at}: has 'parts'; pass-through tensors are never split")
        rel = need(info, "file", str, t_at)
        if rel not in shared_files:
            raise InputError(f"{t_at}: its file {shown(repr(rel))} is not among the shared files")
        itemsize = _itemsize(need(info, "dtype", str, t_at), t_at)
        shape = int_list(need(info, "shape", list, t_at), "shape", t_at)
        _fits(math.prod(shape) * itemsize, shared_files[rel], rel, t_at)
    check_files(manifest.get("aux_files", []), f"{where}: aux_files")


def _check_identity(source: dict, where: str) -> None:
    """Where the source came from: what `verify` opens by default (a hub repo at its commit)."""
    if source.get("layout") is not None:
        need(source, "layout", str, where)
    identity = source.get("identity", {})
    if not isinstance(identity, dict):
        raise InputError(f"{where}: field 'identity' is {type(identity).__name__}, expected dict")
    if identity.get("kind") == "hub":
        name(need(identity, "repo_id", str, f"{where} identity"), "repo_id", f"{where} identity")
        if identity.get("revision") is not None:
            name(need(identity, "revision", str, f"{where} identity"), "revision", f"{where} identity")


def check_files(entries: object, where: str, tree: bool = False) -> dict[str, int]:
    """File entries: name (relative, inside, printable, listed once), size, and their digests:
    with `tree` (the files a /2 convert writes) the tree digest, and the whole-file sha256 where
    recorded; else (source and copied files, and every file of a /1 manifest) the sha256, and the
    chunked digest where recorded. Returns name -> recorded size."""
    if not isinstance(entries, list):
        raise InputError(f"{where}: 'files' must be a list")
    sizes: dict[str, int] = {}
    for entry in entries:
        rel = check_relative(name(need(entry, "file", str, where), "file", where), where)
        at = f"{where}: {rel}"
        if rel in sizes:
            raise InputError(f"{where}: file {rel} is listed twice")
        sizes[rel] = count(entry, "size", at)
        if tree and CHUNKED_KEY not in entry:
            raise InputError(
                f"{at}: missing field {CHUNKED_KEY!r} (the tree digest every file written by a "
                f"{SCHEMA} convert records; docs/artifact.md)"
            )
        if (not tree or WHOLE_KEY in entry) and not _HEX64.fullmatch(need(entry, WHOLE_KEY, str, at)):
            raise InputError(f"{at}: field 'sha256' is not 64 lowercase hex digits")
        if CHUNKED_KEY in entry:
            _check_chunked(entry[CHUNKED_KEY], f"{at} {CHUNKED_KEY}")
    return sizes


def _check_chunked(chunked: object, where: str) -> None:
    """A chunked digest hashes the whole file in pieces of `chunk_bytes`: a piece size of 0 or
    below would hash no piece at all (and so "match" the digest of nothing)."""
    if not isinstance(chunked, dict) or set(chunked) != {"chunk_bytes", "digest"}:
        raise InputError(f"{where}: must be an object with exactly 'chunk_bytes' and 'digest'")
    size = count(chunked, "chunk_bytes", where, MIN_CHUNK_BYTES, MAX_PARALLEL_PIECE)
    if size & (size - 1):
        raise InputError(f"{where}: field 'chunk_bytes' is {size}, expected a power of two")
    if not _HEX64.fullmatch(need(chunked, "digest", str, where)):
        raise InputError(f"{where}: field 'digest' is not 64 lowercase hex digits")


def _check_rank(entry: dict, at: str, tree: bool) -> None:
    plan = need(entry, "plan", dict, at)
    for key in _PLAN_FIELDS:
        count(plan, key, f"{at} plan", 0, MAX_PARALLEL if key.endswith(("size", "rank")) else None)
    for lo, hi in (("expert_start", "expert_end"), ("i_start", "i_end")):
        if plan[lo] > plan[hi]:
            raise InputError(f"{at} plan: {lo} {plan[lo]} is after {hi} {plan[hi]}")
    sizes = check_files(need(entry, "files", list, at), at, tree)
    tensors = need(entry, "tensors", dict, at)
    part_keys: set[str] = set()
    for key, info in tensors.items():
        t_at = f"{at} tensor {name(key, 'key', f'{at} tensors')}"
        need(info, "layer", int, t_at)
        need(info, "name", str, t_at)
        nbytes, row_bytes = _check_layout(info, t_at)
        if "parts" in info:
            _check_parts(key, info, sizes, tensors, part_keys, row_bytes, t_at)
            continue
        rel = need(info, "file", str, t_at)
        if rel not in sizes:
            raise InputError(f"{t_at}: its file {shown(repr(rel))} is not among the rank's files")
        _fits(nbytes, sizes[rel], rel, t_at)


def _check_layout(info: dict, where: str) -> tuple[int, int]:
    """The layout descriptor's fields a reader uses. Returns the buffer's bytes and the bytes of
    one row of its dim 0 (an expert, for a split tensor)."""
    at = f"{where} layout"
    layout = need(info, "layout", dict, where)
    dtype = need(layout, "dtype", str, at)
    itemsize = _itemsize(dtype, at)
    steps = need(layout, "steps", list, at)
    if not all(isinstance(step, str) for step in steps):
        raise InputError(f"{at}: field 'steps' must be a list of strings")
    buffer = int_list(need(layout, "buffer_shape", list, at), "buffer_shape", at)
    view_shape = int_list(need(layout, "view_shape", list, at), "view_shape", at)
    view_stride = int_list(need(layout, "view_stride", list, at), "view_stride", at)
    view_problem = check_view(math.prod(buffer), view_shape, view_stride)
    if view_problem:
        raise InputError(f"{at}: view {view_shape} with strides {view_stride} {view_problem}")
    if "overread_bytes" in layout:
        count(layout, "overread_bytes", at, 0, MAX_OVERREAD_BYTES)
    if "kernel_dtype" in layout:
        need(layout, "kernel_dtype", str, at)
    # the entry's own dtype and shape (what `stored_parts` and `inspect` read) are the buffer's
    if "dtype" in info and info["dtype"] != dtype:
        raise InputError(f"{where}: field 'dtype' is {shown(repr(info['dtype']))}, its layout stores {dtype}")
    if "shape" in info and info["shape"] != buffer:
        raise InputError(f"{where}: field 'shape' is {shown(info['shape'])}, its layout's buffer is {buffer}")
    nbytes = math.prod(buffer) * itemsize
    return nbytes, (nbytes // buffer[0] if buffer and buffer[0] else 0)


def check_view(numel: int, shape: list[int], stride: list[int]) -> str:
    """Why a strided view of a buffer of `numel` elements is refused ("" when it is not): it must
    have a stride per dimension, stay inside the buffer, and never map two indices to one
    element. Non-aliasing is proven by nesting: ordered by stride, each dimension (of more than
    one element) steps over the whole span of the ones before it, as a permutation or reshape of
    a contiguous buffer does (every kernel view mxconvert writes, docs/artifact.md)."""
    if len(shape) != len(stride):
        return f"has {len(stride)} strides for {len(shape)} dimensions"
    if 0 in shape:
        return ""
    if 1 + sum((d - 1) * s for d, s in zip(shape, stride)) > numel:
        return f"reaches past the end of its buffer of {numel} elements"
    span = 1
    for size, step in sorted(((d, s) for d, s in zip(shape, stride) if d > 1), key=lambda ds: ds[1]):
        if step < span:
            return "maps two indices to one stored element (aliased strides)"
        span = step * size
    return ""


def _check_parts(
    key: str, info: dict, sizes: dict[str, int], tensors: dict, part_keys: set[str], row_bytes: int, where: str
) -> None:
    """A tensor split by --max-shard-size (docs/artifact.md): no `file`, and `parts` that each lie
    in a file of the rank under the key derived from the tensor's key and the part's experts
    (`part_key`), with a digest, and together cover the rows of dim 0 of its buffer in order,
    each row once. A part's bytes fit in its file."""
    if "file" in info:
        raise InputError(f"{where}: has both 'file' and 'parts'; a tensor is stored whole or in parts")
    shape = info["layout"]["buffer_shape"]
    parts = need(info, "parts", list, where)
    if not parts or not shape:
        raise InputError(f"{where}: 'parts' must list the parts of a tensor of at least one dimension")
    expected_start = 0
    for i, part in enumerate(parts):
        p_at = f"{where} part {i}"
        rel = need(part, "file", str, p_at)
        if rel not in sizes:
            raise InputError(f"{p_at}: its file {shown(repr(rel))} is not among the rank's files")
        stored_key = name(need(part, "key", str, p_at), "key", p_at)
        if stored_key in part_keys or stored_key in tensors:
            raise InputError(f"{p_at}: key {stored_key!r} is used twice")
        part_keys.add(stored_key)
        if not _HEX64.fullmatch(need(part, "sha256", str, p_at)):
            raise InputError(f"{p_at}: field 'sha256' is not 64 lowercase hex digits")
        rows = int_list(need(part, "experts", list, p_at), "experts", p_at)
        if len(rows) != 2 or rows[0] != expected_start or rows[1] <= rows[0]:
            raise InputError(
                f"{p_at}: experts {rows} do not continue the parts before it (expected "
                f"[{expected_start}, stop] with stop > {expected_start})"
            )
        derived = part_key(key, rows[0], rows[1])
        if stored_key != derived:
            raise InputError(
                f"{p_at}: key {stored_key!r} is not the key of experts {rows[0]}..{rows[1] - 1} of this "
                f"tensor ({derived!r}); a part is never another tensor's or another range's"
            )
        _fits((rows[1] - rows[0]) * row_bytes, sizes[rel], rel, p_at)
        expected_start = rows[1]
    if expected_start != shape[0]:
        raise InputError(f"{where}: its parts cover experts 0..{expected_start - 1}, its buffer has {shape[0]}")


def _itemsize(dtype: str, where: str) -> int:
    try:
        return dtype_named(dtype).itemsize
    except ValueError:
        raise InputError(f"{where}: dtype {shown(repr(dtype))} is not a dtype a safetensors file holds") from None


def _fits(nbytes: int, file_size: int, rel: str, where: str) -> None:
    """A tensor's recorded bytes are within the recorded size of the file that holds them."""
    if nbytes > file_size:
        raise InputError(f"{where}: its dtype and shape give {nbytes} bytes, more than its file {rel} ({file_size})")


def check_serve(target: dict, where: str) -> None:
    """`target.serve`: vLLM's parallel options (`tensor_parallel_size`, `data_parallel_size`,
    `enable_expert_parallel`), the switches that change its backend choice (`all2all_backend`, a
    name or null; `enable_lora`) and the VLLM_* variables of the selection (`env`), each of its type.
    Whether they imply the target's MoE sizes is `serve_mismatch`, which `verify` reports as a
    completeness problem (a resealed manifest whose sizes were edited is a mismatch, exit 1)."""
    serve = need(target, "serve", dict, where)
    at = f"{where} serve"
    tp = count(serve, "tensor_parallel_size", at, 1, MAX_PARALLEL)
    dp = count(serve, "data_parallel_size", at, 1, MAX_PARALLEL)
    ep_on = need(serve, "enable_expert_parallel", bool, at)
    if serve.get("all2all_backend") is not None:
        name(serve["all2all_backend"], "all2all_backend", at)
    need(serve, "enable_lora", bool, at)
    env = need(serve, "env", dict, at)
    for key, value in env.items():
        if not isinstance(value, str) or not value.isprintable():
            raise InputError(f"{at}: env {shown(repr(key))} is {shown(repr(value))}, expected printable text")
        name(key, "env variable", at)
    if ep_on and tp * dp == 1:
        raise InputError(f"{at}: enable_expert_parallel with one rank (vLLM turns expert parallelism off there)")


def serve_mismatch(target: dict) -> str | None:
    """Why `target.serve` (checked by `check_serve`) does not imply the target's MoE sizes, or None.

    vLLM 0.33.0 `FusedMoEParallelConfig.make`: TP x DP ranks form the MoE's TP group, or its EP
    group under expert parallelism; `dp_size` is DP. A manifest without `serve` has nothing to agree."""
    serve = target.get("serve")
    if not isinstance(serve, dict):
        return None
    tp, dp, ep_on = serve["tensor_parallel_size"], serve["data_parallel_size"], serve["enable_expert_parallel"]
    implied = {"tp_size": 1, "ep_size": tp * dp} if ep_on else {"tp_size": tp * dp, "ep_size": 1}
    implied["dp_size"] = dp
    for key, size in implied.items():
        if target.get(key, 1) != size:
            return (
                f"the target's serve (tensor_parallel_size {tp}, data_parallel_size {dp}"
                f"{', enable_expert_parallel' if ep_on else ''}) implies {key} {size}, but the target has "
                f"{shown(repr(target.get(key)))}"
            )
    return None


def refuse_ambiguous_parallel(manifest: dict, where: str) -> dict:
    """Refuse a manifest whose parallel sizes an older mxconvert wrote with another meaning.

    Before `target.serve` existed, `--tp` with `--dp` named the MoE's group (TP x DP ranks) rather
    than vLLM's `--tensor-parallel-size`, so `--tp 2 --dp 2` made an artifact for `vllm serve -tp 1
    -dp 2` (CHANGELOG.md). Such a manifest (`dp_size` above 1, no `serve`) records sizes its maker
    may have meant otherwise; the readers that use an artifact (load_artifact, verify, the vLLM
    plugin) refuse it and say to reconvert. Without DP the two meanings agree, so those stay valid.
    Returns `manifest`, so a reader can check it where it reads it."""
    target = manifest.get("target") if isinstance(manifest, dict) else None
    if not isinstance(target, dict) or "serve" in target:
        return manifest
    dp = target.get("dp_size", 1)
    if isinstance(dp, int) and dp > 1:
        raise InputError(
            f"{where}: made by an older mxconvert, whose --tp with --dp {dp} named vLLM's MoE group (TP x DP "
            f"ranks, here tp_size {target.get('tp_size')} ep_size {target.get('ep_size')}) instead of vLLM's "
            "--tensor-parallel-size, so which `vllm serve` it is for is ambiguous; reconvert it with this "
            f"mxconvert: `mxconvert convert MODEL ... --tp T --dp {dp}` for `vllm serve ... -tp T -dp {dp}` "
            "(add --enable-expert-parallel as for vllm serve)"
        )
    return manifest
