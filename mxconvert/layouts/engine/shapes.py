"""The shape-only path of the layouts: a move evaluated on a shape, without torch.

A layout's move (`arrange`, layouts/base.py) is written with reshape / permute / transpose / flip / pad
on a `[E, ...]` tensor. Run on a `ShapeOnly`, which carries a shape and does the arithmetic of
those operations (and refuses what torch refuses, with torch's message), the same function gives
the shape of the arranged buffer; the codec and the split declare what they do to the shape and
dtype (`Codec.encoded_spec`, `Split.split_shape`), and the arithmetic of a derived tensor declares
its result (`Formula.spec`, with `broadcast_shapes` below). `TensorLayout.buffer_spec` and
`DerivedTensor.buffer_spec` use this path, so planning (`select`, `convert --dry-run`, the plan of
`convert`) runs no tensor operation at all, and does not import torch.
tests/test_layout_shapes.py proves it gives the meta-tensor answer for every registered layout.

This module imports nothing heavy (no torch, no numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class ShapeOnly:
    """A stand-in for a tensor that only has a shape: the subset of torch's tensor methods that
    the moves use, each computing the resulting shape as torch does."""

    __slots__ = ("shape",)

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(int(d) for d in shape)

    def __repr__(self) -> str:
        return f"ShapeOnly({list(self.shape)})"

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[self._dim(dim)]

    def _dim(self, dim: int) -> int:
        n = len(self.shape)
        if not -n <= dim < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
        return dim % n

    def reshape(self, *shape) -> ShapeOnly:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        dims = [int(d) for d in shape]
        numel = self.numel()
        if dims.count(-1) > 1:
            raise RuntimeError("only one dimension can be inferred")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or numel % known:
                raise RuntimeError(f"shape '{_fmt(dims)}' is invalid for input of size {numel}")
            dims[dims.index(-1)] = numel // known
        elif math.prod(dims) != numel:
            raise RuntimeError(f"shape '{_fmt(dims)}' is invalid for input of size {numel}")
        if any(d < 0 for d in dims):
            raise RuntimeError(f"invalid shape dimension {min(dims)}")
        return ShapeOnly(dims)

    view = reshape

    def permute(self, *dims) -> ShapeOnly:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if len(dims) != len(self.shape):
            raise RuntimeError(
                f"permute(sparse_coo): number of dimensions in the tensor input does not match the "
                f"length of the desired ordering of dimensions i.e. input.dim() = {len(self.shape)} "
                f"is not equal to len(dims) = {len(dims)}"
            )
        order = [self._dim(d) for d in dims]
        if len(set(order)) != len(order):
            raise RuntimeError("permute(): duplicate dims are not allowed.")
        return ShapeOnly([self.shape[d] for d in order])

    def transpose(self, a: int, b: int) -> ShapeOnly:
        shape = list(self.shape)
        i, j = self._dim(a), self._dim(b)
        shape[i], shape[j] = shape[j], shape[i]
        return ShapeOnly(shape)

    @property
    def mT(self) -> ShapeOnly:  # noqa: N802 (torch's name)
        return self.transpose(-2, -1)

    def flip(self, *dims) -> ShapeOnly:
        for d in dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims:
            self._dim(d)
        return self

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> ShapeOnly:
        if not self.shape:
            return ShapeOnly((1,))
        s, e = self._dim(start_dim), self._dim(end_dim)
        return ShapeOnly((*self.shape[:s], math.prod(self.shape[s : e + 1]), *self.shape[e + 1 :]))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> ShapeOnly:
        d = self._dim(dim)
        part = ShapeOnly((self.shape[d],)).reshape(tuple(sizes)).shape
        return ShapeOnly((*self.shape[:d], *part, *self.shape[d + 1 :]))

    def contiguous(self) -> ShapeOnly:
        return self

    def clone(self) -> ShapeOnly:
        return self

    def padded(self, target: Sequence[int]) -> ShapeOnly:
        """The tensor zero-padded at the end of its dims to `target` (base.pad_dims)."""
        return ShapeOnly(target)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The shape of an element-wise operation on tensors of these shapes (torch's broadcasting:
    aligned at the last dimension, each pair equal or one of them 1); a RuntimeError otherwise."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, d in enumerate(shape, start=ndim - len(shape)):
            if d != out[i] and 1 not in (d, out[i]):
                raise RuntimeError(
                    f"The size of tensor a ({out[i]}) must match the size of tensor b ({d}) "
                    f"at non-singleton dimension {i}"
                )
            out[i] = d if out[i] == 1 else out[i]
    return tuple(out)


def _fmt(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
