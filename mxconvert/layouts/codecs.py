"""The element-wise parts of a layout around its move: how a canonical tensor is split into the
elements moved (`Split`: whole bytes, or Marlin's 4-bit codes), and how the arranged tensor is
re-encoded (`Codec`: identity, a dtype relabel, a widening cast), each with an exact decode.
Every codec and split has a torch form (any device) and a numpy form on the host's bit arrays
(mxconvert/core/bits.py) where one exists; both give the same bytes (tests/test_device.py).
See layouts/base.py for how `TensorLayout` composes them with the move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mxconvert.core.bits import from_torch, to_torch
from mxconvert.core.dtypes import DType, dtype_named, torch_dtype
from mxconvert.layouts.errors import InverseError

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a layout first runs on data: planning only builds layouts (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch


def host_fast_path(x: torch.Tensor, portable: bool) -> bool:
    """Whether a codec or split may use its numpy fast path: only for a host tensor, and never on
    the portable path (torch ops alone: what CUDA runs, and what `engine="torch"` runs on the host
    so that the CPU tests prove the device path's bytes)."""
    return not portable and x.device.type == "cpu"


@dataclass(frozen=True)
class Codec:
    """Element-wise encode/decode after the arrange step; identity by default.

    `portable`: torch ops only (any device); otherwise a host tensor may take a numpy fast path.
    Both give the same bytes (tests/test_device.py)."""

    name: str = "identity"
    #: dtype of the stored buffer (by name, e.g. "float32"; None: the arranged tensor's).
    out: DType | str | None = None

    @property
    def out_dtype(self) -> torch.dtype | None:
        """`out` as a torch dtype (for the codecs' bodies; planning reads `out`)."""
        return None if self.out is None else torch_dtype(self.out)

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        return x if self.out_dtype is None else x.to(self.out_dtype)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        return y

    def encode_bits(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        """`encode` on the host's bit arrays (mxconvert/bits.py): `x` holds elements of `dtype`,
        the result those of `encoded_spec`'s dtype. A codec with a numpy form overrides this; the
        default (the identity aside) runs the torch form on the host (torch is then imported)."""
        if self._is_identity:
            return x
        return from_torch(self.encode(to_torch(x, dtype)))

    def decode_bits(self, y: np.ndarray, arranged_dtype: DType) -> np.ndarray:
        """`decode` on bit arrays: `y` holds the stored elements, the result `arranged_dtype`'s."""
        if self._is_identity:
            return y
        stored, _ = self.encoded_spec(arranged_dtype, tuple(y.shape))
        return from_torch(self.decode(to_torch(y, stored), torch_dtype(arranged_dtype)))

    def numpy_form(self, dtype: DType) -> bool:
        """Whether `encode_bits` / `decode_bits` for arranged elements of `dtype` run on numpy
        alone (otherwise they run the torch form, and torch is imported)."""
        return self._is_identity

    @property
    def _is_identity(self) -> bool:
        return type(self) is Codec and self.out is None

    def encoded_spec(self, dtype: DType | torch.dtype, shape: tuple[int, ...]) -> tuple[DType, tuple[int, ...]]:
        """dtype (by name) and shape `encode` gives for an arranged tensor of `dtype` and `shape`
        (the shape-only path, layouts/engine/shapes.py). A codec that changes the shape declares it here."""
        return dtype_named(self.out or dtype), tuple(shape)


@dataclass(frozen=True)
class Relabel(Codec):
    """Same bytes, another dtype label (TRTLLM scales are E8M0 bytes labelled float8_e4m3fn)."""

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        assert self.out_dtype is not None, "Relabel needs out_dtype"
        return x.view(self.out_dtype)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        return y.view(arranged_dtype)

    def numpy_form(self, dtype: DType) -> bool:
        return True

    def encode_bits(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        return x  # the same bits under another name

    def decode_bits(self, y: np.ndarray, arranged_dtype: DType) -> np.ndarray:
        return y


@dataclass(frozen=True)
class WideningCast(Codec):
    """bf16 → fp32 bias cast; decode checks every value is exactly representable in the source.

    On bits: a bfloat16 is the upper half of the float32 of the same value, so the cast is a
    16-bit shift (exact for every value, NaN payloads included, as torch's cast). The decode
    refuses what torch's round trip refuses: a float32 whose lower half is not zero, and every
    NaN (torch narrows a NaN to a NaN of another payload; `convert` refuses NaN sources, so a
    stored NaN never comes from a conversion)."""

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        x = y.to(arranged_dtype)
        if not torch.equal(x.to(y.dtype).view(torch.uint8), y.contiguous().view(torch.uint8)):
            raise InverseError(f"{self.name}: values are not exactly representable as {arranged_dtype}")
        return x

    def _is_bf16_to_f32(self, dtype: DType) -> bool:
        return dtype == "bfloat16" and self.out == "float32"

    def numpy_form(self, dtype: DType) -> bool:
        return self._is_bf16_to_f32(dtype)

    def encode_bits(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        if not self._is_bf16_to_f32(dtype):
            return super().encode_bits(x, dtype)
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.int32)

    def decode_bits(self, y: np.ndarray, arranged_dtype: DType) -> np.ndarray:
        if not self._is_bf16_to_f32(arranged_dtype):
            return super().decode_bits(y, arranged_dtype)
        words = np.ascontiguousarray(y).view(np.uint32)
        nan = (words & 0x7FFFFFFF) > 0x7F800000
        if ((words & 0xFFFF) != 0).any() or nan.any():
            raise InverseError(f"{self.name}: values are not exactly representable as {arranged_dtype}")
        return (words >> 16).astype(np.uint16).view(np.int16)


IDENTITY = Codec()


@dataclass(frozen=True)
class Split:
    """How a canonical tensor is seen as elements before the move: whole bytes by default, or
    4-bit codes (`NibbleSplit`) for layouts that move individual fp4 values (Marlin)."""

    name: str = "bytes"

    def split(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        return x

    def join(self, elements: torch.Tensor) -> torch.Tensor:
        return elements

    def split_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of `split`'s elements for a canonical tensor of `shape` (the shape-only path)."""
        return tuple(shape)

    def split_bits(self, x: np.ndarray) -> np.ndarray:
        """`split` on the host's bit arrays (the elements keep the canonical dtype)."""
        return x

    def join_bits(self, elements: np.ndarray) -> np.ndarray:
        return elements


@dataclass(frozen=True)
class NibbleSplit(Split):
    """u8 `[..., K/2]` -> u8 codes `[..., K]` (low nibble = even element), and back."""

    def split(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        if host_fast_path(x, portable):  # numpy writes the two halves in place: ~2.5x faster here
            return torch.from_numpy(self.split_bits(x.contiguous().numpy()))
        return torch.stack((x & 0xF, x >> 4), dim=-1).flatten(-2)

    def join(self, elements: torch.Tensor) -> torch.Tensor:
        pairs = elements.unflatten(-1, (-1, 2))
        if bool((pairs > 0xF).any()):
            raise InverseError("a 4-bit code is larger than 15")
        return pairs[..., 0] | (pairs[..., 1] << 4)

    def split_bits(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((*x.shape[:-1], x.shape[-1] * 2), dtype=np.uint8)
        np.bitwise_and(x, 0xF, out=out[..., 0::2])
        np.right_shift(x, 4, out=out[..., 1::2])
        return out

    def join_bits(self, elements: np.ndarray) -> np.ndarray:
        pairs = elements.reshape(*elements.shape[:-1], -1, 2)
        if (pairs > 0xF).any():
            raise InverseError("a 4-bit code is larger than 15")
        return pairs[..., 0] | (pairs[..., 1] << 4)

    def split_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:-1], shape[-1] * 2)


BYTES = Split()
NIBBLES = NibbleSplit("nibbles")
