"""Kernel tensors computed from whole canonical tensors (NVFP4 scale arithmetic), and the check of
the values they give.

A `DerivedTensor` is arithmetic, not a move (`TensorLayout`, base.py): it has no inverse, and
`verify` recomputes it from the source and compares the bytes. Its `Formula` declares the dtype
and shape it gives, so planning computes them from the specs alone. The formulas themselves are
in nvfp4_scales.py.

The values are checked where they are computed (`DerivedTensor.forward`), so `convert` never
writes, and `verify` never accepts, a value the kernel cannot use: the scales a checkpoint holds
are each checked finite and positive when read (formats/nvfp4/checkpoint.py), but their products
and reciprocals (folded global scales, alphas, TRTLLM's `g1_scale_c`, Marlin's `w * 2^119`) can
still overflow to inf or underflow to zero or to a subnormal, which the kernels flush to zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import DType, dtype_named, torch_dtype
from mxconvert.core.errors import InputError
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
    #: The kernel multiplies or divides by these values (every NVFP4 scale, alpha and
    #: `g1_scale_c`): each must be a positive normal float, not only a finite one.
    scale: bool = True
    #: The backend whose kernel reads the tensor, named in a refusal (registry.nvfp4_layout sets it).
    kernel: str = ""

    def forward(self, canonical: dict[str, torch.Tensor], where: str = "") -> torch.Tensor:
        """The tensor, computed from `canonical` (at least its `inputs`); refused with an
        `InputError` (prefixed with `where`, e.g. the checkpoint and layer) where a value is one
        the kernel cannot use (`check_values`)."""
        out = self.compute(*(canonical[n] for n in self.inputs)).contiguous()
        self.check_values(out, canonical, where)
        return out

    def check_values(self, out: torch.Tensor, canonical: dict[str, torch.Tensor], where: str = "") -> None:
        """Every value of `out` must be finite, and where the tensor is a `scale`, positive and
        normal (at least the dtype's smallest normal: a subnormal is flushed to zero by the
        kernels). IEEE float results only: a meta tensor has no values, and Marlin's block
        scales are an S0E5M3 bit encoding labelled float8_e4m3fn (docs/layouts.md, "MARLIN"),
        not float8 values. Raises `InputError` naming the first bad value and the range of each
        input it was computed from."""
        if out.device.type == "meta" or out.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return
        usable = torch.isfinite(out)
        if self.scale:
            usable &= out >= torch.finfo(out.dtype).tiny
        if bool(usable.all()):
            return
        index = tuple(int(i) for i in torch.nonzero(~usable)[0])
        value = float(out[index])
        sources = ", ".join(_value_range(n, canonical[n]) for n in self.inputs)
        need = "a finite, positive, normal" if self.scale else "a finite"
        kernel = f" for {self.kernel}" if self.kernel else ""
        steps = f" as {'; '.join(self.steps)}" if self.steps else ""
        raise InputError(
            f"{where + ': ' if where else ''}{self.name}{list(index)} = {value:.6g}{kernel}, computed{steps} "
            f"from {sources}: the kernel reads {need} {str(out.dtype).removeprefix('torch.')} there; "
            "the checkpoint's scales are out of the range the kernel can use (fix or recalibrate them)"
        )

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


def _value_range(name: str, t: torch.Tensor) -> str:
    """`name = v` where every value of `t` is v, else `name in [min, max]` (as float32)."""
    if t.numel() == 0:
        return f"{name} (empty)"
    values = t.float()
    low, high = float(values.min()), float(values.max())
    return f"{name} = {low:.6g}" if low == high else f"{name} in [{low:.6g}, {high:.6g}]"
