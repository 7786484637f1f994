"""Where one MoE layer's kernel tensors live in an artifact, read when the runtime asks for them.

Both runtime loaders hand a layer's kernel tensors to the engine from here: the manifest entries of
the rank's tensors for the layer, placed on the engine's device with the recorded views
(artifact/loader.py `place_stored_tensor`), read ahead by the installer's `Prefetcher` when it set one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mxconvert.artifact.loader import place_stored_tensor
from mxconvert.artifact.manifest import artifact_file
from mxconvert.artifact.parts import expected_spec, stored_parts
from mxconvert.artifact.prefetch import Prefetcher, TensorRef
from mxconvert.storage.safetensors_io import ShardReader


class LayerSource:
    """Where one layer's kernel tensors live in the artifact; read only when vLLM asks for them."""

    def __init__(
        self,
        root: Path,
        rank_entry: dict,
        prefix: str,
        target: dict,
        names: tuple[str, ...],
        prefetch: Prefetcher | None = None,
    ):
        self.root = root
        self.prefetch = prefetch
        self.prefix = prefix
        self.target = target
        self.entries = {
            name: rank_entry["tensors"][f"{prefix}.{name}"]
            for name in names
            if f"{prefix}.{name}" in rank_entry["tensors"]
        }

    def read(
        self, device: torch.device, names: tuple[str, ...] | None = None, as_buffer: bool = False
    ) -> dict[str, torch.Tensor]:
        """The kernel tensors (the recorded views), or with `as_buffer` the dense buffers the views are
        taken of (what a runtime holds as the parameter when it makes the view itself)."""
        readers: dict[str, ShardReader] = {}
        out = {}

        def fetch(rel: str, key: str) -> torch.Tensor:  # whole tensors and parts of split ones
            if self.prefetch is not None:
                return self.prefetch.get((rel, key))
            if rel not in readers:
                readers[rel] = ShardReader(artifact_file(self.root, rel))
            return readers[rel].get(key)

        for name, info in self.entries.items():
            if names is not None and name not in names:
                continue
            if as_buffer:
                shape = list(info["layout"]["buffer_shape"])
                info = {
                    **info,
                    "layout": {**info["layout"], "view_shape": shape, "view_stride": _contiguous_strides(shape)},
                }
            out[name] = place_stored_tensor(info, f"{self.prefix}.{name}", fetch, device, self.root)
        return out

    def refs(self) -> list[tuple[TensorRef, int]]:
        """The (file, key) of every stored piece `read` takes, in its order, with its size in bytes."""
        out = []
        for name, info in self.entries.items():
            size = _stored_bytes(info)
            parts = stored_parts(info)
            rows = sum(p.stop - p.start for p in parts) or 1
            out += [((p.file, p.key or f"{self.prefix}.{name}"), size * (p.stop - p.start) // rows) for p in parts]
        return out


def _stored_bytes(info: dict) -> int:
    """Bytes of the stored buffer the manifest records (a prefetch budget's measure, nothing more)."""
    dtype_name, shape = expected_spec(info)
    dtype = getattr(torch, dtype_name, torch.uint8)
    return math.prod(int(size) for size in shape) * torch.empty(0, dtype=dtype).element_size()


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]
