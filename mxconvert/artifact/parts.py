"""Where a stored tensor's bytes are, and the one function that reads them back.

A tensor of the artifact is stored either whole, under its own key in one file (`"file"` in its
manifest entry), or, where it is larger than `--max-shard-size`, as parts: whole experts along
dim 0 of its buffer, each part its own safetensors key in a file that fits it (`"parts"`: a list of
`{file, key, experts: [start, stop], sha256}`, `experts` local to the rank's buffer, in order and
covering it). Every consumer (`load_artifact`, `verify`, `inspect`, the vLLM plugin) reads through
`read_stored`, so a split tensor is never read by a path that does not know parts. See
docs/artifact.md, "Tensors split into parts".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mxconvert.core.bits import byte_view, host_bits, is_host_bits
from mxconvert.core.errors import MismatchError

if TYPE_CHECKING:
    import torch
else:  # imported when a stored tensor is read: planning only names parts (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


class Sliceable(Protocol):
    """A stored tensor: a `torch.Tensor`, or a lazy `TensorSlice` of a file (`[a:b]` reads rows),
    or its host-bits form (`TensorSlice.as_bits()`); `dtype` names its dtype."""

    dtype: Any

    def __getitem__(self, key: Any) -> Any: ...


#: (file, key) -> the stored tensor under `key` in `file` (raises when it is not there).
Fetch = Callable[[str, str], Sliceable]


@dataclass(frozen=True)
class StoredPart:
    """Rows `[start, stop)` of dim 0 of a tensor, stored under `key` in `file`."""

    file: str
    key: str
    start: int
    stop: int
    sha256: str | None = None  # recorded for parts of a split tensor; None for a whole tensor


def part_key(key: str, start: int, stop: int) -> str:
    """The safetensors key of experts `[start, stop)` of tensor `key` (never a runtime parameter name)."""
    return f"{key}#experts{start}-{stop - 1}"


def stored_parts(info: dict) -> list[StoredPart]:
    """The parts of a tensor's manifest entry in order; a whole tensor is one part with key ""
    (it is stored under the tensor's own key)."""
    rows = int(info["shape"][0]) if info.get("shape") else 0
    if "parts" not in info:
        return [StoredPart(info["file"], "", 0, rows)]
    return [StoredPart(p["file"], p["key"], p["experts"][0], p["experts"][1], p.get("sha256")) for p in info["parts"]]


def stored_files(info: dict) -> list[str]:
    """The files a tensor's bytes are in (one, or one per part)."""
    return list(dict.fromkeys(p.file for p in stored_parts(info)))


def stored_keys(tensors: dict[str, dict], file: str) -> set[str]:
    """The safetensors keys `file` must hold for these manifest entries (part keys for parts)."""
    return {p.key or key for key, info in tensors.items() for p in stored_parts(info) if p.file == file}


def expected_spec(info: dict) -> tuple[str, list[int]]:
    """dtype name and shape of the whole stored buffer, as the manifest records it."""
    layout = info.get("layout")
    if isinstance(layout, dict) and "buffer_shape" in layout:
        return str(layout["dtype"]), list(layout["buffer_shape"])
    return str(info["dtype"]), list(info["shape"])


def read_stored(
    info: dict,
    key: str,
    fetch: Fetch,
    *,
    rows: tuple[int, int] | None = None,
    out: Any = None,
    check_digests: bool = True,
    where: str = "",
) -> Any:
    """Rows `rows` (default: all) of dim 0 of the stored tensor `key`, read through `fetch`.

    `fetch` gives torch tensors (or slices of them), or host bit arrays (`TensorSlice.as_bits`,
    mxconvert/bits.py: what `verify` reads, without torch); the result is of the same kind.
    A whole tensor's rows are returned as `fetch` gives them (no copy) unless `out` is given. A
    split tensor is assembled part by part into `out` (allocated when None; a caller placing it on
    a device passes its preallocated buffer, so the parts are never held twice); each part must
    have the recorded dtype and shape, and with `check_digests` the recorded sha256 (only parts
    read whole are hashed: a part read in rows is covered by its file's digest)."""
    dtype_name, shape = expected_spec(info)
    total = shape[0] if shape else 0
    lo, hi = rows if rows is not None else (0, total)
    if not 0 <= lo <= hi <= max(total, 0):
        raise MismatchError(f"{where}{key}: rows {lo}..{hi} are outside its {total} rows")
    parts = stored_parts(info)
    if "parts" not in info:
        stored = fetch(parts[0].file, key)
        tensor = _check_spec(
            stored[lo:hi] if rows is not None else stored[()],
            _dtype_of(stored),
            dtype_name,
            [hi - lo, *shape[1:]] if rows is not None else shape,
            f"{where}{parts[0].file}: {key}",
        )
        if out is None:
            return tensor
        _copy_rows(out, slice(None), tensor)
        return out
    for part in parts:
        a, b = max(lo, part.start), min(hi, part.stop)
        if a >= b:
            continue
        stored = fetch(part.file, part.key)
        whole = (a, b) == (part.start, part.stop)
        piece = _check_spec(
            stored[a - part.start : b - part.start],
            _dtype_of(stored),
            dtype_name,
            [b - a, *shape[1:]],
            f"{where}{part.file}: {part.key} (experts {part.start}..{part.stop - 1} of {key})",
        )
        if whole and check_digests and part.sha256 is not None:
            digest = hashlib.sha256(byte_view(host_bits(piece))).hexdigest()
            if digest != part.sha256:
                raise MismatchError(
                    f"{where}{part.file}: {part.key} (experts {part.start}..{part.stop - 1} of {key}) "
                    f"has sha256 {digest}, the manifest says {part.sha256}"
                )
        if out is None:
            out = _empty_like(piece, (hi - lo, *shape[1:]))
        _copy_rows(out, slice(a - lo, b - lo), piece)
    if out is None:  # no rows asked for
        out = _empty_like(fetch(parts[0].file, parts[0].key)[0:0], (0, *shape[1:]))
    return out


def _dtype_of(stored: Any) -> str:
    """The dtype name of a fetched tensor or slice (`torch.uint8` and `uint8` alike)."""
    return str(stored.dtype).removeprefix("torch.")


def _empty_like(piece: Any, shape: tuple[int, ...]) -> Any:
    """A new host array or torch tensor (as `piece` is) of `piece`'s dtype and `shape`."""
    if is_host_bits(piece):
        import numpy as np

        return np.empty(shape, dtype=piece.dtype)
    return torch.empty(shape, dtype=piece.dtype)


def _copy_rows(out: Any, rows: slice, piece: Any) -> None:
    """`out[rows] = piece`: both host arrays, or both torch tensors (`out` perhaps on a device)."""
    if is_host_bits(out):
        out[rows] = piece
    else:
        out[rows].copy_(piece)


def _check_spec(tensor: Any, stored_dtype: str, dtype_name: str, shape: list[int], what: str) -> Any:
    if stored_dtype != dtype_name or list(tensor.shape) != shape:
        raise MismatchError(f"{what} is {stored_dtype} {list(tensor.shape)}, the manifest says {dtype_name} {shape}")
    return tensor


class StoredRows:
    """A stored tensor read lazily in rows: `rows[a:b]` is `read_stored(..., rows=(a, b))` (what
    a `TensorSlice` of a whole tensor gives, for split tensors too)."""

    def __init__(self, info: dict, key: str, fetch: Fetch, where: str = "") -> None:
        self.info, self.key, self.fetch, self.where = info, key, fetch, where

    def __getitem__(self, index: slice) -> Any:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise IndexError(f"{self.key}: only unit-step row slices are supported")
        shape = expected_spec(self.info)[1]
        if not shape:  # a 0-dim tensor has no rows: it is read whole
            return read_stored(self.info, self.key, self.fetch, where=self.where)
        start, stop, _ = index.indices(shape[0])
        return read_stored(self.info, self.key, self.fetch, rows=(start, max(start, stop)), where=self.where)
