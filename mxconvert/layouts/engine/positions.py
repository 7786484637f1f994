"""A layout's move run on element positions with numpy, so that building its gather plan needs no torch.

A move (`arrange`, layouts/base.py) only moves elements and pads, so run on the positions `0..n-1` of one
expert (fill -1) it gives the gather index of the whole move (`plans._gather_plan`). That used to
run on a torch `arange`; importing torch costs seconds on a host that otherwise converts with
numpy alone. `Positions` holds an integer numpy array and implements the same subset of torch's
tensor methods as `ShapeOnly` (shapes.py), with torch's semantics: every result holds the
elements in the row-major logical order torch gives (numpy's reshape / transpose / flip keep the
same logical order). The shape arithmetic, and with it the refusals (torch's exception types and
messages), is `ShapeOnly`'s; numpy only moves the positions.

`view` is `reshape`, as in `ShapeOnly`: torch would refuse a `view` of a non-viewable stride
pattern, which the portable path (the same move run on torch tensors) still shows.
tests/test_positions.py proves that the plan built with `Positions` equals the plan built by
running the same move on a torch `arange`, for every registered layout.

This module imports numpy when a `Positions` is first made, never torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mxconvert.layouts.engine.shapes import ShapeOnly

if TYPE_CHECKING:
    import numpy as np
else:  # planning (`select`) imports the layouts but never makes a Positions (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


def _dims(args: tuple) -> tuple:
    """torch's two spellings: `f(a, b, c)` and `f((a, b, c))`."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


class Positions:
    """A stand-in for an integer tensor: the tensor-method subset the moves use (that of
    `ShapeOnly`), on a numpy array of element positions."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __repr__(self) -> str:
        return f"Positions(shape={list(self.shape)}, dtype={self.array.dtype})"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def _shape_only(self) -> ShapeOnly:
        return ShapeOnly(self.array.shape)

    def dim(self) -> int:
        return self.array.ndim

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def numel(self) -> int:
        return int(self.array.size)

    def size(self, dim: int | None = None):
        return self._shape_only().size(dim)

    def reshape(self, *shape) -> Positions:
        target = self._shape_only().reshape(*shape).shape  # -1 inferred, torch's refusals
        return Positions(self.array.reshape(target))

    view = reshape

    def permute(self, *dims) -> Positions:
        self._shape_only().permute(*dims)  # torch's refusals
        return Positions(self.array.transpose(_dims(dims)))

    def transpose(self, a: int, b: int) -> Positions:
        self._shape_only().transpose(a, b)
        return Positions(self.array.swapaxes(a, b))

    @property
    def mT(self) -> Positions:  # noqa: N802 (torch's name)
        return self.transpose(-2, -1)

    def flip(self, *dims) -> Positions:
        axes = _dims(dims)
        self._shape_only().flip(axes)
        return Positions(np.flip(self.array, axis=tuple(axes)))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Positions:
        return Positions(self.array.reshape(self._shape_only().flatten(start_dim, end_dim).shape))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Positions:
        return Positions(self.array.reshape(self._shape_only().unflatten(dim, sizes).shape))

    def contiguous(self) -> Positions:
        return Positions(np.ascontiguousarray(self.array))

    def clone(self) -> Positions:
        return Positions(self.array.copy())

    def padded(self, target: Sequence[int], fill: int) -> Positions:
        """The positions padded at the end of each dim to `target` with `fill` (base.pad_dims)."""
        out = np.full(tuple(target), fill, dtype=self.array.dtype)
        out[tuple(slice(0, s) for s in self.array.shape)] = self.array
        return Positions(out)

    def flat(self) -> np.ndarray:
        """The positions in row-major order (one copy where the array is a strided view)."""
        return self.array.reshape(-1)
