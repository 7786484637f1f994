"""The one mechanism every layout is built from.

A kernel tensor is made from one canonical tensor in two parts:

1. `arrange`: a pure *move* of elements plus zero padding, written with reshape / permute / pad on
   a `[E, ...]` tensor. Because it only moves elements, running it on an index tensor
   (`arange` with fill -1) yields the gather index of the whole move; that index gives the exact
   inverse (a scatter) and tells which output positions are padding, which must be zero.
2. `codec`: an element-wise re-encoding of the arranged tensor (widening cast, Hopper fp4 bit
   packing, a dtype relabel) with an exact decode.

Every layout is expert-separable (each expert's bytes are one contiguous block, experts in order),
so a layer can be laid out a chunk of experts at a time, and the index is built for one expert.
The kernel's view of the stored buffer (e.g. the transposed storage of triton_kernels) is a
`(shape, stride)` pair over the dense buffer, recorded in the manifest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch

from ..errors import MismatchError

Arrange = Callable[[torch.Tensor, int], torch.Tensor]
ViewFn = Callable[[tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


class InverseError(MismatchError):
    """A buffer is not the image of any canonical tensor (non-zero padding, inexact cast...)."""


# ---- codecs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Codec:
    """Element-wise encode/decode after the arrange step; identity by default."""

    name: str = "identity"
    #: dtype of the stored buffer for a given arranged dtype (None: unchanged).
    out_dtype: torch.dtype | None = None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.out_dtype is None else x.to(self.out_dtype)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype) -> torch.Tensor:
        return y


@dataclass(frozen=True)
class Relabel(Codec):
    """Same bytes, another dtype label (TRTLLM scales are E8M0 bytes labelled float8_e4m3fn)."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.out_dtype)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype) -> torch.Tensor:
        return y.view(arranged_dtype)


@dataclass(frozen=True)
class WideningCast(Codec):
    """bf16 → fp32 bias cast; decode checks every value is exactly representable in the source."""

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype) -> torch.Tensor:
        x = y.to(arranged_dtype)
        if not torch.equal(x.to(y.dtype).view(torch.uint8), y.contiguous().view(torch.uint8)):
            raise InverseError(f"{self.name}: values are not exactly representable as {arranged_dtype}")
        return x


IDENTITY = Codec()


@dataclass(frozen=True)
class Split:
    """How a canonical tensor is seen as elements before the move: whole bytes by default, or
    4-bit codes (`NibbleSplit`) for layouts that move individual fp4 values (Marlin)."""

    name: str = "bytes"

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def join(self, elements: torch.Tensor) -> torch.Tensor:
        return elements


@dataclass(frozen=True)
class NibbleSplit(Split):
    """u8 `[..., K/2]` -> u8 codes `[..., K]` (low nibble = even element), and back."""

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack((x & 0xF, x >> 4), dim=-1).flatten(-2)

    def join(self, elements: torch.Tensor) -> torch.Tensor:
        pairs = elements.unflatten(-1, (-1, 2))
        if bool((pairs > 0xF).any()):
            raise InverseError("a 4-bit code is larger than 15")
        return pairs[..., 0] | (pairs[..., 1] << 4)


BYTES = Split()
NIBBLES = NibbleSplit("nibbles")


# ---- views ---------------------------------------------------------------------------------------
def dense_view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(shape), _contiguous_strides(shape)


def transposed_view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`.mT` of the dense buffer: how triton_kernels holds its storage."""
    strides = _contiguous_strides(shape)
    return (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])


def reshaped_view(make_shape: Callable[[tuple[int, ...]], tuple[int, ...]]) -> ViewFn:
    def view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        new = make_shape(shape)
        if _numel(new) != _numel(shape):
            raise AssertionError(f"view {new} does not cover buffer {shape}")
        return new, _contiguous_strides(new)
    return view


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---- one tensor --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorLayout:
    """How one canonical tensor becomes one kernel tensor."""

    name: str
    arrange: Arrange
    codec: Codec = IDENTITY
    view: ViewFn = dense_view
    steps: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)
    #: Value written into padding (AITER pads scales with 0x7F = 1.0); the inverse checks it.
    pad_value: int = 0
    #: How the canonical tensor is split into the elements that are moved.
    split: Split = BYTES
    #: Shape of the kernel library's logical tensor, where it has one (triton_kernels `Tensor`).
    logical: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None

    # forward ----------------------------------------------------------------------------------
    def forward(self, canonical: torch.Tensor) -> torch.Tensor:
        """Dense buffer `[E, ...]` (memory order) holding exactly the bytes the kernel reads."""
        return self.codec.encode(self.arrange(self.split.split(canonical), self.pad_value).contiguous())

    def buffer_spec(self, canonical_shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.dtype, tuple[int, ...]]:
        """dtype and shape of the buffer for a canonical tensor of this shape (no data touched)."""
        meta = self.forward(torch.empty(canonical_shape, dtype=dtype, device="meta"))
        return meta.dtype, tuple(meta.shape)

    def kernel_view(self, buffer: torch.Tensor) -> torch.Tensor:
        shape, stride = self.view(tuple(buffer.shape))
        return buffer.as_strided(shape, stride)

    # inverse ----------------------------------------------------------------------------------
    def inverse(self, buffer: torch.Tensor, canonical_shape: tuple[int, ...],
                canonical_dtype: torch.dtype) -> torch.Tensor:
        """Canonical tensor from a dense buffer; raises `InverseError` on non-zero padding."""
        experts = canonical_shape[0]
        element_shape = tuple(self.split.split(torch.empty(canonical_shape, dtype=canonical_dtype,
                                                           device="meta")).shape)
        arranged = self.codec.decode(buffer.contiguous(), canonical_dtype).reshape(experts, -1)
        index = expert_index(self, element_shape[1:])
        valid = index >= 0
        pad = arranged[:, ~valid]
        if pad.numel():
            expected = torch.full_like(pad, self.pad_value)
            wrong = (pad.contiguous().view(torch.uint8) != expected.view(torch.uint8)).reshape(experts, -1).any(1)
            if bool(wrong.any()):
                what = "zero" if self.pad_value == 0 else f"{self.pad_value:#x}"
                raise InverseError(
                    f"{self.name}: padding is not {what} (first in expert {int(torch.nonzero(wrong)[0])})"
                )
        out = torch.empty((experts, index.numel() - int((~valid).sum())), dtype=arranged.dtype)
        out[:, index[valid]] = arranged[:, valid]
        return self.split.join(out.reshape(element_shape))

    def describe(self, canonical_shape: tuple[int, ...], dtype: torch.dtype) -> dict:
        out_dtype, shape = self.buffer_spec(canonical_shape, dtype)
        view_shape, view_stride = self.view(shape)
        return {
            "steps": list(self.steps),
            "dtype": str(out_dtype).removeprefix("torch."),
            "buffer_shape": list(shape),
            "view_shape": list(view_shape),
            "view_stride": list(view_stride),
            "canonical_shape": list(canonical_shape),
            "canonical_dtype": str(dtype).removeprefix("torch."),
            **({"logical_shape": list(self.logical(tuple(canonical_shape)))} if self.logical else {}),
            **self.info,
        }


def expert_index(layout: TensorLayout, expert_shape: tuple[int, ...]) -> torch.Tensor:
    """Flat gather index of one expert: position in buffer → position in canonical, -1 = padding."""
    return _expert_index(layout.arrange, expert_shape)


@lru_cache(maxsize=64)
def _expert_index(arrange: Arrange, expert_shape: tuple[int, ...]) -> torch.Tensor:
    n = _numel(expert_shape)
    index = arrange(torch.arange(n, dtype=torch.int64).reshape(1, *expert_shape), -1).reshape(-1)
    covered = index[index >= 0]
    if covered.numel() != n or not torch.equal(torch.sort(covered).values, torch.arange(n)):
        raise AssertionError("arrange step is not a permutation of its input plus padding")
    return index


# ---- helpers used by several layouts -------------------------------------------------------------
def pad_dims(x: torch.Tensor, sizes: dict[int, int], fill: int) -> torch.Tensor:
    """Pad dims (given as positive indices) at their end up to `sizes[dim]` with `fill`."""
    target = list(x.shape)
    for dim, size in sizes.items():
        if size < target[dim]:
            raise AssertionError("pad target smaller than the tensor")
        target[dim] = size
    if tuple(target) == tuple(x.shape):
        return x
    out = torch.full(target, fill, dtype=x.dtype, device=x.device)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


def round_up(value: int, align: int) -> int:
    return -(-value // align) * align
