"""Element types by name, without torch: what planning (`select`, `convert --dry-run`, the plan of
`convert`) knows about a tensor's dtype.

Reading a safetensors header, checking a checkpoint's tensors, computing the canonical and kernel
tensors' specs and packing them into files need a dtype's name and element size only. Importing
torch costs seconds (bench/CHANGELOG.md, "Session 5"), so on that path a dtype is a `DType`: its name
as torch spells it without the `torch.` prefix ("uint8", "bfloat16", "float8_e4m3fn", "float32"),
which is also how manifests and messages write dtypes. Code that touches tensor data gets the
torch dtype from `torch_dtype`, the one place that maps a name to torch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: (name, safetensors code, element size in bytes) of every dtype a safetensors file may hold here.
_TABLE = (
    ("uint8", "U8", 1),
    ("int8", "I8", 1),
    ("int16", "I16", 2),
    ("int32", "I32", 4),
    ("int64", "I64", 8),
    ("float16", "F16", 2),
    ("bfloat16", "BF16", 2),
    ("float32", "F32", 4),
    ("float64", "F64", 8),
    ("bool", "BOOL", 1),
    ("float8_e4m3fn", "F8_E4M3", 1),
    ("float8_e5m2", "F8_E5M2", 1),
    ("float8_e8m0fnu", "F8_E8M0", 1),
)
_ITEMSIZE = {name: size for name, _, size in _TABLE}
_TO_SAFETENSORS = {name: code for name, code, _ in _TABLE}
_FROM_SAFETENSORS = {code: name for name, code, _ in _TABLE}
#: Element sizes by safetensors code (the header check: bytes = element size x element count).
ST_ITEMSIZE = {code: size for _, code, size in _TABLE}


class DType(str):
    """A dtype by name ("uint8", "float8_e4m3fn"; a `str`, so it compares, prints and serializes
    as its name) that knows its element size, like `torch.dtype.itemsize`."""

    __slots__ = ()

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def safetensors(self) -> str:
        """The code a safetensors header writes for it ("U8", "BF16", "F8_E4M3")."""
        return _TO_SAFETENSORS[self]


UINT8, INT32, BFLOAT16, FLOAT32 = DType("uint8"), DType("int32"), DType("bfloat16"), DType("float32")
FLOAT8_E4M3FN, FLOAT8_E8M0FNU = DType("float8_e4m3fn"), DType("float8_e8m0fnu")


def dtype_named(dtype: object) -> DType:
    """The `DType` of a name ("uint8"), a `DType`, or a torch dtype (`torch.uint8`). An unknown
    dtype is a `ValueError` (a bug: headers are checked with `from_safetensors`)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _ITEMSIZE:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DType(name)


def from_safetensors(code: str) -> DType | None:
    """The `DType` of a safetensors header's dtype code, or None for a code not read here."""
    name = _FROM_SAFETENSORS.get(code)
    return None if name is None else DType(name)


@functools.cache
def torch_dtype(dtype: object) -> torch.dtype:
    """The torch dtype of a name, a `DType` or a torch dtype: the one place planning's dtypes
    meet torch, used where tensor data is touched (torch is imported here, on first use; each
    answer is kept, as the layouts ask for every chunk)."""
    import torch

    found = getattr(torch, dtype_named(dtype))
    return found


class TorchDTypes:
    """A read-only table whose values are dtype names, looked up as torch dtypes: a module can
    declare such a table at import time without importing torch (`_INT_OF_SIZE` of the layouts)."""

    def __init__(self, names: dict[Any, str]) -> None:
        self._names = {key: dtype_named(name) for key, name in names.items()}

    def __getitem__(self, key: Any) -> torch.dtype:
        return torch_dtype(self._names[key])

    def __contains__(self, key: object) -> bool:
        return key in self._names
