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

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from mxconvert.core.bits import BITS_BY_SIZE, from_torch, to_torch
from mxconvert.core.dtypes import DType, TorchDTypes, dtype_named, torch_dtype
from mxconvert.core.errors import MismatchError
from mxconvert.layouts.engine.positions import Positions
from mxconvert.layouts.engine.shapes import ShapeOnly

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a layout first runs on data: planning only builds layouts (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch

Arrange = Callable[["torch.Tensor", int], "torch.Tensor"]
ViewFn = Callable[[tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


class InverseError(MismatchError):
    """A buffer is not the image of any canonical tensor (non-zero padding, inexact cast...)."""


class PaddingError(InverseError):
    """A buffer's padding does not hold the layout's pad value."""


# ---- codecs --------------------------------------------------------------------------------------
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
        (the shape-only path, layouts/shapes.py). A codec that changes the shape declares it here."""
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


# ---- views ---------------------------------------------------------------------------------------
def dense_view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(shape), contiguous_strides(shape)


def transposed_view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`.mT` of the dense buffer: how triton_kernels holds its storage."""
    strides = contiguous_strides(shape)
    return (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])


def permuted_view(make_shape: Callable[[tuple[int, ...]], tuple[int, ...]], perm: tuple[int, ...]) -> ViewFn:
    """A permutation of a reshape of the dense buffer (a view; no data moves)."""

    def view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        base = make_shape(shape)
        strides = contiguous_strides(base)
        return tuple(base[p] for p in perm), tuple(strides[p] for p in perm)

    return view


def reshaped_view(make_shape: Callable[[tuple[int, ...]], tuple[int, ...]]) -> ViewFn:
    def view(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        new = make_shape(shape)
        if _numel(new) != _numel(shape):
            raise AssertionError(f"view {new} does not cover buffer {shape}")
        return new, contiguous_strides(new)

    return view


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _numel(shape) -> int:
    return math.prod(shape)


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
    def forward(self, canonical: torch.Tensor, engine: str = "auto") -> torch.Tensor:
        """Dense buffer `[E, ...]` (memory order) holding exactly the bytes the kernel reads.

        engine "gather": one numpy gather with the cached index (read once, write once), the fast
        way on the host for moves of short runs; "strided": one numpy copy through the plan's
        strided description of the move (`Strided`: no index read at all), where the move has
        one; "torch": the portable path, torch ops alone (the arrange function's
        reshape/permute/pad and the codecs' torch forms), which is what runs on a device tensor
        (CUDA, meta for shapes) and can be run on the host to prove it gives the same bytes;
        "auto" picks: the portable path off the host; on the host the plan's `engine` (strided
        for moves of long runs that have a strided description, gather for short runs, else the
        arrange function with the numpy codecs). Every choice gives the same bytes (tested)."""
        if engine == "torch" or canonical.device.type != "cpu":
            elements = self.split.split(canonical, True)
            return self.codec.encode(self.arrange(elements, self.pad_value).contiguous(), True)
        bits, dtype = self.forward_bits(from_torch(canonical), dtype_named(canonical.dtype), engine)
        return to_torch(bits, dtype)

    def forward_bits(self, canonical: np.ndarray, dtype: DType, engine: str = "auto") -> tuple[np.ndarray, DType]:
        """`forward` on the host's bit arrays (mxconvert/bits.py), numpy alone: the canonical
        elements of `dtype` in, the buffer's bits and dtype out. The host path of `convert` and of
        the torch `forward`: "gather", "strided", "arrange" (the move itself run by numpy on the
        data, through `Positions`: moves of long runs without a strided description), "auto"
        (the plan's `engine`) or "eager": "auto", but a plan another thread is building is not
        waited for, the move itself runs meanwhile ("arrange"; convert builds every plan beside
        its first chunks, and on a machine with cores to spare its first chunk would otherwise
        wait ~0.6 s for the plan of its tensor before the rank file's whole-file sha256, the stream
        that bounds the conversion there, could start: bench/README.md, "Session 7")."""
        elements = self.split.split_bits(canonical)
        expert_shape = tuple(elements.shape[1:])
        plan = ready_plan(self, expert_shape) if engine == "eager" else gather_plan(self, expert_shape)
        chosen = "arrange" if plan is None else plan.engine if engine in ("auto", "eager") else engine
        if chosen == "strided" and plan is not None and plan.strided is None:
            raise ValueError(f"{self.name}: this move has no strided description; use engine 'gather'")
        experts = elements.shape[0]
        if chosen == "arrange":
            moved: Positions = self.arrange(Positions(elements), self.pad_value)  # type: ignore[arg-type,assignment]
            arranged = np.ascontiguousarray(moved.array)
        else:
            assert plan is not None
            src = np.ascontiguousarray(elements).reshape(experts, plan.inverse.size)
            if chosen == "strided":
                out = _strided_forward(src, plan, self.pad_value)
            else:
                out = _gather_forward(src, plan, self.pad_value)
            arranged = out.reshape(experts, *plan.arranged_shape)
        out_dtype, _ = self.codec.encoded_spec(dtype, arranged.shape)
        return self.codec.encode_bits(arranged, dtype), out_dtype

    def buffer_spec(
        self, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype
    ) -> tuple[DType, tuple[int, ...]]:
        """dtype and shape of the buffer for a canonical tensor of this shape, from the shapes
        alone: the move run on a `ShapeOnly` (layouts/shapes.py), then the codec's declared spec.
        Raises what the move raises on an unsupported shape, as `forward` would."""
        elements = ShapeOnly(self.split.split_shape(tuple(canonical_shape)))
        arranged = self.arrange(elements, self.pad_value)  # type: ignore[arg-type]  # stands in for a tensor
        return self.codec.encoded_spec(dtype, arranged.shape)

    def meta_spec(self, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype) -> tuple[DType, tuple[int, ...]]:
        """`buffer_spec` the slow way, `forward` on a meta tensor: what the shape-only path is
        tested against (tests/test_layout_shapes.py)."""
        meta = self.forward(torch.empty(canonical_shape, dtype=torch_dtype(dtype), device="meta"))
        return dtype_named(meta.dtype), tuple(meta.shape)

    def kernel_view(self, buffer: torch.Tensor) -> torch.Tensor:
        shape, stride = self.view(tuple(buffer.shape))
        return buffer.as_strided(shape, stride)

    # inverse ----------------------------------------------------------------------------------
    def inverse(
        self,
        buffer: torch.Tensor,
        canonical_shape: tuple[int, ...],
        canonical_dtype: DType | torch.dtype,
        engine: str = "auto",
    ) -> torch.Tensor:
        """Canonical tensor from a dense buffer; raises `InverseError` on wrong padding.

        The scatter of the cached plan: with numpy on the host ("auto" for a host buffer: one
        strided copy where the plan has a strided description of long runs, else the gather of
        the inverse index; "gather" / "strided" force one), or with torch's `index_select` on the
        buffer's device ("torch", and "auto" off the host; the indices are cached on that
        device). The result is on the buffer's device; where the move is the identity it may
        share memory with `buffer` (as `forward`'s result may with its input)."""
        if not (engine == "torch" or buffer.device.type != "cpu"):
            bits = self.inverse_bits(from_torch(buffer), canonical_shape, dtype_named(canonical_dtype), engine)
            return to_torch(bits, canonical_dtype)
        experts = canonical_shape[0]
        meta = self.split.split(torch.empty(canonical_shape, dtype=torch_dtype(canonical_dtype), device="meta"))
        element_shape, element_dtype = tuple(meta.shape), meta.dtype
        plan = gather_plan(self, element_shape[1:])
        arranged = self.codec.decode(buffer.contiguous(), element_dtype, True).reshape(experts, plan.forward.size)
        out = self._scatter_torch(arranged, plan)
        return self.split.join(out.view(element_dtype).reshape(element_shape)).to(buffer.device)

    def inverse_bits(
        self, buffer: np.ndarray, canonical_shape: tuple[int, ...], canonical_dtype: DType, engine: str = "auto"
    ) -> np.ndarray:
        """`inverse` on the host's bit arrays, numpy alone: the canonical tensor's bits from the
        stored buffer's (raises `InverseError` on wrong padding)."""
        experts = canonical_shape[0]
        element_shape = self.split.split_shape(tuple(canonical_shape))
        plan = gather_plan(self, tuple(element_shape[1:]))
        arranged = self.codec.decode_bits(np.ascontiguousarray(buffer), canonical_dtype)
        flat = np.ascontiguousarray(arranged).reshape(experts, plan.forward.size)
        chosen = plan.engine if engine in ("auto", "arrange") else engine
        out = self._scatter_numpy(flat, plan, strided=chosen == "strided" and plan.strided is not None)
        return self.split.join_bits(out.reshape(element_shape))

    def _scatter_numpy(self, flat: np.ndarray, plan: GatherPlan, strided: bool = False) -> np.ndarray:
        if plan.pad.size:
            pad = _pad_values(flat, plan)
            wrong = (pad != pad.dtype.type(self.pad_value)).reshape(flat.shape[0], plan.pad.size).any(axis=1)
            if wrong.any():
                self._refuse_padding(int(np.argmax(wrong)))
        if strided and plan.strided is not None:
            words = np.ascontiguousarray(plan.strided.inverse.word_view(flat))
            return words.view(flat.dtype).reshape(flat.shape[0], plan.inverse.size)
        return _gather_inverse(flat, plan)

    def _scatter_torch(self, arranged: torch.Tensor, plan: GatherPlan) -> torch.Tensor:
        index = device_index(plan, arranged.device)
        flat = _as_int(arranged)
        if index.pad is not None:
            wrong = (flat.index_select(1, index.pad) != self.pad_value).any(dim=1)
            if bool(wrong.any()):
                self._refuse_padding(int(torch.argmax(wrong.to(torch.uint8))))
        return flat.index_select(1, index.inverse)

    def _refuse_padding(self, expert: int) -> None:
        what = "zero" if self.pad_value == 0 else f"{self.pad_value:#x}"
        raise PaddingError(f"{self.name}: padding is not {what} (first in expert {expert})")

    def describe(self, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype) -> dict:
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


@dataclass(frozen=True)
class Strided:
    """Flat positions within one expert as one strided view: the position of index `i` of
    `shape` (row-major) is `offset + sum(i[k] * strides[k])` (strides in elements, may be
    negative: a flipped dimension). A move that is a reshape / permute / flip of whole
    dimensions has one; copying through it reads no index (8 bytes per element moved for a
    gather) and copies each run of consecutive elements at once."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def run(self) -> int:
        """Elements at consecutive positions at the innermost level (1: every element alone)."""
        return self.shape[-1] if self.strides[-1] == 1 else 1

    def word_view(self, flat: np.ndarray) -> np.ndarray:
        """`view` over words of up to 16 bytes where the innermost runs, every other stride and
        the offset allow: each run is then copied as a few wide words instead of element by
        element (numpy copies a dtype to itself bit for bit; the AITER 16-byte runs gain ~2x).
        The caller views the words of `flat` the same way (`flat.view(result.dtype)`)."""
        item, size = flat.itemsize, flat.shape[1]
        for width in (16, 8, 4, 2):
            k = width // item
            if width % item or k <= 1 or self.strides[-1] != 1:
                continue
            if self.shape[-1] % k or size % k or self.offset % k or any(s % k for s in self.strides[:-1]):
                continue
            words = Strided(
                (*self.shape[:-1], self.shape[-1] // k), (*(s // k for s in self.strides[:-1]), 1), self.offset // k
            )
            return words.view(flat.view(_WORDS[width]))
        return self.view(flat)

    def view(self, flat: np.ndarray) -> np.ndarray:
        """`[E, *shape]` view of the experts of `flat` (`[E, per-expert size]`, C-contiguous)."""
        experts, size = flat.shape
        item = flat.itemsize
        if not flat.flags.c_contiguous:  # a reshape would copy, and writes would be lost
            raise AssertionError("Strided.view needs a C-contiguous array")
        if experts == 0:
            return np.empty((0, *self.shape), dtype=flat.dtype)
        return np.lib.stride_tricks.as_strided(
            flat.reshape(-1)[self.offset :],
            shape=(experts, *self.shape),
            strides=(size * item, *(s * item for s in self.strides)),
        )


#: Word dtypes for bit copies (complex128: a 16-byte word numpy copies without arithmetic).
_WORDS: dict[int, str] = {2: "uint16", 4: "uint32", 8: "uint64", 16: "complex128"}


@dataclass(frozen=True)
class StridedMove:
    """The strided descriptions of a plan (see `Strided`), where its move has them with
    innermost runs of at least `STRIDED_MIN_RUN` elements (shorter runs gather faster).

    `inverse`: canonical order -> buffer positions (every move without one has no `StridedMove`);
    `forward`: buffer order -> canonical positions (None where the move pads);
    `pad`: the padding positions of the buffer (None: none, or not strided: use `plan.pad`)."""

    inverse: Strided
    forward: Strided | None
    pad: Strided | None


@dataclass(frozen=True)
class GatherPlan:
    """The move of one expert as gather indices (numpy intp), built once per shape and cached.

    `forward[i]`: element of the (split) canonical expert that buffer position i holds, or `n`
    (one past the end: the pad slot). `inverse[j]`: buffer position of canonical element j.
    `pad`: the buffer positions that are padding. `strided`: the same move as strided views,
    where it is one (found from the indices themselves, so it is exact by construction)."""

    forward: np.ndarray
    inverse: np.ndarray
    pad: np.ndarray
    arranged_shape: tuple[int, ...]
    #: Average length of the runs of consecutive source elements the move keeps together.
    mean_run: float
    strided: StridedMove | None = None
    #: Elements the move keeps together in aligned blocks (8, 4, 2 or 1): it then also moves
    #: `unit`-element words, by the word indices `forward_units` / `inverse_units` (`unit`
    #: times shorter; a padding word is `n // unit`). The 128x4 scale swizzles move 4-byte words.
    unit: int = 1
    forward_units: np.ndarray | None = None
    inverse_units: np.ndarray | None = None
    #: The padding positions as one strided view, where they are one (whatever engine moves the
    #: rest): filling and checking the padding then reads no index. The padded 128x4 scale
    #: swizzles gather, but their padding is whole 512-byte blocks or strided runs; numpy's
    #: fancy-index fill cost ~5 ns per pad byte there (bench/README.md, "Session 5").
    pad_strided: Strided | None = None

    def word_dtype(self, itemsize: int) -> np.dtype | None:
        """The numpy dtype of one `unit`-element word of elements of `itemsize` bytes, or None
        where the move has no unit or the word is wider than 8 bytes."""
        width = self.unit * itemsize
        return np.dtype(f"u{width}") if self.unit > 1 and width in (2, 4, 8) else None

    @property
    def fine_grained(self) -> bool:
        """Moves of short runs (single bytes, 4-byte scale groups) are faster as one gather;
        moves of whole rows or padding only are faster as torch's strided copy (measured in
        bench/bench_layouts.py)."""
        return self.mean_run < 16

    @property
    def engine(self) -> str:
        """How `forward` / `inverse` run this move on the host by default: "strided" (one numpy
        copy through `strided`) for moves with a strided description (innermost runs of at
        least `STRIDED_MIN_RUN` elements); "gather" for moves of short runs; "arrange" (the arrange function
        itself, for moves of long runs without a strided description). Measured in
        bench/bench_forward.py --engines."""
        if self.strided is not None:
            return "strided"
        return "gather" if self.fine_grained else "arrange"


def _strided_of(index: np.ndarray, min_run: int = 1) -> Strided | None:
    """The `Strided` whose positions, in row-major order, are exactly `index`, or None.

    Peels the innermost dimension off at a time: its size is the longest run from the start
    with a constant step, and every other run must have that size and step; the run starts
    are the next level's positions. Only exact matches are kept (each level is checked over
    all positions), so a move it describes is copied bit-exactly. O(n). `min_run`: None at once
    where the innermost runs are shorter (decided from the first few positions)."""
    if index.size == 0:
        return None
    if min_run > 1:
        head = index[:min_run]
        if head.size > 1 and not (np.diff(head) == 1).all():
            return None
    offset = int(index[0])
    dims: list[tuple[int, int]] = []
    cur = index
    while cur.size > 1:
        step = int(cur[1]) - int(cur[0])
        breaks = np.flatnonzero(np.diff(cur) != step)
        size = int(breaks[0]) + 1 if breaks.size else cur.size
        if cur.size % size or ((breaks + 1) % size).any():
            return None
        cur = cur[::size]  # each run's first position: the next level's positions
        dims.append((size, step))
    if not dims:
        return Strided((1,), (1,), offset)
    dims.reverse()
    return Strided(tuple(d for d, _ in dims), tuple(s for _, s in dims), offset)


#: Shortest innermost run (elements) for which the strided copy beats a gather (bench_forward.py
#: --engines: runs of 1-4 bytes gather faster, runs of 16 bytes and more copy faster).
STRIDED_MIN_RUN = 16


def _strided_move(forward: np.ndarray, inverse: np.ndarray, pad: np.ndarray) -> StridedMove | None:
    inv = _strided_of(inverse, STRIDED_MIN_RUN)
    if inv is None or inv.run < STRIDED_MIN_RUN:  # a gather is faster for short runs
        return None
    move = StridedMove(inv, None if pad.size else _strided_of(forward), _strided_of(pad) if pad.size else None)
    for description, index in ((move.inverse, inverse), (move.forward, forward), (move.pad, pad)):
        _check_describes(description, index)
    return move


def _check_describes(description: Strided | None, index: np.ndarray) -> None:
    """The strided view must reproduce the plan's index exactly at this shape: convert's forward
    and verify's inverse both copy through it, so an error in it would round-trip unseen.
    Checked once per plan by viewing the positions themselves."""
    if description is None:
        return
    positions = np.arange(int(index.max()) + 1 if index.size else 1, dtype=index.dtype)[None]
    seen = description.view(positions).reshape(-1)
    if not np.array_equal(seen, index):
        raise AssertionError(f"strided description {description} does not reproduce its move's index")


def _fill_pad(out: np.ndarray, plan: GatherPlan, value: int) -> None:
    if plan.pad_strided is not None:
        plan.pad_strided.view(out)[...] = value
    else:
        for row in out:  # a 1-D fancy assignment per expert: ~4x faster than one 2-D one
            row[plan.pad] = value


def _pad_values(flat: np.ndarray, plan: GatherPlan) -> np.ndarray:
    """The values at the padding positions of every expert of `flat` (`[E, buffer size]`)."""
    if plan.pad_strided is not None:
        return plan.pad_strided.view(flat)
    return np.take(flat, plan.pad, axis=1)


def _gather_forward(src: np.ndarray, plan: GatherPlan, pad_value: int) -> np.ndarray:
    """`[E, buffer size]` by one gather of the forward index (of words, where the move keeps
    aligned words together); padding positions (index n) read a clipped position and are then
    overwritten with the pad value (no padded copy of the source)."""
    word = plan.word_dtype(src.itemsize)
    if word is not None and plan.forward_units is not None:
        out = np.take(src.view(word), plan.forward_units, axis=1, mode="clip").view(src.dtype)
    else:
        out = np.take(src, plan.forward, axis=1, mode="clip" if plan.pad.size else "raise")
    if plan.pad.size:
        _fill_pad(out, plan, pad_value)
    return out


def _gather_inverse(flat: np.ndarray, plan: GatherPlan) -> np.ndarray:
    """`[E, canonical size]` by one gather of the inverse index (of words where it can)."""
    word = plan.word_dtype(flat.itemsize)
    if word is not None and plan.inverse_units is not None:
        return np.take(flat.view(word), plan.inverse_units, axis=1).view(flat.dtype)
    return np.take(flat, plan.inverse, axis=1)


def _units(forward: np.ndarray, inverse: np.ndarray, n: int) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """The largest `unit` in (8, 4, 2) such that the move takes every aligned block of `unit`
    buffer positions from one aligned block of `unit` canonical elements, in order (or pads the
    whole block), with the word indices; (1, None, None) where there is none."""
    for unit in (8, 4, 2):
        if n % unit or forward.size % unit:
            continue
        blocks = forward.reshape(-1, unit)
        if not _whole_blocks(blocks[:64], n, unit):  # most moves fail at once: no full pass
            continue
        if not _whole_blocks(blocks, n, unit):
            continue
        return unit, blocks[:, 0] // unit, inverse[::unit] // unit
    return 1, None, None


def _whole_blocks(blocks: np.ndarray, n: int, unit: int) -> bool:
    """Every row of `blocks` (forward indices, `unit` per row) is either all padding (n) or
    `unit`-aligned consecutive canonical positions."""
    first = blocks[:, 0]
    pad = first == n
    if (first % unit).any():  # n % unit == 0, so padding rows pass this
        return False
    return all(np.array_equal(blocks[:, j], np.where(pad, n, first + j)) for j in range(1, unit))


def _strided_forward(src: np.ndarray, plan: GatherPlan, pad_value: int) -> np.ndarray:
    """`[E, buffer size]` by one strided copy: a strided read in buffer order where the move does
    not pad (no copy at all where it is the identity), else a strided write of the canonical
    elements into the buffer and the pad value into its padding."""
    move = plan.strided
    assert move is not None
    experts = src.shape[0]
    if move.forward is not None:
        return np.ascontiguousarray(move.forward.word_view(src)).view(src.dtype).reshape(experts, plan.forward.size)
    out = np.empty((experts, plan.forward.size), dtype=src.dtype)
    target = move.inverse.word_view(out)
    target[...] = src.view(target.dtype).reshape(target.shape)
    _fill_pad(out, plan, pad_value)
    return out


#: A tensor's dtype (by name; a torch dtype is accepted too) and shape, as planning sees it.
Spec = tuple["DType | str | torch.dtype", tuple[int, ...]]


@dataclass(frozen=True)
class Formula:
    """The arithmetic of a `DerivedTensor`, and what it gives: `spec(*input specs)` is the dtype
    and shape `compute(*inputs)` returns, from the specs alone (planning runs no tensor op; the
    counterpart of `Codec.encoded_spec`). tests/test_layout_shapes.py checks every declared spec
    against `compute` run on meta tensors."""

    compute: Callable[..., torch.Tensor]
    spec: Callable[..., Spec]

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.compute(*tensors)


def formula(spec: Callable[..., Spec]) -> Callable[[Callable[..., torch.Tensor]], Formula]:
    """Decorator: the function is the `compute` of a `Formula` whose result spec is `spec`."""
    return lambda compute: Formula(compute, spec)


@dataclass(frozen=True)
class DerivedTensor:
    """A kernel tensor computed from whole canonical tensors of a rank: global-scale folds,
    activation-scale reductions, Marlin's rescaled block scales. It is arithmetic, not a move, so
    it has no inverse; `verify` recomputes it from the source and compares the bytes."""

    name: str
    inputs: tuple[str, ...]
    compute: Formula
    steps: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)

    def forward(self, canonical: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.compute(*(canonical[n] for n in self.inputs)).contiguous()

    def buffer_spec(self, specs: dict) -> tuple[DType, tuple[int, ...]]:
        """dtype (by name) and shape of the result, from the inputs' specs alone (`Formula.spec`)."""
        dtype, shape = self.compute.spec(*(specs[n] for n in self.inputs))
        return dtype_named(dtype), tuple(shape)

    def meta_spec(self, specs: dict) -> tuple[DType, tuple[int, ...]]:
        """`buffer_spec` the slow way, `compute` on meta tensors (tests/test_layout_shapes.py)."""
        meta = self.forward(
            {n: torch.empty(specs[n][1], dtype=torch_dtype(specs[n][0]), device="meta") for n in self.inputs}
        )
        return dtype_named(meta.dtype), tuple(meta.shape)

    def describe(self, specs: dict) -> dict:
        dtype, shape = self.buffer_spec(specs)
        return {
            "steps": list(self.steps),
            "dtype": str(dtype).removeprefix("torch."),
            "buffer_shape": list(shape),
            "view_shape": list(shape),
            "view_stride": list(contiguous_strides(shape)),
            "derived_from": list(self.inputs),
            "derived": True,
            **self.info,
        }


def expert_index(layout: TensorLayout, expert_shape: tuple[int, ...]) -> torch.Tensor:
    """Flat gather index of one expert: position in buffer → position in canonical, -1 = padding."""
    plan = gather_plan(layout, expert_shape)
    return torch.from_numpy(np.where(plan.forward == _numel(expert_shape), -1, plan.forward).astype(np.int64))


_PLAN_LOCKS: dict[tuple, threading.Lock] = {}
_PLAN_LOCKS_LOCK = threading.Lock()


def gather_plan(layout: TensorLayout, expert_shape: tuple[int, ...]) -> GatherPlan:
    """The cached plan; each built once under its own lock, so that the workers of a conversion,
    which all ask for it at their first chunk, do not each build it (time, and ~40 bytes per
    element of transient memory), while different plans can be built at the same time."""
    key = (layout.arrange, tuple(expert_shape))
    with _plan_lock(key):
        return _gather_plan(*key)


def ready_plan(layout: TensorLayout, expert_shape: tuple[int, ...]) -> GatherPlan | None:
    """`gather_plan`, or None while another thread is building that plan (never waits for it)."""
    key = (layout.arrange, tuple(expert_shape))
    lock = _plan_lock(key)
    if not lock.acquire(blocking=False):
        return None
    try:
        return _gather_plan(*key)
    finally:
        lock.release()


def _plan_lock(key: tuple) -> threading.Lock:
    with _PLAN_LOCKS_LOCK:
        return _PLAN_LOCKS.setdefault(key, threading.Lock())


@dataclass(frozen=True)
class DeviceIndex:
    """A plan's inverse and padding indices as torch tensors on one device (int32 where they fit:
    half the bytes the gather reads), for `inverse` off the host."""

    inverse: torch.Tensor
    pad: torch.Tensor | None


_DEVICE_INDEX: dict[tuple[int, str], _DeviceEntry] = {}
_DEVICE_INDEX_LOCK = threading.Lock()


def device_index(plan: GatherPlan, device: torch.device) -> DeviceIndex:
    """The cached `DeviceIndex` of `plan` on `device` (plans themselves are cached, so each is
    copied to a device once; a host "device" is allowed, for the tests of the portable path)."""
    key = (id(plan), str(device))
    with _DEVICE_INDEX_LOCK:
        found = _DEVICE_INDEX.get(key)
        if found is None or found.plan is not plan:
            dtype = torch.int32 if plan.inverse.size < 2**31 else torch.int64

            def put(a: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(a.astype(np.int64)).to(dtype).to(device)

            found = _DeviceEntry(plan, DeviceIndex(put(plan.inverse), put(plan.pad) if plan.pad.size else None))
            if device.type == "cuda":  # the copies are done before another thread's stream reads them
                torch.cuda.synchronize(device)
            _DEVICE_INDEX[key] = found
        return found.index


@dataclass(frozen=True)
class _DeviceEntry:
    plan: GatherPlan  # kept alive with its entry, so that `id(plan)` is never reused for another
    index: DeviceIndex


def prepare(layout: TensorLayout, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype) -> None:
    """Build (and cache) the plan `forward`/`inverse` will use for chunks of this shape, so that
    the plans of all tensors can be built in parallel before the first chunk. The split shape
    comes from `Split.split_shape` (the plan depends on shapes alone; `dtype` is not needed), so
    this imports numpy only, never torch."""
    gather_plan(layout, layout.split.split_shape(tuple(canonical_shape))[1:])  # shapes only: no torch


def prepare_all(tensors: dict[str, TensorLayout], specs: dict, jobs: int) -> None:
    """`prepare` every layout of `tensors` for its canonical spec in `specs`, on `jobs` threads."""
    from concurrent.futures import ThreadPoolExecutor

    work = [(layout, (1, *specs[name][1][1:]), specs[name][0]) for name, layout in tensors.items() if name in specs]
    if jobs <= 1 or len(work) <= 1:
        for item in work:
            prepare(*item)
        return
    with ThreadPoolExecutor(min(jobs, len(work))) as pool:
        list(pool.map(lambda item: prepare(*item), work))


@lru_cache(maxsize=32)
def _gather_plan(arrange: Arrange, expert_shape: tuple[int, ...]) -> GatherPlan:
    """Run the move on the positions `arange(n)` (fill -1; a numpy `Positions`, no torch): the
    result is the gather index of the move."""
    n = _numel(expert_shape)
    # int32 where it holds every position: half the bytes the arrange steps move
    dtype = np.int32 if n < 2**31 else np.int64
    # numpy positions, not a torch arange: the host path plans without importing torch (positions.py)
    positions = Positions(np.arange(n, dtype=dtype).reshape(1, *expert_shape))
    arranged: Positions = arrange(positions, -1)  # type: ignore[arg-type,assignment]  # stands in for a tensor
    index = arranged.flat().astype(np.intp)
    is_pad = index < 0
    padded = bool(is_pad.any())  # many moves do not pad: no mask, compress or where for them
    holds = ~is_pad if padded else None
    kept = np.flatnonzero(holds) if holds is not None else None  # buffer positions holding an element
    covered = index[holds] if holds is not None else index  # a mask compress: faster than index[kept]
    if covered.size != n or covered.min(initial=0) < 0 or covered.max(initial=-1) >= n:
        raise AssertionError("arrange step is not a permutation of its input plus padding")
    inverse = np.full(n, -1, dtype=np.intp)
    inverse[covered] = kept if kept is not None else np.arange(n, dtype=np.intp)
    if (inverse < 0).any():  # n positions in range fill all n slots only if distinct: a permutation
        raise AssertionError("arrange step is not a permutation of its input plus padding")
    forward = np.where(is_pad, n, index) if padded else index
    breaks = int(np.count_nonzero(np.diff(covered) != 1)) + 1
    pad = np.flatnonzero(is_pad) if padded else np.empty(0, dtype=np.intp)
    arranged_shape = tuple(arranged.shape[1:])
    del arranged, index, is_pad, holds, covered, kept  # freed before the strided and word searches' temporaries
    strided = _strided_move(forward, inverse, pad)
    # word indices only where the gather is what runs (a strided move never gathers)
    units = _units(forward, inverse, n) if strided is None else (1, None, None)
    return GatherPlan(
        forward, inverse, pad, arranged_shape, n / breaks, strided, *units, pad_strided=_pad_strided(strided, pad)
    )


def _pad_strided(strided: StridedMove | None, pad: np.ndarray) -> Strided | None:
    """The padding positions as one `Strided` (checked against `pad`), or None."""
    if strided is not None:
        return strided.pad  # found (and checked) with the move's own description
    found = _strided_of(pad)
    _check_describes(found, pad)
    return found


_INT_OF_SIZE = TorchDTypes(BITS_BY_SIZE)


def _as_int(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as an integer tensor of the same element width (bf16, fp8 included), on
    its device: the torch gather and the padding comparison then work for every dtype."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])


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
    if isinstance(x, ShapeOnly):  # the shape-only path (layouts/shapes.py)
        return x.padded(target)
    if isinstance(x, Positions):  # a plan being built (layouts/positions.py)
        return x.padded(target, fill)
    out = torch.full(target, fill, dtype=x.dtype, device=x.device)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


def chain(*moves: Arrange) -> Arrange:
    """Compose moves left to right into one (its gather index is the composed index)."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        for move in moves:
            x = move(x, fill)
        return x

    return arrange


def round_up(value: int, align: int) -> int:
    return -(-value // align) * align
