"""`on_mismatch: reconvert`: turn an artifact back into the canonical checkpoint tensors.

The canonical tensors are what vLLM's GPT-OSS weight loader puts into the checkpoint-shaped
parameters (gate/up rows interleaved, the rank's slice, zero-padded at the end of each dimension).
Every expert layout is a pure move plus an exact codec, so `TensorLayout.inverse` restores them bit
for bit (and refuses non-zero padding). They are then copied into the live layer's parameters, whose
padded sizes may differ (only zero padding is cropped or added), and vLLM's own conversion runs for
the live backend.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mxconvert.artifact.manifest import artifact_file
from mxconvert.artifact.parts import read_stored
from mxconvert.core.errors import MismatchError
from mxconvert.formats.registry import format_named
from mxconvert.runtimes.vllm.checks import FORMAT_CHECKS, artifact_format
from mxconvert.storage.safetensors_io import ShardReader


def canonical_tensors(root: Path, target: dict, rank_entry: dict, prefix: str) -> dict[str, torch.Tensor]:
    """The canonical tensors of one MoE layer of one rank, restored through the exact inverses."""
    name = artifact_format(target)
    row = FORMAT_CHECKS.get(name)
    if row is None or row.no_reconvert is not None:  # no exact inverse of the format's kernel tensors
        raise MismatchError(f"on_mismatch=reconvert supports MXFP4 (GPT-OSS) artifacts; this one is {name}")
    fmt = format_named(name)
    layout = fmt.layout_from_target(target)
    readers: dict[str, ShardReader] = {}

    def fetch(rel: str, key: str) -> torch.Tensor:  # whole tensors and parts of split ones
        if rel not in readers:
            readers[rel] = ShardReader(artifact_file(root, rel))
        return readers[rel].get(key)

    out = {}
    for name, tensor_layout in layout.tensors.items():
        key = f"{prefix}.{name}"
        info = rank_entry["tensors"][key]
        desc = info["layout"]
        stored = read_stored(info, key, fetch, where=f"{root}/")
        canonical_dtype = getattr(torch, desc["canonical_dtype"])
        out[name] = tensor_layout.inverse(stored, tuple(desc["canonical_shape"]), canonical_dtype)
    return out


def fill_parameter(param: torch.Tensor, canonical: torch.Tensor, what: str) -> None:
    """Copy `canonical` into the (zeroed) checkpoint-shaped `param`; sizes may differ by zero padding."""
    if param.dim() != canonical.dim() or param.shape[0] != canonical.shape[0] or param.dtype != canonical.dtype:
        raise MismatchError(
            f"{what}: the artifact holds {canonical.dtype} {list(canonical.shape)}, the live "
            f"layer {param.dtype} {list(param.shape)}; only padding may differ"
        )
    common = tuple(slice(0, min(a, b)) for a, b in zip(param.shape, canonical.shape))
    outside = canonical.clone()
    outside[common] = 0
    if outside.view(torch.uint8).any():
        raise MismatchError(
            f"{what}: the artifact holds values beyond the live layer's size "
            f"{list(param.shape)} (it was made for another model geometry or TP slice)"
        )
    with torch.no_grad():
        param.data.zero_()
        param.data[common] = canonical[common]
