"""Safetensors reading with precise errors, and a streaming writer.

Reading: the header is parsed and checked by us (JSON, offsets inside the file, sizes matching
dtype x shape), so a corrupt or truncated shard is refused with the file and tensor named instead
of a library traceback. Tensor data is then read with explicit positional reads (`os.preadv`) of
exactly the byte ranges needed into fresh buffers: nothing stays mapped, so the memory of a
conversion is what its chunks in flight hold, flat in the number of layers (a memory-mapped
source keeps every touched page resident), and reads from several threads need no lock.

Writing: `StreamingWriter` writes the header first (all shapes are known from the plan) and then
each tensor's bytes in pieces, so a layer can be laid out expert by expert without ever holding a
whole layer's output in memory. Pieces are hashed from a memoryview of the tensor (no copy) on
helper threads (hashlib releases the GIL), and written past the page cache where the filesystem
allows (storage/output_file.py: copied into aligned blocks that go to disk on threads of their own).

Headers are read and checked without torch (dtypes by name, mxconvert/dtypes.py): planning
(`select`) reads them; torch is imported where tensor data is read or written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.bits import bits_dtype, byte_view, host_bits, to_torch
from mxconvert.core.digest import ChunkedSha256, ParallelChunkedSha256
from mxconvert.core.dtypes import DType, dtype_named
from mxconvert.core.errors import InputError
from mxconvert.core.parallel import host_buffer
from mxconvert.storage.output_file import OutputFile

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported where tensor data is read or written (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


from mxconvert.storage.safetensors_header import TensorInfo, _is_text, _read_header


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
        out = host_buffer(nbytes)  # while a conversion runs, a buffer of its pool (core/parallel.py)
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
        out = host_buffer(math.prod(out_shape) * itemsize).view(dtype).reshape(out_shape)  # every row written below
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
    path: Path, specs: Sequence[tuple[str, DType | torch.dtype, tuple[int, ...]]], metadata: dict[str, str] | None
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
    copied into the file's write blocks (storage/output_file.py) and hashed from a memoryview of
    its tensor on a helper thread while the next piece is produced and written (one update at a
    time, in order).

    `leaves`: a pool that hashes the tree digest's leaves (mxconvert/core/digest.py) in parallel
    as they are written (without it, one helper thread streams them; with it, a written piece must
    not change until `close()`, as its leaves may still be hashing); `whole_sha256=False`: no
    whole-file sha256 (`sha256` is None), the one digest that is a single sequential stream.
    `direct`: write past the page cache where the filesystem allows (storage/output_file.py).
    """

    def __init__(
        self,
        path: Path,
        specs: Sequence[tuple[str, DType | torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
        *,
        leaves: Executor | None = None,
        whole_sha256: bool = True,
        direct: bool = True,
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
        self._file = OutputFile(path, direct)  # held open across write() calls, closed by close()/abort()
        self._digest = hashlib.sha256() if whole_sha256 else None
        self._chunked: ChunkedSha256 | ParallelChunkedSha256 = (
            ChunkedSha256() if leaves is None else ParallelChunkedSha256(leaves)
        )
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
        previous, self._pending = self._pending, []  # each update holds `data` until hashed
        if self._digest is not None:
            self._pending.append(self._hashers[0].submit(self._digest.update, data))
        if isinstance(self._chunked, ParallelChunkedSha256):
            self._chunked.update(data)  # its leaves hash on the pool, a bounded number waiting
        else:
            self._pending.append(self._hashers[1].submit(self._chunked.update, data))
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
    def direct(self) -> bool:
        """Whether the bytes go past the page cache (O_DIRECT): nothing for `Writeback` to start."""
        return self._file.direct

    @property
    def sha256(self) -> str | None:
        """The whole-file sha256 hex (None when the writer was made with `whole_sha256=False`)."""
        self._drain()
        return None if self._digest is None else self._digest.hexdigest()

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
        if isinstance(self._chunked, ParallelChunkedSha256):
            self._chunked.wait()
        self._file.abort()


def dtype_name(dtype: DType | torch.dtype) -> DType:
    """`torch.float8_e4m3fn` (or its name) -> `float8_e4m3fn`: how dtypes are written in messages
    and manifests."""
    return dtype_named(dtype)
