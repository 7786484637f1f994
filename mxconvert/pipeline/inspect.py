"""`inspect`: layout descriptors of a checkpoint or an artifact, and the diff of two.

Both kinds of input are described in the same vocabulary, keyed by the runtime parameter names
(`model.layers.L.mlp.experts.w13_weight`, ...), so a checkpoint can be diffed against an artifact
and two artifacts against each other: target fields, missing tensors, descriptor fields (row
order, padding, scale encoding and swizzle, view) and, where descriptors agree, the bytes.

Describing reads headers and manifests only, so it does not import torch (seconds on a GPU host,
bench/README.md "Session 6"); the diff's byte comparisons import it when they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file, read_manifest
from mxconvert.artifact.parts import read_stored, stored_files
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4.checkpoint import EXPERT_TENSORS, Checkpoint, expert_tensor_name
from mxconvert.formats.registry import open_model
from mxconvert.layouts.base import contiguous_strides
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

#: Descriptor fields compared by the diff, with the words used to report them.
DIFF_FIELDS = {
    "dtype": "dtype",
    "shape": "stored shape",
    "view_shape": "view shape",
    "view_stride": "view strides",
    "row_order": "row order",
    "hidden_padded": "hidden padded to",
    "intermediate_padded": "intermediate padded to",
    "scale_encoding": "scale encoding",
    "swizzle": "swizzle",
    "layout_class": "layout class",
    "steps": "steps",
}


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


def describe(
    path: str,
    rank: int | None = None,
    layer: int | None = None,
    tensor: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> Description:
    """Describe a checkpoint (folder or hub id at `revision`) or an artifact (folder with mxconvert.json)."""
    if (Path(path) / MANIFEST_NAME).is_file():
        desc = _describe_artifact(Path(path), rank)
    else:
        ckpt = open_model(path, revision=revision, cache_dir=cache_dir)
        desc = _describe_checkpoint(ckpt) if ckpt.format_name == "mxfp4" else _describe_nvfp4_checkpoint(ckpt)
        _attach_checkpoint_contents(desc, ckpt)
    desc.tensors = {
        k: v
        for k, v in sorted(desc.tensors.items(), key=_tensor_order)
        if (layer is None or v.get("layer") == layer)
        and (tensor is None or tensor in (v.get("name"), k, k.rsplit(".", 1)[-1]))
    }
    if (layer is not None or tensor is not None) and not desc.tensors:
        raise InputError(f"{path}: no tensor matches --layer {layer} --tensor {tensor}")
    return desc


def _describe_checkpoint(ckpt: Checkpoint) -> Description:
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
    specs = Geometry("nvfp4", f.hidden_size, f.intermediate_size).specs(f.num_experts)
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
        "format": {"quant_method": f"nvfp4 ({f.quant_format})", "layout": "hf"},
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
    desc._other_reader = lambda name: ShardReader(root / desc.others[name]["file"]).get(name)
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


# ---- diff --------------------------------------------------------------------------------------------
TARGET_FIELDS = (
    "profile",
    "platform",
    "capability",
    "gfx",
    "backend",
    "kernel_class",
    "activation",
    "runtime_revision",
    "tp_size",
    "ep_size",
    "hidden_size_padded",
    "intermediate_size_padded",
)


def diff(a: Description, b: Description, progress=None) -> dict:
    """Differences between two descriptions; `same` is True only when nothing differs: target,
    expert tensors (presence, descriptors, bytes), non-expert tensors (presence, dtype, shape,
    bytes), copied files (config, tokenizer) and the sources (identity, layout, file hashes).
    `progress`: an object with `total` and `advance(nbytes, detail)` for the byte comparisons."""
    target = [
        {"field": k, "a": a.target.get(k), "b": b.target.get(k)}
        for k in TARGET_FIELDS
        if a.target.get(k) != b.target.get(k)
    ]
    only_a = sorted(set(a.tensors) - set(b.tensors))
    only_b = sorted(set(b.tensors) - set(a.tensors))
    descriptors, bytes_differ = [], []
    common = sorted(set(a.tensors) & set(b.tensors), key=_tensor_order)
    if progress is not None:
        progress.total = sum(_nbytes(a.tensors[k]) for k in common) + sum(
            _nbytes(a.others[k]) for k in set(a.others) & set(b.others)
        )
    for key in common:
        if progress is not None:
            progress.advance(_nbytes(a.tensors[key]), f"layer {a.tensors[key].get('layer')}")
        da, db = a.tensors[key], b.tensors[key]
        changes = [
            {
                "field": f,
                "a": da.get(f),
                "b": db.get(f),
                "text": f"{_short(key)} {label}: {_fmt(da.get(f))} vs {_fmt(db.get(f))}",
            }
            for f, label in DIFF_FIELDS.items()
            if da.get(f) != db.get(f)
        ]
        if changes:
            descriptors.append({"tensor": key, "changes": changes})
            continue
        where = _first_byte_difference(a, b, key)
        if where is not None:
            bytes_differ.append({"tensor": key, **where})
    others = _diff_others(a, b, progress)
    copied = _diff_maps(a.copied, b.copied, "file")
    source = _diff_source(a.source, b.source)
    same = not (target or only_a or only_b or descriptors or bytes_differ or others or copied or source)
    return {
        "same": same,
        "a": a.path,
        "b": b.path,
        "target": target,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "descriptors": descriptors,
        "bytes": bytes_differ,
        "other_tensors": others,
        "copied_files": copied,
        "source": source,
    }


def _nbytes(entry: dict) -> int:
    count = 1
    for dim in entry.get("shape") or []:
        count *= int(dim)
    try:
        itemsize = dtype_named(entry.get("dtype")).itemsize
    except ValueError:  # a dtype mxconvert does not know: count its elements as bytes
        itemsize = 1
    return count * itemsize


def _diff_others(a: Description, b: Description, progress=None) -> list[dict]:
    """Non-expert tensors: presence, dtype, shape and bytes."""
    import torch

    out = [{"tensor": k, "text": f"{k}: only in A"} for k in sorted(set(a.others) - set(b.others))]
    out += [{"tensor": k, "text": f"{k}: only in B"} for k in sorted(set(b.others) - set(a.others))]
    for key in sorted(set(a.others) & set(b.others)):
        da, db = a.others[key], b.others[key]
        if progress is not None:
            progress.advance(_nbytes(da), "non-expert tensors")
        if (da["dtype"], da["shape"]) != (db["dtype"], db["shape"]):
            out.append({"tensor": key, "text": f"{key}: {da['dtype']} {da['shape']} vs {db['dtype']} {db['shape']}"})
            continue
        if a._other_reader is None or b._other_reader is None:
            continue
        ta, tb = a._other_reader(key), b._other_reader(key)
        ba = ta.contiguous().view(torch.uint8) if ta.dim() else ta.reshape(1).view(torch.uint8)
        bb = tb.contiguous().view(torch.uint8) if tb.dim() else tb.reshape(1).view(torch.uint8)
        if not torch.equal(ba, bb):
            out.append({"tensor": key, "text": f"{key}: same dtype and shape, different bytes"})
    return out


def _diff_maps(a: dict, b: dict, what: str) -> list[dict]:
    out = [{what: k, "text": f"{what} {k}: only in A"} for k in sorted(set(a) - set(b))]
    out += [{what: k, "text": f"{what} {k}: only in B"} for k in sorted(set(b) - set(a))]
    out += [{what: k, "text": f"{what} {k}: different content"} for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    return out


def _diff_source(a: dict, b: dict) -> list[dict]:
    """Sources: identity and layout, and the source files' hashes where both record them."""
    out = [
        {"field": k, "a": a.get(k), "b": b.get(k), "text": f"source {k}: {_fmt(a.get(k))} vs {_fmt(b.get(k))}"}
        for k in ("identity", "layout")
        if a.get(k) != b.get(k)
    ]
    if "files" in a and "files" in b:
        out += [dict(d, field="files", text="source " + d["text"]) for d in _diff_maps(a["files"], b["files"], "file")]
    return out


_NAME_ORDER = {n: i for i, n in enumerate(_RUNTIME_NAME.values())}


def _tensor_order(item) -> tuple:
    key = item[0] if isinstance(item, tuple) else item
    parts = key.split(".")
    layer = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else -1
    return (layer, _NAME_ORDER.get(parts[-1], 99), key)


def _short(key: str) -> str:
    parts = key.split(".")
    return f"layer {parts[2]} {parts[-1]}" if len(parts) > 4 else key


def _fmt(value) -> str:
    return "-" if value is None else str(value)


def _load(desc: Description, key: str) -> torch.Tensor:
    if isinstance(desc._data, Checkpoint):
        return desc._data.tensor(desc.tensors[key]["source_name"]).reshape(desc.tensors[key]["shape"])
    root = Path(desc._data)
    return read_stored(
        desc.tensors[key], key, lambda rel, k: ShardReader(artifact_file(root, rel)).get(k), where=f"{root}/"
    )


def _first_byte_difference(a: Description, b: Description, key: str) -> dict | None:
    if a._data is None or b._data is None:  # an NVFP4 checkpoint holds experts per expert: no one tensor
        return None
    import torch

    ta, tb = _load(a, key), _load(b, key)
    ba, bb = ta.contiguous().view(torch.uint8), tb.contiguous().view(torch.uint8)
    if ba.shape != bb.shape:
        return {"text": f"{_short(key)}: different sizes"}
    if torch.equal(ba, bb):
        return None
    idx = torch.nonzero(ba != bb)[0].tolist()
    if ta.dtype != torch.uint8:
        idx[-1] //= ta.element_size()
    expert = idx[0]
    row = idx[1] if len(idx) > 1 else None
    return {
        "expert": expert,
        "index": idx,
        "text": f"{_short(key)}: same layout, different bytes; first at expert {expert}"
        + (f" row {row}" if row is not None else "")
        + f" (index {idx})",
    }
