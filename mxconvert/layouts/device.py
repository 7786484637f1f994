"""Where the layouts of `convert` and `verify` run: the host (default) or a torch device.

One mechanism for every backend: a chunk's canonical tensor is read on the host as always, copied
to the device, laid out (or inverted) there by the same layout code on its portable path (torch
ops alone: the arrange functions, the codecs' torch forms, `index_select` with the cached gather
plan for inverses), and the result is copied back before it is hashed and written. The bytes are
the same as on the host (tests/test_device.py runs the portable path on the host;
tools/gpu_check/device_convert_check.py compares CUDA with the host for every backend), so the
device is not recorded in the artifact.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import torch

from ..dtypes import DType
from ..errors import InputError
from .base import DerivedTensor, TensorLayout

T = TypeVar("T")


@dataclass(frozen=True)
class Compute:
    """A device and whether layouts run on their portable path there (always, off the host)."""

    device: torch.device
    portable: bool

    @property
    def engine(self) -> str:
        return "torch" if self.portable else "auto"

    @property
    def on_host(self) -> bool:
        return self.device.type == "cpu"

    def put(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` on this device (no copy where it is there already)."""
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def forward(self, layout: TensorLayout, canonical: torch.Tensor) -> torch.Tensor:
        """The kernel buffer of one chunk, on the host (ready to hash and write)."""
        with self.stream():
            return layout.forward(self.put(canonical), self.engine).cpu()

    def derive(self, derived: DerivedTensor, canonical: dict[str, torch.Tensor]) -> torch.Tensor:
        """A derived kernel tensor (NVFP4 scale arithmetic), computed on this device, on the host."""
        with self.stream():
            return derived.forward({name: self.put(t) for name, t in canonical.items()}).cpu()

    def inverse(self, layout: TensorLayout, buffer: torch.Tensor, canonical_shape: tuple[int, ...],
                canonical_dtype: DType | torch.dtype) -> torch.Tensor:
        """The canonical tensor of a stored chunk, on this device (compare it there)."""
        return layout.inverse(self.put(buffer), canonical_shape, canonical_dtype, self.engine)

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


HOST = Compute(torch.device("cpu"), portable=False)

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


def compute_for(device: str | Compute | None) -> Compute:
    """The `Compute` for a `--device` value: "cpu" (the default: numpy fast paths on the host) or
    "cuda" / "cuda:N". A CUDA device this process cannot use is refused (exit 2) before anything
    is read or written, never silently replaced by the host."""
    if isinstance(device, Compute):
        return device
    name = (device or "cpu").strip().lower()
    if name == "cpu":
        return HOST
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise InputError(f"--device {device!r}: expected cpu (the default) or cuda / cuda:N")
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "torch sees no CUDA device (driver missing, or CUDA_VISIBLE_DEVICES empty)")
        raise InputError(f"--device {device}: {why} (torch {torch.__version__}); run without --device "
                         "(the CPU gives the same bytes) or on a machine with a GPU")
    index = int(name[5:]) if ":" in name else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise InputError(f"--device {device}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return Compute(torch.device("cuda", index), portable=True)
