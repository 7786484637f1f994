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

This module is what a layout author writes with: `TensorLayout`, the views, and the helpers the
backend files compose their moves from (`chain`, `pad_dims`, `round_up`; primitives.py holds the
moves several layouts share). The codecs and splits are in codecs.py, the derived (arithmetic)
tensors in derived.py. How a move runs (gather plans, strided copies, their caches and locks, the
indices kept on a device) is the engine's, in layouts/engine/, which knows nothing of this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from mxconvert.core.arith import round_up as round_up  # the layout author's name for it (core/arith.py)
from mxconvert.core.bits import from_torch, to_torch
from mxconvert.core.dtypes import DType, dtype_named, torch_dtype
from mxconvert.layouts.codecs import BYTES, IDENTITY, Codec, Split
from mxconvert.layouts.engine.moves import as_int, gather_forward, scatter, strided_forward, wrong_padding
from mxconvert.layouts.engine.plans import GatherPlan, device_index, gather_plan, ready_plan
from mxconvert.layouts.engine.positions import Positions
from mxconvert.layouts.engine.shapes import ShapeOnly
from mxconvert.layouts.errors import PaddingError

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a layout first runs on data: planning only builds layouts (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch

Arrange = Callable[["torch.Tensor", int], "torch.Tensor"]
ViewFn = Callable[[tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


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
class HostMove(Protocol):
    """A move and codec fused for the host (numpy alone, no gather plan): what `forward_bits` /
    `inverse_bits` run on their default engine where a layout has one (layouts/hopper_host.py).
    It must give the bytes of the move and codec themselves (tests/test_hs_speed_paths.py)."""

    def forward(self, elements: np.ndarray, fill: int) -> np.ndarray:
        """The encoded buffer `[E, ...]` of the split canonical elements `[E, ...]`."""
        ...

    def inverse(self, buffer: np.ndarray, element_shape: tuple[int, ...], fill: int) -> tuple[np.ndarray, int | None]:
        """The split canonical elements of `element_shape`, and the first expert whose padding
        does not hold `fill` (None: all do)."""
        ...


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
    #: The move and codec fused for the host, where the layout has one: the default host engine
    #: then runs it instead of the gather plan, which is then never built for the host.
    host: HostMove | None = None

    @property
    def needs_plan(self) -> bool:
        """Whether the host's default engine runs a gather plan (convert and verify build the
        plans beside their first chunks: layouts/engine/plans.py `prepare_all`)."""
        return self.host is None

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
        that bounds the conversion there, could start: bench/CHANGELOG.md, "Session 7")."""
        elements = self.split.split_bits(canonical)
        if self.host is not None and engine in ("auto", "eager"):
            out = self.host.forward(elements, self.pad_value)
            return out, self.codec.encoded_spec(dtype, out.shape)[0]
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
                out = strided_forward(src, plan, self.pad_value)
            else:
                out = gather_forward(src, plan, self.pad_value)
            arranged = out.reshape(experts, *plan.arranged_shape)
        out_dtype, _ = self.codec.encoded_spec(dtype, arranged.shape)
        return self.codec.encode_bits(arranged, dtype), out_dtype

    def buffer_spec(
        self, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype
    ) -> tuple[DType, tuple[int, ...]]:
        """dtype and shape of the buffer for a canonical tensor of this shape, from the shapes
        alone: the move run on a `ShapeOnly` (layouts/engine/shapes.py), then the codec's declared spec.
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
        if self.host is not None and engine in ("auto", "arrange"):
            elements, expert = self.host.inverse(buffer, tuple(element_shape), self.pad_value)
            if expert is not None:
                self._refuse_padding(expert)
            return self.split.join_bits(elements)
        plan = gather_plan(self, tuple(element_shape[1:]))
        arranged = self.codec.decode_bits(np.ascontiguousarray(buffer), canonical_dtype)
        flat = np.ascontiguousarray(arranged).reshape(experts, plan.forward.size)
        chosen = plan.engine if engine in ("auto", "arrange") else engine
        out = self._scatter_numpy(flat, plan, strided=chosen == "strided" and plan.strided is not None)
        return self.split.join_bits(out.reshape(element_shape))

    def _scatter_numpy(self, flat: np.ndarray, plan: GatherPlan, strided: bool = False) -> np.ndarray:
        expert = wrong_padding(flat, plan, self.pad_value)
        if expert is not None:
            self._refuse_padding(expert)
        return scatter(flat, plan, strided)

    def _scatter_torch(self, arranged: torch.Tensor, plan: GatherPlan) -> torch.Tensor:
        index = device_index(plan, arranged.device)
        flat = as_int(arranged)
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
    if isinstance(x, ShapeOnly):  # the shape-only path (layouts/engine/shapes.py)
        return x.padded(target)
    if isinstance(x, Positions):  # a plan being built (layouts/engine/positions.py)
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
