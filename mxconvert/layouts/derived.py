"""Kernel tensors computed from whole canonical tensors (NVFP4 scale arithmetic).

A `DerivedTensor` is arithmetic, not a move (`TensorLayout`, base.py): it has no inverse, and
`verify` recomputes it from the source and compares the bytes. Its `Formula` declares the dtype
and shape it gives, so planning computes them from the specs alone. The formulas themselves are
in nvfp4_scales.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import DType, dtype_named, torch_dtype
from mxconvert.layouts.base import contiguous_strides

if TYPE_CHECKING:
    import torch
else:  # imported when a derived tensor is computed: planning only reads the formulas' specs
    from mxconvert.core.lazy_import import torch

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
