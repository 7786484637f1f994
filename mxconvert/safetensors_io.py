"""Safetensors reading with precise errors, and a streaming writer.

Reading: the header is parsed and checked by us (JSON, offsets inside the file, sizes matching
dtype x shape), so a corrupt or truncated shard is refused with the file and tensor named instead
of a library traceback. Tensor data is then read through `safetensors.safe_open` (memory-mapped).

Writing: `StreamingWriter` writes the header first (all shapes are known from the plan) and then
each tensor's bytes in pieces, so a layer can be laid out expert by expert without ever holding a
whole layer's output in memory.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors import safe_open

from .errors import InputError

DTYPE_TO_ST: dict[torch.dtype, str] = {
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e8m0fnu: "F8_E8M0",
}
ST_TO_DTYPE: dict[str, torch.dtype] = {v: k for k, v in DTYPE_TO_ST.items()}
ST_ITEMSIZE = {"U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
               "I16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4, "I64": 8, "F64": 8}

_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says about one tensor."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors header: (tensors by name, metadata). Only a regular
    file is opened (a FIFO would block the read forever)."""
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
            if header_len > _MAX_HEADER or 8 + header_len > size:
                raise InputError(
                    f"{path}: corrupt or truncated safetensors header (header claims {header_len} "
                    f"bytes, file has {size})"
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: corrupt safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise InputError(f"{path}: corrupt safetensors header (__metadata__ is not an object)")
    data_start = 8 + header_len
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            st_dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if st_dtype not in ST_TO_DTYPE:
            raise InputError(f"{path}: tensor {name!r} has unsupported dtype {st_dtype}")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * ST_ITEMSIZE[st_dtype] or begin < 0:
            raise InputError(
                f"{path}: tensor {name!r} header is inconsistent ({st_dtype} {list(shape)} needs "
                f"{numel * ST_ITEMSIZE[st_dtype]} bytes, offsets give {end - begin})"
            )
        if end > data_size:
            raise InputError(
                f"{path}: truncated: tensor {name!r} ends at byte {data_start + end} but the file "
                f"has {size} bytes"
            )
        tensors[name] = TensorInfo(name, ST_TO_DTYPE[st_dtype], shape, begin, end)
    return tensors, metadata


class ShardReader:
    """Lazy reader over one validated safetensors file (memory-mapped; opened on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors, self.metadata = read_header(path)
        self._handle = None

    def _open(self):
        if self._handle is None:
            try:
                self._handle = safe_open(str(self.path), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise InputError(f"{self.path}: cannot open as safetensors: {exc}") from None
        return self._handle

    def get(self, name: str) -> torch.Tensor:
        return self._open().get_tensor(name)

    def get_slice(self, name: str):
        return self._open().get_slice(name)

    def close(self) -> None:
        self._handle = None


class StreamingWriter:
    """Write a safetensors file whose tensor shapes are declared up front.

    Tensors must then be written in declaration order; each may arrive in several pieces (e.g.
    one expert at a time). `close()` checks that every declared byte was written.
    """

    def __init__(self, path: Path, specs: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        self.path = path
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        offset = 0
        self._expected: list[tuple[str, int]] = []
        for name, dtype, shape in specs:
            nbytes = math.prod(shape) * ST_ITEMSIZE[DTYPE_TO_ST[dtype]]
            header[name] = {"dtype": DTYPE_TO_ST[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._expected.append((name, nbytes))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        self._file: BinaryIO = open(path, "wb")
        self._digest = hashlib.sha256()
        self.size = 0
        self._emit(struct.pack("<Q", len(raw)))
        self._emit(raw)
        self._index = 0
        self._written = 0

    def write(self, name: str, piece: torch.Tensor) -> None:
        """Append bytes of tensor `name` (its pieces must be written in memory order)."""
        expected_name, nbytes = self._expected[self._index]
        if name != expected_name:
            raise AssertionError(f"expected bytes of {expected_name}, got {name}")
        data = piece.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        self._written += len(data)
        if self._written > nbytes:
            raise AssertionError(f"{name}: more bytes than declared ({self._written} > {nbytes})")
        self._emit(data)
        if self._written == nbytes:
            self._index += 1
            self._written = 0

    def _emit(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self.size += len(data)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def close(self) -> None:
        if self._index != len(self._expected):
            name = self._expected[self._index][0]
            self._file.close()
            raise AssertionError(f"{self.path}: tensor {name} was not completely written")
        self._file.close()


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float8_e4m3fn` -> `float8_e4m3fn`: how dtypes are written in messages and manifests."""
    return str(dtype).removeprefix("torch.")
