"""Where the layouts of `convert` and `verify` run: the host (default) or a torch device.

The data of both commands travel as host numpy arrays of their bits (mxconvert/bits.py): read
from the source, laid out, hashed and written. `HOST` runs the layouts on those arrays with numpy
alone (no torch). A `Compute` on a torch device copies a chunk's canonical bits to the device,
lays them out (or inverts them) there with the same layout code on its portable path (torch ops
alone: the arrange functions, the codecs' torch forms, `index_select` with the cached gather plan
for inverses), and copies the result back before it is hashed and written. The bytes are the
same as on the host (tests/test_device.py runs the portable path on the host;
tools/gpu_check/device_convert_check.py compares CUDA with the host for every backend), so the
device is not recorded in the artifact.

This module runs layouts (it calls `TensorLayout`'s and `DerivedTensor`'s methods), so it sits
beside them, above the move engine (layouts/engine/, which knows no layout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from mxconvert.core.bits import dtype_of, from_torch, to_torch
from mxconvert.core.dtypes import DType
from mxconvert.core.errors import InputError
from mxconvert.layouts.base import TensorLayout
from mxconvert.layouts.derived import DerivedTensor
from mxconvert.layouts.registry import ExpertLayout

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported where a device is named (mxconvert/lazy_import.py): the host path needs none
    from mxconvert.core.lazy_import import torch

T = TypeVar("T")


def derive_bits(
    derived: DerivedTensor,
    canonical: dict[str, np.ndarray],
    dtypes: dict[str, DType],
    device: Any = None,
    where: str = "",
) -> tuple[np.ndarray, DType]:
    """A derived kernel tensor (NVFP4 scale arithmetic: values, so torch computes it) from the
    bits of its inputs, on `device` (default: the host); the result's bits on the host. A value
    the kernel cannot use is refused (`DerivedTensor.check_values`; `where` names the layer)."""
    inputs = {name: to_torch(bits, dtypes[name]) for name, bits in canonical.items()}
    if device is not None:
        inputs = {name: t.to(device) for name, t in inputs.items()}
    out = derived.forward(inputs, where).cpu()
    return from_torch(out), dtype_of(out)


@dataclass(frozen=True)
class HostCompute:
    """The host: layouts on numpy bit arrays, numpy alone (the default; no torch).

    `eager`: a chunk does not wait for a layout plan another thread is building; it runs the move
    itself meanwhile (`TensorLayout.forward_bits`, engine "eager"; the same bytes, more work)."""

    eager: bool = False
    on_host: ClassVar[bool] = True

    def put(self, bits: np.ndarray, dtype: DType) -> np.ndarray:
        """The array compared on this device: the bits themselves."""
        return bits

    def forward(self, layout: TensorLayout, bits: np.ndarray, dtype: DType) -> tuple[np.ndarray, DType]:
        """The kernel buffer of one chunk (bits and dtype), ready to hash and write."""
        return layout.forward_bits(bits, dtype, "eager" if self.eager else "auto")

    def derive(
        self, derived: DerivedTensor, canonical: dict[str, np.ndarray], dtypes: dict[str, DType], where: str = ""
    ) -> tuple[np.ndarray, DType]:
        """A derived kernel tensor's bits and dtype (`derive_bits`)."""
        return derive_bits(derived, canonical, dtypes, where=where)

    def inverse(
        self, layout: TensorLayout, buffer: np.ndarray, canonical_shape: tuple[int, ...], canonical_dtype: DType
    ) -> np.ndarray:
        """The canonical bits of a stored chunk (compare them with `put`'s)."""
        return layout.inverse_bits(buffer, canonical_shape, canonical_dtype)

    def run(self, fn: Callable[..., T], *args) -> T:
        return fn(*args)

    def uses_torch(self, loads_without_torch: bool, layout: ExpertLayout, specs: dict) -> bool:
        """Whether a conversion or verification here runs torch ops: where the format's loader
        or the layout needs them (NVFP4, Marlin's codecs, derived tensors); GPT-OSS runs none."""
        return not loads_without_torch or layout.uses_torch(specs)


@dataclass(frozen=True)
class Compute:
    """A torch device, where layouts run on their portable path (CUDA; the host, for tests)."""

    device: torch.device

    @property
    def on_host(self) -> bool:
        return self.device.type == "cpu"

    def put(self, bits: np.ndarray, dtype: DType) -> torch.Tensor:
        """The tensor of `dtype` over `bits`, on this device."""
        return to_torch(bits, dtype).to(self.device)

    def forward(self, layout: TensorLayout, bits: np.ndarray, dtype: DType) -> tuple[np.ndarray, DType]:
        """The kernel buffer of one chunk, back on the host (bits and dtype)."""
        with self.stream():
            out = layout.forward(self.put(bits, dtype), "torch").cpu()
        return from_torch(out), dtype_of(out)

    def derive(
        self, derived: DerivedTensor, canonical: dict[str, np.ndarray], dtypes: dict[str, DType], where: str = ""
    ) -> tuple[np.ndarray, DType]:
        with self.stream():
            return derive_bits(derived, canonical, dtypes, self.device, where)

    def inverse(
        self, layout: TensorLayout, buffer: np.ndarray, canonical_shape: tuple[int, ...], canonical_dtype: DType
    ) -> torch.Tensor:
        """The canonical tensor of a stored chunk, on this device (compare it there)."""
        stored, _ = layout.buffer_spec(canonical_shape, canonical_dtype)
        return layout.inverse(self.put(buffer, stored), canonical_shape, canonical_dtype, "torch")

    def uses_torch(self, loads_without_torch: bool, layout: ExpertLayout, specs: dict) -> bool:
        return True  # every layout runs as torch ops on the device

    def run(self, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` with this thread's stream current (see `stream`)."""
        with self.stream():
            return fn(*args)

    def stream(self):
        """On CUDA, each worker thread queues its copies and kernels on a stream of its own, so
        that the chunks of several workers overlap (the default stream would serialize them);
        `.cpu()` and comparisons wait for the thread's own stream only. Elsewhere: nothing."""
        if self.device.type != "cuda":
            return nullcontext()
        return _thread_stream(self.device)


HOST = HostCompute()
#: Where a conversion or a verification runs its layouts.
AnyCompute = HostCompute | Compute

_STREAMS = threading.local()


@contextmanager
def _thread_stream(device: torch.device) -> Iterator[None]:
    streams = getattr(_STREAMS, "by_device", None)
    if streams is None:
        streams = _STREAMS.by_device = {}
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        yield


def compute_for(device: str | AnyCompute | None) -> AnyCompute:
    """The `Compute` for a `--device` value: "cpu" (the default: numpy fast paths on the host) or
    "cuda" / "cuda:N". A CUDA device this process cannot use is refused (exit 2) before anything
    is read or written, never silently replaced by the host."""
    if isinstance(device, (Compute, HostCompute)):
        return device
    name = (device or "cpu").strip().lower()
    if name == "cpu":
        return HOST
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise InputError(f"--device {device!r}: expected cpu (the default) or cuda / cuda:N")
    if not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA"
            if torch.version.cuda is None
            else "torch sees no CUDA device (driver missing, or CUDA_VISIBLE_DEVICES empty)"
        )
        raise InputError(
            f"--device {device}: {why} (torch {torch.__version__}); run without --device "
            "(the CPU gives the same bytes) or on a machine with a GPU"
        )
    index = int(name[5:]) if ":" in name else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise InputError(f"--device {device}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return Compute(torch.device("cuda", index))
