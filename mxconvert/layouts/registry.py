"""One table of layouts, keyed by (format, backend).

Each backend file registers a builder for the backends it lays out, for either checkpoint format
(`@register("nvfp4", Nvfp4Backend.FLASHINFER_TRTLLM)`). A builder reads everything it depends on
from a `LayoutTarget` (backend, runtime revision, device, sizes) and returns an `ExpertLayout`.
The format is part of the key because the two backend enums share names ("MARLIN").
See docs/architecture.md, "Layouts".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import DType, dtype_named
from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts.base import TensorLayout
from mxconvert.layouts.derived import DerivedTensor
from mxconvert.target.backends import LAID_OUT
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision
from mxconvert.target.sglang_revisions import unproven_layout_reason

if TYPE_CHECKING:
    import torch

#: dtype (by name, mxconvert/dtypes.py) and shape of each canonical tensor.
Specs = dict[str, tuple[DType, tuple[int, ...]]]


@dataclass(frozen=True)
class ExpertLayout:
    """The layouts of the expert tensors of one MoE layer for one target."""

    backend: Enum
    revision: str
    kind: str
    tensors: dict[str, TensorLayout]
    params: dict = field(default_factory=dict)
    #: Kernel tensors computed from several canonical tensors (NVFP4 scales); empty for MXFP4.
    derived: dict[str, DerivedTensor] = field(default_factory=dict)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return (*self.tensors, *self.derived)

    def forward(self, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: self.tensors[name].forward(t) for name, t in canonical.items()}

    def describe(self) -> dict:
        return {"backend": self.backend.value, "revision": self.revision, "kind": self.kind, **self.params}

    def uses_torch(self, specs: Specs) -> bool:
        """Whether laying out (or inverting) these tensors on the host runs any torch op: a
        derived tensor (value arithmetic) or a codec without a numpy form. Otherwise the host
        path is numpy alone and does not import torch (mxconvert/bits.py)."""
        return bool(self.derived) or any(
            not layout.codec.numpy_form(dtype_named(specs[name][0]))
            for name, layout in self.tensors.items()
            if name in specs
        )

    def describe_tensor(self, name: str, specs: Specs) -> dict:
        if name in self.derived:
            return self.derived[name].describe(specs)
        dtype, shape = specs[name]
        return self.tensors[name].describe(shape, dtype)

    def buffer_spec(self, name: str, specs: Specs) -> tuple[DType, tuple[int, ...]]:
        if name in self.derived:
            return self.derived[name].buffer_spec(specs)
        dtype, shape = specs[name]
        return self.tensors[name].buffer_spec(shape, dtype)


@dataclass(frozen=True)
class LayoutTarget:
    """Everything a layout may depend on. MXFP4 layouts read the device and TP size (Triton) and
    Marlin's activation dtype; NVFP4 layouts read the canonical sizes of one rank (hidden K,
    intermediate N, local experts), since they pad and reduce scales themselves."""

    backend: Enum
    revision: RuntimeRevision
    profile: DeviceProfile | None = None
    #: vLLM's tensor-parallel group size (the attention TP size, `Deployment.attention_tp`), which
    #: is what vLLM decides the Triton gfx950 scale swizzle by; not the MoE's TP slicing.
    tp: int = 1
    marlin_input_dtype: str | None = None
    hidden: int = 0
    intermediate: int = 0
    num_local_experts: int = 0
    #: is_act_and_mul: w13 holds two halves (gate and up). Every model mxconvert reads is gated.
    gated: bool = True


Builder = Callable[[LayoutTarget], ExpertLayout]

_BUILDERS: dict[tuple[str, Enum], Builder] = {}


def register(fmt: str, *backends: Enum) -> Callable[[Builder], Builder]:
    """Decorator: `builder` lays out `backends` of checkpoint format `fmt`, each of which
    target/backends.py `LAID_OUT` must list (the table `mxconvert backends` reads)."""

    def add(builder: Builder) -> Builder:
        for backend in backends:
            key = (fmt, backend)
            if backend not in LAID_OUT.get(fmt, ()):
                raise AssertionError(f"{fmt} {backend.value} has a layout but is not in target/backends.py LAID_OUT")
            if key in _BUILDERS:
                raise AssertionError(f"two layouts registered for {fmt} {backend.value}")
            _BUILDERS[key] = builder
        return builder

    return add


def supported_backends(fmt: str) -> frozenset[Enum]:
    """The backends of `fmt` that have a layout."""
    return frozenset(backend for (f, backend) in _BUILDERS if f == fmt)


def build_layout(fmt: str, target: LayoutTarget) -> ExpertLayout:
    """The layout vLLM (`target.revision`) produces for `target.backend` on `target.profile`."""
    unproven = unproven_layout_reason(target.revision, fmt, target.backend.value)
    if unproven is not None:
        raise UnsupportedError(
            f"{target.backend.value} under {target.revision.name}: its bytes are not proven yet ({unproven}), "
            "so mxconvert does not write them; choose another backend (--backend) or runtime revision"
        )
    builder = _BUILDERS.get((fmt, target.backend))
    if builder is None:
        able = ", ".join(sorted(b.value for b in supported_backends(fmt)))
        raise UnsupportedError(
            f"{fmt.upper()} backend {target.backend.value} is not laid out by this version of mxconvert yet; "
            f"supported: {able}"
        )
    return builder(target)


def nvfp4_layout(
    target: LayoutTarget, tensors: dict[str, TensorLayout], derived: dict[str, DerivedTensor], params: dict
) -> ExpertLayout:
    """An NVFP4 `ExpertLayout` (kind "nvfp4"; the manifest records the local expert count last).
    Its derived tensors name the backend whose kernel reads them, for their value checks."""
    return ExpertLayout(
        target.backend,
        target.revision.name,
        "nvfp4",
        tensors,
        {**params, "num_local_experts": target.num_local_experts},
        {name: replace(d, kernel=str(target.backend.value)) for name, d in derived.items()},
    )
