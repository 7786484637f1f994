"""How `inspect` describes its inputs: a checkpoint (per format) or an artifact, in one vocabulary
keyed by the runtime parameter names (`model.layers.L.mlp.experts.w13_weight`, ...), so that any
two can be diffed (mxconvert/pipeline/inspect_diff.py).

Describing reads headers and manifests only, so it does not import torch (seconds on a GPU host,
bench/CHANGELOG.md "Session 6"); reading a described tensor's bytes (`load_tensor`) imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file, read_manifest
from mxconvert.artifact.parts import read_stored, stored_files
from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4.checkpoint import EXPERT_TENSORS, Checkpoint, expert_tensor_name
from mxconvert.formats.registry import open_model
from mxconvert.layouts.base import contiguous_strides
from mxconvert.pipeline.plan import serve_command
from mxconvert.storage.safetensors_io import ShardReader

if TYPE_CHECKING:
    import torch

_RUNTIME_NAME = {
    "gate_up_proj_blocks": "w13_weight",
    "gate_up_proj_scales": "w13_weight_scale",
    "gate_up_proj_bias": "w13_bias",
    "down_proj_blocks": "w2_weight",
    "down_proj_scales": "w2_weight_scale",
    "down_proj_bias": "w2_bias",
}
CHECKPOINT_ROW_ORDER = "gate/up interleaved (g0,u0,g1,u1,...)"


@dataclass
class Description:
    """What `inspect` shows for one input."""

    kind: str  # checkpoint | artifact
    path: str
    summary: dict
    target: dict
    tensors: dict[str, dict] = field(default_factory=dict)
    files: list[dict] = field(default_factory=list)
    _data: Any = None  # Checkpoint or artifact root (a path), for byte comparisons
    #: Non-expert tensors (name -> dtype, shape), copied files (name -> sha256) and the source
    #: (identity without the local path, layout, file hashes where recorded): what `diff` compares
    #: besides the expert tensors.
    others: dict[str, dict] = field(default_factory=dict)
    copied: dict[str, str] = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    _other_reader: Callable[[str], torch.Tensor] | None = None  # name -> tensor of a non-expert tensor

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "path": self.path,
            **self.summary,
            "target": self.target,
            "files": self.files,
            "tensors": self.tensors,
        }


def describe_input(
    path: str,
    rank: int | None = None,
    layer: int | None = None,
    tensor: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> Description:
    """Describe a checkpoint (folder or hub id at `revision`) or an artifact (folder with
    mxconvert.json); `mxconvert.pipeline.inspect.describe` documents the arguments."""
    if (Path(path) / MANIFEST_NAME).is_file():
        desc = _describe_artifact(Path(path), rank)
    else:
        ckpt = open_model(path, revision=revision, cache_dir=cache_dir)
        desc = _CHECKPOINT_DESCRIBERS[ckpt.format_name](ckpt)
        _attach_checkpoint_contents(desc, ckpt)
    every = desc.tensors
    desc.tensors = {
        k: v
        for k, v in sorted(desc.tensors.items(), key=tensor_order)
        if (layer is None or v.get("layer") == layer)
        and (tensor is None or tensor in (v.get("name"), k, k.rsplit(".", 1)[-1]))
    }
    if (layer is not None or tensor is not None) and not desc.tensors:
        raise InputError(_no_match(path, desc.kind, every, layer, tensor))
    return desc


def _spans(numbers: list[int]) -> str:
    """`0-1`, `1-3, 5`: a sorted list of integers as runs."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _no_match(path: str, kind: str, tensors: dict[str, dict], layer: int | None, tensor: str | None) -> str:
    """Why `--layer` / `--tensor` select nothing, naming what they can take (never `None`)."""
    layers = sorted({v["layer"] for v in tensors.values() if isinstance(v.get("layer"), int)})
    if layer is not None and layer not in layers:
        return (
            f"{path}: no layer {layer}: --layer takes {_spans(layers) or 'no layer'} "
            f"(the layers with routed experts of this {kind})"
        )
    names = list(dict.fromkeys(k.rsplit(".", 1)[-1] for k in sorted(tensors, key=tensor_order)))
    where = f" in layer {layer}" if layer is not None else ""
    return (
        f"{path}: no tensor {tensor!r}{where}: --tensor takes a tensor name ({', '.join(names)}) or a full tensor key"
    )


def _describe_mxfp4_checkpoint(ckpt: Checkpoint) -> Description:
    f = ckpt.facts
    tensors = {}
    for layer in range(f.num_layers):
        for t in EXPERT_TENSORS:
            info = ckpt.info(expert_tensor_name(f, layer, t))
            name = _RUNTIME_NAME[t]
            key = f"model.layers.{layer}.mlp.experts.{name}"
            shape = list(info.shape)
            if t.endswith("_blocks"):  # the loader's view: [E, N, K/2]
                shape = shape[:2] + [shape[2] * shape[3]]
            tensors[key] = {
                "layer": layer,
                "name": name,
                "source_name": info.name,
                "file": str(ckpt.file_of(info.name).relative_to(ckpt.root)),
                "dtype": str(info.dtype).removeprefix("torch."),
                "shape": shape,
                "view_shape": shape,
                "view_stride": _strides(shape),
                "row_order": CHECKPOINT_ROW_ORDER if name.startswith("w13") else "natural",
                "hidden_padded": f.hidden_size,
                "intermediate_padded": f.intermediate_size,
                "scale_encoding": "e8m0 (uint8)" if "scale" in name else None,
                "swizzle": "none" if "scale" in name else None,
                "layout_class": None,
                "steps": [],
            }
    summary = {
        "format": {"quant_method": f.quant_method, "layout": f.layout},
        "model": f.to_json(),
        "source": ckpt.identity.to_json(),
    }
    target = {
        "backend": None,
        "runtime_revision": None,
        "tp_size": 1,
        "ep_size": 1,
        "hidden_size_padded": f.hidden_size,
        "intermediate_size_padded": f.intermediate_size,
    }
    files = [{"file": str(p.relative_to(ckpt.root)), "size": p.stat().st_size} for p in ckpt.source_files()]
    return Description("checkpoint", str(ckpt.root), summary, target, tensors, files, ckpt)


def _describe_nvfp4_checkpoint(ckpt) -> Description:
    """NVFP4 experts are stored per expert; describe the canonical tensors they assemble into (TP 1)."""
    from mxconvert.formats.registry import Geometry

    f = ckpt.facts
    specs = Geometry(ckpt.format_name, f.hidden_size, f.intermediate_size).specs(f.num_experts)
    tensors = {}
    for layer in ckpt.moe_layers:
        for name, (dtype, shape) in specs.items():
            tensors[f"model.layers.{layer}.mlp.experts.{name}"] = {
                "layer": layer,
                "name": name,
                "file": "(per-expert tensors)",
                "dtype": str(dtype).removeprefix("torch."),
                "shape": list(shape),
                "view_shape": list(shape),
                "view_stride": _strides(list(shape)),
                "row_order": "[w1 (gate); w3 (up)]" if name.startswith("w13_weight") else "natural",
                "hidden_padded": f.hidden_size,
                "intermediate_padded": f.intermediate_size,
                "scale_encoding": "e4m3 block scales (group 16)" if name.endswith("weight_scale") else None,
                "swizzle": "none" if name.endswith("weight_scale") else None,
                "layout_class": None,
                "steps": [],
            }
    summary = {
        "format": {"quant_method": f"{ckpt.format_name} ({f.quant_format})", "layout": "hf"},
        "model": f.to_json(),
        "source": ckpt.identity.to_json(),
        "warnings": ckpt.warnings,
    }
    target = {
        "backend": None,
        "runtime_revision": None,
        "tp_size": 1,
        "ep_size": 1,
        "hidden_size_padded": f.hidden_size,
        "intermediate_size_padded": f.intermediate_size,
    }
    files = [{"file": str(p.relative_to(ckpt.root)), "size": p.stat().st_size} for p in ckpt.source_files()]
    return Description("checkpoint", str(ckpt.root), summary, target, tensors, files, None)


#: Checkpoint format name (`mxconvert.formats.registry`) -> how its experts are described: GPT-OSS
#: MXFP4 stores each projection of a layer as one tensor, NVFP4 stores experts one by one and is
#: described as the canonical tensors they assemble into.
_CHECKPOINT_DESCRIBERS: dict[str, Callable[[Any], Description]] = {
    "mxfp4": _describe_mxfp4_checkpoint,
    "nvfp4": _describe_nvfp4_checkpoint,
}


def _describe_artifact(root: Path, rank: int | None) -> Description:
    manifest = read_manifest(root)
    target = {k: v for k, v in manifest["target"].items() if k not in ("device", "layout")}
    target["layout"] = manifest["target"].get("layout")
    ranks = {r["rank"]: r for r in manifest["ranks"]}
    if rank is None:  # the first rank the artifact holds (a --rank R artifact may not hold rank 0)
        rank = min(ranks)
    if rank not in ranks:
        raise InputError(f"{root}: has no rank {rank} (ranks in this artifact: {sorted(ranks)})")
    entry = ranks[rank]
    hp, ip = target.get("hidden_size_padded"), target.get("intermediate_size_padded")
    tensors = {}
    for key, info in entry["tensors"].items():
        d = info["layout"]
        tensors[key] = {
            "layer": info["layer"],
            "name": info["name"],
            "file": " + ".join(stored_files(info)),
            **({"parts": info["parts"]} if "parts" in info else {}),  # split by --max-shard-size
            "dtype": d["dtype"],
            "shape": d["buffer_shape"],
            "view_shape": d["view_shape"],
            "view_stride": d["view_stride"],
            "row_order": d.get("row_order", "natural"),
            "hidden_padded": hp,
            "intermediate_padded": ip,
            "scale_encoding": d.get("scale_encoding", "e8m0 (uint8)") if "scale" in info["name"] else None,
            "swizzle": d.get("swizzle", d.get("layout_class", "none")) if "scale" in info["name"] else None,
            "layout_class": d.get("layout_class"),
            "steps": d["steps"],
            **({"logical_shape": d["logical_shape"]} if "logical_shape" in d else {}),
            **({"overread_bytes": d["overread_bytes"]} if "overread_bytes" in d else {}),
        }
    files = entry["files"] + manifest["shared"]["files"] + manifest.get("aux_files", [])
    summary = {
        "fingerprint": manifest["fingerprint"],
        "model": manifest["model"],
        "source": manifest["source"].get("identity"),
        "rank": rank,
        "ranks": sorted(ranks),
        "producer": manifest.get("producer"),
        "serve_command": serve_command(manifest["target"], str(root)),  # None: ambiguous (older --dp)
    }
    desc = Description("artifact", str(root), summary, target, tensors, files, root)
    desc.others = {
        k: {"dtype": v["dtype"], "shape": list(v["shape"]), "file": v["file"]}
        for k, v in manifest["shared"]["tensors"].items()
    }
    desc.copied = {f["file"]: f["sha256"] for f in manifest.get("aux_files", [])}
    src = manifest.get("source", {})
    desc.source = {
        "identity": _identity(src.get("identity") or {}),
        "layout": src.get("layout"),
        "files": {f["file"]: f["sha256"] for f in src.get("files", [])},
    }
    desc._other_reader = lambda name: ShardReader(artifact_file(root, desc.others[name]["file"])).get(name)
    return desc


def _identity(ident: dict) -> dict:
    """Where a source came from, without the local path (the same checkpoint may sit anywhere)."""
    return {k: v for k, v in ident.items() if k != "path"}


def _attach_checkpoint_contents(desc: Description, ckpt) -> None:
    from mxconvert.storage.files import sha256_file

    desc.others = {
        n: {"dtype": str(ckpt.info(n).dtype).removeprefix("torch."), "shape": list(ckpt.info(n).shape)}
        for n in ckpt.other_tensor_names()
    }
    desc.copied = {p.name: sha256_file(p) for p in ckpt.aux_files()}  # config, tokenizer: small
    desc.source = {"identity": _identity(ckpt.identity.to_json()), "layout": ckpt.layout}
    desc._other_reader = ckpt.tensor


def _strides(shape) -> list[int]:
    return list(contiguous_strides(tuple(shape)))


_NAME_ORDER = {n: i for i, n in enumerate(_RUNTIME_NAME.values())}


def tensor_order(item) -> tuple:
    """Sort key of a tensor key (or a (key, value) item): layer, then the runtime's tensor order."""
    key = item[0] if isinstance(item, tuple) else item
    parts = key.split(".")
    layer = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else -1
    return (layer, _NAME_ORDER.get(parts[-1], 99), key)


def load_tensor(desc: Description, key: str) -> torch.Tensor:
    """The bytes of expert tensor `key` of a described input (a GPT-OSS checkpoint or an artifact)."""
    if isinstance(desc._data, Checkpoint):
        return desc._data.tensor(desc.tensors[key]["source_name"]).reshape(desc.tensors[key]["shape"])
    root = Path(desc._data)
    return read_stored(
        desc.tensors[key], key, lambda rel, k: ShardReader(artifact_file(root, rel)).get(k), where=f"{root}/"
    )
