"""Safetensors headers, checked as strictly as the safetensors library checks them.

A shard's header is parsed and validated here, without torch or the library (planning reads every
shard's header; the library would cost its import and a memory map per file), so a corrupt,
truncated or non-conforming shard is refused with the file and tensor named instead of being
converted: the JSON itself (no duplicate keys, no NaN, integers that are integers), the
`__metadata__` map of strings, each tensor's dtype, shape and data offsets, and the data
layout (contiguous from byte 0 to the end of the file, no gap, overlap or trailing bytes). The
rules mirror `safetensors/src/tensor.rs` (safetensors 0.8.0); where mxconvert is stricter, the
test `tests/test_safetensors_strict.py::test_where_we_are_stricter_than_the_library_it_is_on_purpose`
names each difference.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from mxconvert.core.dtypes import ST_ITEMSIZE, DType, from_safetensors
from mxconvert.core.errors import InputError

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
