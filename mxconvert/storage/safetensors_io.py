"""Safetensors reading with precise errors, and a streaming writer.

Reading: the header is parsed and checked by us (JSON, offsets inside the file, sizes matching
dtype x shape), so a corrupt or truncated shard is refused with the file and tensor named instead
of a library traceback. Tensor data is then read with explicit positional reads (`os.preadv`) of
exactly the byte ranges needed into fresh buffers: nothing stays mapped, so the memory of a
conversion is what its chunks in flight hold, flat in the number of layers (a memory-mapped
source keeps every touched page resident), and reads from several threads need no lock.

Writing: `StreamingWriter` writes the header first (all shapes are known from the plan) and then
each tensor's bytes in pieces, so a layer can be laid out expert by expert without ever holding a
whole layer's output in memory. Pieces are written from a memoryview of the tensor (no copy), and
hashed on a helper thread while the next piece is written (hashlib releases the GIL).

Headers are read and checked without torch (dtypes by name, mxconvert/dtypes.py): planning
(`select`) reads them; torch is imported where tensor data is read or written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from mxconvert.core.bits import bits_dtype, byte_view, host_bits, to_torch
from mxconvert.core.digest import ChunkedSha256
from mxconvert.core.dtypes import ST_ITEMSIZE, DType, dtype_named, from_safetensors
from mxconvert.core.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported where tensor data is read or written (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


#: The largest header the safetensors library reads: `MAX_HEADER_SIZE` in safetensors/src/tensor.rs
#: (safetensors 0.8.0), 100,000,000 bytes (decimal, not 100 MiB).
_MAX_HEADER = 100_000_000
#: safetensors stores dims and offsets as Rust `usize` (64-bit): larger numbers are refused.
_U64_MAX = 2**64 - 1
#: numpy and torch count elements in a signed 64-bit integer: a shape whose non-zero dims multiply
#: past it cannot become an array, even where the library's own check (which stops at a 0 dim) passes.
_I64_MAX = 2**63 - 1
_ENTRY_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_ADVICE = "re-download or re-save the file"


class _NotUnsigned:
    """A JSON number that is not an unsigned integer (a fraction, an exponent, a negative number, `-0`,
    or more digits than 64 bits hold): the safetensors library refuses it where a dim or offset is
    expected (serde's `usize`), while Python's json would give 2.0, 0 or a huge int. The text is kept
    so a message shows what the file says."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _NotJson(ValueError):
    """What serde_json refuses and Python's json accepts: NaN/Infinity, a key given twice."""


def _json_int(text: str) -> int | _NotUnsigned:
    # JSON has no leading zeros, so 21 digits or more exceed 2**64 - 1 (20 digits)
    return _NotUnsigned(text) if text.startswith("-") or len(text) > 20 else int(text)


def _json_constant(text: str) -> object:
    raise _NotJson(f"{text} is not JSON")


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # The library refuses a repeated `__metadata__` or entry field and keeps the last of a repeated
    # tensor name or metadata key; we refuse every repeated key: which one counts is ambiguous.
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJson(f"key {_show(key)} appears twice in one object")
        out[key] = value
    return out


def _show(value: object, limit: int = 60) -> str:
    """A header value for a message: its repr (control characters escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_unsigned(value: object) -> bool:
    """An unsigned 64-bit integer as the library reads one (`bool` is an `int` in Python, not in JSON;
    a negative number never arrives as an `int`: `_json_int`)."""
    return type(value) is int and value <= _U64_MAX


def _is_text(value: object) -> bool:
    """A string the library reads: JSON allows `\\ud800` escapes that are no Unicode text (a lone
    surrogate), which serde_json refuses and Python's json keeps."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _header_error(path: Path, what: str, name: str | None = None) -> InputError:
    tensor = "" if name is None else f"tensor {name!r}: "
    return InputError(f"{path}: corrupt safetensors header: {tensor}{what}; {_ADVICE}")


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says about one tensor (its dtype by name: no torch needed to
    read and check headers)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors header: (tensors by name, metadata). Only a regular
    file is opened (a FIFO would block the read forever)."""
    tensors, metadata, _ = _read_header(path)
    return tensors, metadata


def _read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """`read_header`, plus where the data section starts (8 + the header's length).

    Every rule of the safetensors library's reader is checked (safetensors 0.8.0,
    safetensors/src/tensor.rs: `SafeTensors::read_metadata`, the `Metadata` deserialisation and
    `Metadata::validate`), so a file it refuses is refused here too, with the file, the tensor and
    what was expected named: the header is at most 100,000,000 bytes of UTF-8 JSON (whitespace
    around it allowed), an object whose `__metadata__` is absent, null or an object of strings and
    whose other values are exactly {dtype, shape, data_offsets}: a known dtype, a list of unsigned
    integers (not floats, strings or booleans), [begin, end] unsigned with begin <= end and
    end - begin = elements x element size; sorted by offsets the tensors tile the data section from
    0 to its end, without gaps, overlaps or trailing bytes. Stricter than the library, on purpose:
    a key repeated in one object (the library keeps the last of a repeated tensor name), a field
    other than those three in an entry (the library ignores it), and a shape with more than 2**63 - 1
    elements (numpy and torch cannot hold it) are refused too.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file; only regular files are read")
        size = st.st_size
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise InputError(f"{path}: not a safetensors file (only {size} bytes)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_HEADER:
                raise InputError(
                    f"{path}: corrupt safetensors header (header claims {header_len} bytes, more than the "
                    f"{_MAX_HEADER} the safetensors format allows); {_ADVICE}"
                )
            if 8 + header_len > size:
                raise InputError(
                    f"{path}: corrupt or truncated safetensors header (header claims {header_len} "
                    f"bytes, file has {size})"
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_json_object,
            parse_int=_json_int,
            parse_float=_NotUnsigned,
            parse_constant=_json_constant,
        )
    except (UnicodeDecodeError, ValueError) as exc:  # json.JSONDecodeError and _NotJson are ValueErrors
        raise InputError(f"{path}: corrupt safetensors header ({exc}); {_ADVICE}") from None
    except RecursionError:
        raise InputError(f"{path}: corrupt safetensors header (JSON nested too deeply); {_ADVICE}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: corrupt safetensors header (not a JSON object)")
    metadata = _metadata(path, header.pop("__metadata__", None))
    data_start = 8 + header_len
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not _is_text(name):
            raise _header_error(path, "the name is not valid Unicode text (a lone surrogate escape)", name)
        tensors[name] = _tensor_info(path, name, entry)
    _check_layout(path, tensors, data_start, size)
    return tensors, metadata, data_start


def _metadata(path: Path, metadata: object) -> dict[str, str]:
    """The `__metadata__` object: absent or null (no metadata), else strings to strings (the
    library reads it as `Option<HashMap<String, String>>`)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise _header_error(path, f"__metadata__ must be an object of strings, got {_show(metadata)}")
    for key, value in metadata.items():
        if not _is_text(key) or not _is_text(value):
            raise _header_error(path, f"__metadata__ must map strings to strings, got {_show(key)}: {_show(value)}")
    return metadata


def _tensor_info(path: Path, name: str, entry: object) -> TensorInfo:
    """One tensor's entry, checked alone (its place among the others: `_check_layout`)."""
    if not isinstance(entry, dict) or entry.keys() != _ENTRY_FIELDS:
        got = _show(sorted(entry)) if isinstance(entry, dict) else _show(entry)
        expected = ", ".join(sorted(_ENTRY_FIELDS))
        raise _header_error(path, f"the entry must be an object of exactly {{{expected}}}, got {got}", name)
    st_dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    dtype = from_safetensors(st_dtype) if isinstance(st_dtype, str) else None
    if dtype is None:
        raise InputError(
            f"{path}: tensor {name!r} has unsupported dtype {_show(st_dtype)} "
            f"(expected one of {', '.join(sorted(ST_ITEMSIZE))})"
        )
    if not isinstance(shape, list) or not all(_is_unsigned(d) for d in shape):
        raise _header_error(path, f"shape must be a list of non-negative integers, got {_show(shape)}", name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_unsigned(x) for x in offsets)):
        raise _header_error(
            path, f"data_offsets must be [begin, end], two non-negative integers, got {_show(offsets)}", name
        )
    begin, end = offsets
    if end < begin:
        raise _header_error(path, f"data_offsets {offsets} end before they begin", name)
    if math.prod(d for d in shape if d) > _I64_MAX:
        raise _header_error(path, f"shape {shape} has more elements than a 64-bit count holds", name)
    nbytes = math.prod(shape) * ST_ITEMSIZE[st_dtype]
    if end - begin != nbytes:
        raise InputError(
            f"{path}: tensor {name!r} header is inconsistent ({st_dtype} {shape} needs "
            f"{nbytes} bytes, offsets give {end - begin})"
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_layout(path: Path, tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    """Sorted by offsets, the tensors must tile the data section exactly: the first starts at 0,
    each starts where the one before ends (no gap, no overlap) and the last ends at the end of
    the file (no trailing bytes), as `Metadata::validate` and `read_metadata` require."""
    data_size = size - data_start
    covered, previous = 0, None
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != covered:
            after = "the start of the data" if previous is None else f"tensor {previous!r}"
            problem = "overlaps" if info.begin < covered else f"leaves a gap of {info.begin - covered} bytes after"
            raise _header_error(
                path,
                f"data_offsets [{info.begin}, {info.end}] {problem} {after} (expected to begin at {covered})",
                info.name,
            )
        if info.end > data_size:
            raise InputError(
                f"{path}: truncated: tensor {info.name!r} ends at byte {data_start + info.end} but the file has "
                f"{size} bytes"
            )
        covered, previous = info.end, info.name
    if covered != data_size:
        last = "the header, which lists no tensor" if previous is None else f"the data of tensor {previous!r}"
        raise _header_error(
            path,
            f"{data_size - covered} bytes follow {last} (the file has {size} bytes, the header "
            f"accounts for {data_start + covered})",
        )


class ShardReader:
    """Reader over one validated safetensors file: whole tensors (`get`) or lazy slices
    (`get_slice(name)[e0:e1, a:b]`) read with `os.preadv` into fresh buffers. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors, self.metadata, self._data_start = _read_header(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDONLY)
                except OSError as exc:
                    raise InputError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
            return self._fd

    def read_into(self, buffer: memoryview, offset: int, name: str) -> None:
        """Fill `buffer` with the bytes at data offset `offset` (relative to the data section)."""
        fd = self._descriptor()
        view = buffer.cast("B") if buffer.format != "B" else buffer
        done, total = 0, len(view)
        while done < total:
            try:
                got = os.preadv(fd, [view[done:]], self._data_start + offset + done)
            except OSError as exc:
                raise InputError(f"{self.path}: cannot read tensor {name!r}: {exc.strerror or exc}") from None
            if got == 0:
                raise InputError(
                    f"{self.path}: truncated while reading tensor {name!r} (the file shrank "
                    "after its header was checked)"
                )
            done += got

    def _read_bytes(self, name: str, begin: int, nbytes: int) -> np.ndarray:
        import numpy as np

        out = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            self.read_into(out.data, begin, name)
        return out

    def get(self, name: str) -> torch.Tensor:
        return to_torch(self.get_bits(name), self._info(name).dtype)

    def get_bits(self, name: str) -> np.ndarray:
        """Tensor `name` as a numpy array of its bits (mxconvert/bits.py), without torch."""
        info = self._info(name)
        raw = self._read_bytes(name, info.begin, info.end - info.begin)
        return raw.view(bits_dtype(info.dtype)).reshape(info.shape)

    def get_bytes(self, name: str) -> bytes:
        """The stored bytes of tensor `name`, without torch (small tensors whose values are
        checked while the checkpoint is opened, e.g. NVFP4 global scales)."""
        info = self._info(name)
        out = bytearray(info.end - info.begin)
        if out:
            self.read_into(memoryview(out), info.begin, name)
        return bytes(out)

    def get_slice(self, name: str) -> TensorSlice:
        return TensorSlice(self, self._info(name))

    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise InputError(f"{self.path}: no tensor {name!r}")
        return info

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class TensorSlice:
    """`slice[a:b, c:d, ...]` of a stored tensor (unit-step slices, like safetensors' slices):
    reads only the bytes that span the selection of each leading index, returns a contiguous
    tensor of its own (no reference to the file)."""

    def __init__(self, reader: ShardReader, info: TensorInfo) -> None:
        self.reader, self.info = reader, info

    def get_shape(self) -> list[int]:
        return list(self.info.shape)

    @property
    def dtype(self) -> DType:
        return self.info.dtype

    def as_bits(self) -> BitsSlice:
        """This slice, giving host bit arrays (`bits`) instead of torch tensors."""
        return BitsSlice(self)

    def __getitem__(self, key) -> torch.Tensor:
        return to_torch(self.bits(key), self.info.dtype)

    def bits(self, key) -> np.ndarray:
        """`self[key]` as a numpy array of its bits (mxconvert/bits.py), without torch."""
        import numpy as np

        info = self.info
        dtype = bits_dtype(info.dtype)
        shape = info.shape
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > len(shape):
            raise IndexError(f"{info.name}: {len(key)} indices for a tensor of {len(shape)} dims")
        bounds = []
        for dim, size in enumerate(shape):
            k = key[dim] if dim < len(key) else slice(None)
            if not isinstance(k, slice) or k.step not in (None, 1):
                raise IndexError(f"{info.name}: only unit-step slices are supported")
            start, stop, _ = k.indices(size)
            bounds.append((start, max(start, stop)))
        out_shape = tuple(b - a for a, b in bounds)
        itemsize = info.dtype.itemsize
        if not shape:
            return self.reader.get_bits(info.name)
        if 0 in out_shape:
            return np.empty(out_shape, dtype=dtype)
        strides = _strides(shape)
        inner_full = all(a == 0 and b == s for (a, b), s in zip(bounds[1:], shape[1:]))
        if inner_full:  # one contiguous range: the leading rows
            a0, b0 = bounds[0]
            raw = self.reader._read_bytes(
                info.name, info.begin + a0 * strides[0] * itemsize, (b0 - a0) * strides[0] * itemsize
            )
            return raw.view(dtype).reshape(out_shape)
        # per leading index: read the span from the first to the last selected element, then
        # select the rest with a strided view of that span
        out = np.empty(out_shape, dtype=dtype)
        first = sum(a * st for (a, _), st in zip(bounds[1:], strides[1:]))
        last = sum((b - 1) * st for (_, b), st in zip(bounds[1:], strides[1:]))
        span = last - first + 1
        for i, row in enumerate(range(*bounds[0])):
            raw = self.reader._read_bytes(
                info.name, info.begin + (row * strides[0] + first) * itemsize, span * itemsize
            ).view(dtype)
            out[i] = np.lib.stride_tricks.as_strided(raw, out_shape[1:], tuple(st * itemsize for st in strides[1:]))
        return out


class BitsSlice:
    """A `TensorSlice` whose `[key]` is a numpy array of the selected elements' bits
    (mxconvert/bits.py): what `verify` reads, without torch."""

    def __init__(self, tensor_slice: TensorSlice) -> None:
        self.slice = tensor_slice

    @property
    def dtype(self) -> DType:
        return self.slice.dtype

    @property
    def info(self) -> TensorInfo:
        return self.slice.info

    def __getitem__(self, key) -> np.ndarray:
        return self.slice.bits(key)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _check_writable(
    path: Path, specs: list[tuple[str, DType | torch.dtype, tuple[int, ...]]], metadata: dict[str, str] | None
) -> None:
    """What `StreamingWriter` is asked to write is a header the safetensors library (and
    `read_header`) accepts: a bug upstream (a repeated name, which the header's object would
    collapse into a gap of unlisted bytes; a number as a metadata value) fails here, before a
    byte is written, not when vLLM reads the artifact."""
    for key, value in (metadata or {}).items():
        if not (_is_text(key) and _is_text(value)):
            raise AssertionError(f"{path}: metadata must map strings to strings, got {key!r}: {value!r}")
    names: set[str] = set()
    for name, _, shape in specs:
        if not _is_text(name) or name == "__metadata__" or name in names:
            raise AssertionError(f"{path}: tensor name {name!r} is not text, is reserved or repeats")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise AssertionError(f"{path}: tensor {name!r} has shape {shape!r}, not non-negative integers")
        names.add(name)


class StreamingWriter:
    """Write a safetensors file whose tensor shapes are declared up front.

    Tensors must then be written in declaration order; each may arrive in several pieces (e.g.
    one expert at a time). `close()` checks that every declared byte was written. Each piece is
    written from a memoryview of its tensor; its sha256 update runs on a helper thread while the
    next piece is produced and written (one update at a time, in order).
    """

    def __init__(
        self,
        path: Path,
        specs: list[tuple[str, DType | torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = path
        _check_writable(path, specs, metadata)
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        offset = 0
        self._expected: list[tuple[str, int]] = []
        for name, spec_dtype, shape in specs:
            dtype = dtype_named(spec_dtype)
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": dtype.safetensors, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._expected.append((name, nbytes))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - held open across add() calls, closed by close()/abort()
        self._digest = hashlib.sha256()
        self._chunked = ChunkedSha256()
        self._hashers = [ThreadPoolExecutor(1, thread_name_prefix="mxconvert-sha256") for _ in range(2)]
        self._pending: list[Future] = []
        self.size = 0
        self._emit(memoryview(struct.pack("<Q", len(raw))))
        self._emit(memoryview(raw))
        self._index = 0
        self._written = 0

    def write(self, name: str, piece: np.ndarray | torch.Tensor) -> None:
        """Append bytes of tensor `name` (its pieces must be written in memory order): a host
        array of its bits (mxconvert/bits.py), or a torch tensor."""
        expected_name, nbytes = self._expected[self._index]
        if name != expected_name:
            raise AssertionError(f"expected bytes of {expected_name}, got {name}")
        data = byte_view(host_bits(piece))
        self._written += len(data)
        if self._written > nbytes:
            raise AssertionError(f"{name}: more bytes than declared ({self._written} > {nbytes})")
        self._emit(data)
        if self._written == nbytes:
            self._index += 1
            self._written = 0

    def _emit(self, data: memoryview) -> None:
        previous = self._pending
        self._pending = [
            self._hashers[0].submit(self._digest.update, data),  # each holds `data`
            self._hashers[1].submit(self._chunked.update, data),
        ]  # until hashed
        self._file.write(data)
        self.size += len(data)
        for future in previous:
            future.result()  # at most two pieces referenced: the one hashing, the one writing

    def _drain(self) -> None:
        for future in self._pending:
            future.result()
        self._pending = []
        for hasher in self._hashers:
            hasher.shutdown(wait=True)

    @property
    def sha256(self) -> str:
        self._drain()
        return self._digest.hexdigest()

    @property
    def chunked_sha256(self) -> dict:
        """The chunked digest (mxconvert/digest.py) that `load_artifact` checks in parallel."""
        self._drain()
        return self._chunked.result()

    def close(self) -> None:
        try:
            self._drain()
        finally:
            self._file.close()
        if self._index != len(self._expected):
            name = self._expected[self._index][0]
            raise AssertionError(f"{self.path}: tensor {name} was not completely written")

    def abort(self) -> None:
        """Close after a failure (no completeness check)."""
        try:
            self._drain()
        except Exception:
            pass
        self._file.close()


def dtype_name(dtype: DType | torch.dtype) -> DType:
    """`torch.float8_e4m3fn` (or its name) -> `float8_e4m3fn`: how dtypes are written in messages
    and manifests."""
    return dtype_named(dtype)
