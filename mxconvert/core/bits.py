"""Tensors on the host as numpy arrays of their bits: the data path of `convert` and `verify`.

A host tensor of any dtype (bfloat16 and the fp8 types included, which numpy lacks) is held as a
numpy array of unsigned or signed integers of the same element width (`bits_dtype`), and its dtype
by name (`DType`, mxconvert/dtypes.py) travels beside it where it matters. Every step of the host
path only moves, packs or compares bits (reading, the layouts' gathers and codecs, hashing,
writing), so nothing on it needs torch, whose import costs seconds (bench/CHANGELOG.md, "Session 6").
torch is imported only where a step computes with values (the NVFP4 derived scales, a codec
without a numpy form, dequantizing for `verify`'s value check) or runs on a device, and the two
meet in `to_torch` / `from_torch`, which share memory and change no byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mxconvert.core.dtypes import DType, dtype_named, torch_dtype

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported on first use: planning imports this module without touching data
    from mxconvert.core.lazy_import import np

#: Integer dtype names holding an element of each width, in numpy and torch alike (so
#: `to_torch` / `from_torch` are views both ways).
BITS_BY_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def bits_dtype(dtype: object) -> np.dtype:
    """The numpy integer dtype that holds the bits of one element of `dtype` (a name or DType)."""
    return np.dtype(BITS_BY_SIZE[dtype_named(dtype).itemsize])


def as_bits(array: np.ndarray) -> np.ndarray:
    """`array` viewed as the integers of its element width (a float32 array as int32, ...)."""
    return (
        array
        if array.dtype.kind in "iu" and array.dtype.name == BITS_BY_SIZE[array.itemsize]
        else array.view(BITS_BY_SIZE[array.itemsize])
    )


def to_torch(bits: np.ndarray, dtype: object) -> torch.Tensor:
    """The torch tensor of dtype `dtype` over the same memory as `bits` (no copy)."""
    import torch

    return torch.from_numpy(as_bits(bits)).view(torch_dtype(dtype))


def from_torch(tensor: torch.Tensor) -> np.ndarray:
    """The bits of a tensor as a host numpy array (a view where it is a contiguous host tensor)."""
    return tensor.detach().cpu().contiguous().view(torch_dtype(BITS_BY_SIZE[tensor.element_size()])).numpy()


def is_host_bits(array: object) -> bool:
    """Whether `array` is a host numpy array (the host path), not a torch tensor (a device's)."""
    return type(array).__module__ == "numpy"


def host_bits(array: np.ndarray | torch.Tensor) -> np.ndarray:
    """`array` as host bits: itself, or a tensor's bits (copied to the host where it is elsewhere)."""
    return array if is_host_bits(array) else from_torch(array)  # type: ignore[return-value,arg-type]


def first_index(mask: np.ndarray) -> list[int]:
    """The index of the first True of a bool array. By argmax over the flat mask: `argwhere` would
    list every True (8 bytes per dimension each: gigabytes for a chunk of a corrupt source, or
    checked against the wrong one, on every worker at once)."""
    return [int(i) for i in np.unravel_index(int(np.argmax(mask.reshape(-1))), mask.shape)]


def dtype_of(tensor: torch.Tensor) -> DType:
    """A torch tensor's dtype by name."""
    return dtype_named(tensor.dtype)


def byte_view(bits: np.ndarray) -> memoryview:
    """The bytes of an array in memory order, for hashing and writing (a copy only where the
    array is not contiguous)."""
    flat = np.ascontiguousarray(bits).reshape(-1)
    return flat.view(np.uint8).data if flat.size else memoryview(b"")


def nan_positions(bits: np.ndarray, dtype: object) -> np.ndarray | None:
    """A bool array: where `bits` of `dtype` hold a NaN (None for dtypes without NaN). Decided on
    the bits: an all-ones exponent with a non-zero mantissa (bfloat16, float16, float32,
    float64), `S.1111.111` for float8_e4m3fn (its only NaN), `S.11111.01/10/11` for float8_e5m2,
    all ones for float8_e8m0fnu."""
    name = dtype_named(dtype)
    if name == "float8_e4m3fn":
        return (bits.view(np.uint8) & 0x7F) == 0x7F
    if name == "float8_e5m2":
        return (bits.view(np.uint8) & 0x7F) > 0x7C
    if name == "float8_e8m0fnu":
        return bits.view(np.uint8) == 0xFF
    widths = {
        "bfloat16": ("uint16", 0x7FFF, 0x7F80),
        "float16": ("uint16", 0x7FFF, 0x7C00),
        "float32": ("uint32", 0x7FFFFFFF, 0x7F800000),
        "float64": ("uint64", 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
    }
    if name not in widths:
        return None
    unsigned, magnitude, infinity = widths[name]
    return (bits.view(unsigned) & magnitude) > infinity
