"""Reading GPT-OSS MXFP4 checkpoints: a local folder or a Hugging Face repo id, in the Hugging Face
layout or in OpenAI's `original/` layout (spec mxfp4_transforms.md §1).

The reader validates everything it will rely on before any work starts: the config, the index, the
headers of every shard, and the name, dtype and shape of every expert tensor of every layer. A
checkpoint that is not what it claims is refused with the file, the tensor and what was expected.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .errors import InputError
from .safetensors_io import ShardReader, TensorInfo, dtype_name

#: Canonical (HF) names of the six expert tensors of a layer.
EXPERT_TENSORS = (
    "gate_up_proj_blocks",
    "gate_up_proj_scales",
    "gate_up_proj_bias",
    "down_proj_blocks",
    "down_proj_scales",
    "down_proj_bias",
)

_ORIGINAL_NAMES = {
    "gate_up_proj_blocks": "mlp1_weight.blocks",
    "gate_up_proj_scales": "mlp1_weight.scales",
    "gate_up_proj_bias": "mlp1_bias",
    "down_proj_blocks": "mlp2_weight.blocks",
    "down_proj_scales": "mlp2_weight.scales",
    "down_proj_bias": "mlp2_bias",
}

SUPPORTED_QUANT_METHODS = ("mxfp4", "gpt_oss_mxfp4")


@dataclass(frozen=True)
class ModelFacts:
    """What the converter needs to know about the model, from its config."""

    model_type: str
    quant_method: str
    num_layers: int
    num_experts: int
    experts_per_token: int
    hidden_size: int
    intermediate_size: int
    swiglu_limit: float
    layout: str  # "hf" or "original"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SourceIdentity:
    """Where the checkpoint came from: a local path, or a hub repo at a commit."""

    kind: str  # "local" or "hub"
    path: str
    repo_id: str | None = None
    revision: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def expert_tensor_name(facts: ModelFacts, layer: int, tensor: str) -> str:
    if facts.layout == "original":
        return f"block.{layer}.mlp.{_ORIGINAL_NAMES[tensor]}"
    return f"model.layers.{layer}.mlp.experts.{tensor}"


def expected_expert_spec(facts: ModelFacts, tensor: str) -> tuple[torch.dtype, tuple[int, ...]]:
    """dtype and shape the checkpoint must hold for one expert tensor (spec §1.2)."""
    e, h, i = facts.num_experts, facts.hidden_size, facts.intermediate_size
    return {
        "gate_up_proj_blocks": (torch.uint8, (e, 2 * i, h // 32, 16)),
        "gate_up_proj_scales": (torch.uint8, (e, 2 * i, h // 32)),
        "gate_up_proj_bias": (torch.bfloat16, (e, 2 * i)),
        "down_proj_blocks": (torch.uint8, (e, h, i // 32, 16)),
        "down_proj_scales": (torch.uint8, (e, h, i // 32)),
        "down_proj_bias": (torch.bfloat16, (e, h)),
    }[tensor]


class Checkpoint:
    """A validated GPT-OSS MXFP4 checkpoint on local disk."""

    format_name = "mxfp4"

    def __init__(self, root: Path, identity: SourceIdentity, layout: str | None = None) -> None:
        self.identity = identity
        self.root, self.layout = _locate(root, layout)
        self.config_path = self.root / "config.json"
        self.config = _read_json(self.config_path)
        self.facts = _facts_from_config(self.config, self.config_path, self.layout)
        self.weight_map = self._read_weight_map()
        self.shards: dict[str, ShardReader] = {}
        for rel in sorted(set(self.weight_map.values())):
            self.shards[rel] = ShardReader(self.root / rel)
        self._check_weight_map()
        self._check_expert_tensors()

    # ---- discovery ---------------------------------------------------------------------------
    def _read_weight_map(self) -> dict[str, str]:
        index = self.root / "model.safetensors.index.json"
        if index.is_file():
            data = _read_json(index)
            weight_map = data.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise InputError(f"{index}: no 'weight_map' object")
            missing = sorted({f for f in weight_map.values() if not (self.root / f).is_file()})
            if missing:
                raise InputError(
                    f"{index}: names shard(s) that do not exist: {', '.join(missing)}"
                )
            return {str(k): str(v) for k, v in weight_map.items()}
        files = sorted(p.name for p in self.root.glob("*.safetensors"))
        if not files:
            raise InputError(f"{self.root}: no *.safetensors files and no model.safetensors.index.json")
        weight_map: dict[str, str] = {}
        for rel in files:
            tensors, _ = ShardReader(self.root / rel).tensors, None
            for name in tensors:
                weight_map[name] = rel
        return weight_map

    def _check_weight_map(self) -> None:
        for name, rel in self.weight_map.items():
            if name not in self.shards[rel].tensors:
                raise InputError(
                    f"{self.root / rel}: index says it holds tensor {name!r}, but it does not"
                )

    def _check_expert_tensors(self) -> None:
        for layer in range(self.facts.num_layers):
            for tensor in EXPERT_TENSORS:
                info = self.info(expert_tensor_name(self.facts, layer, tensor))
                dtype, shape = expected_expert_spec(self.facts, tensor)
                where = self.root / self.weight_map[info.name]
                if info.dtype != dtype:
                    raise InputError(
                        f"{where}: tensor {info.name} has dtype {dtype_name(info.dtype)}, expected {dtype_name(dtype)}"
                    )
                if info.shape != shape:
                    raise InputError(
                        f"{where}: tensor {info.name} has shape {list(info.shape)}, expected "
                        f"{list(shape)} (from {self.config_path.name}: E={self.facts.num_experts}, "
                        f"H={self.facts.hidden_size}, I={self.facts.intermediate_size})"
                    )

    @property
    def moe_layers(self) -> list[int]:
        """Layers that hold routed experts (every GPT-OSS layer)."""
        return list(range(self.facts.num_layers))

    # ---- access --------------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        rel = self.weight_map.get(name)
        if rel is None:
            raise InputError(f"{self.root}: missing tensor {name!r} (not in any shard)")
        return self.shards[rel].tensors[name]

    def file_of(self, name: str) -> Path:
        return self.root / self.weight_map[name]

    def tensor(self, name: str) -> torch.Tensor:
        self.info(name)
        return self.shards[self.weight_map[name]].get(name)

    def slice(self, name: str):
        """A lazy safetensors slice, so a rank reads only its own rows / experts."""
        self.info(name)
        return self.shards[self.weight_map[name]].get_slice(name)

    def expert_names(self) -> set[str]:
        return {
            expert_tensor_name(self.facts, layer, t)
            for layer in range(self.facts.num_layers)
            for t in EXPERT_TENSORS
        }

    def other_tensor_names(self) -> list[str]:
        """Every tensor that is not an MoE expert tensor, in index order (passed through as is)."""
        experts = self.expert_names()
        return [n for n in self.weight_map if n not in experts]

    def aux_files(self) -> list[Path]:
        """Config, tokenizer and other small files copied unchanged into the artifact."""
        skip = set(self.weight_map.values()) | {"model.safetensors.index.json"}
        out = []
        for path in sorted(self.root.iterdir()):
            if path.is_file() and path.name not in skip and not path.name.startswith("."):
                if path.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf"):
                    continue
                out.append(path)
        return out

    def source_files(self) -> list[Path]:
        return [self.root / rel for rel in sorted(self.shards)] + [self.config_path]

    def describe_files(self) -> list[dict]:
        """Size and sha256 of every file the artifact is derived from (hub sources: the hub's)."""
        from .hub import describe_checkpoint_files
        return describe_checkpoint_files(self)


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()




def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def _locate(root: Path, layout: str | None) -> tuple[Path, str]:
    """Find the folder holding the weights, and its layout ("hf" or "original")."""
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    hf_ok = (root / "config.json").is_file() and "model_type" in _read_json(root / "config.json")
    orig = root / "original"
    if layout == "original" or (layout is None and not hf_ok):
        if (orig / "config.json").is_file():
            return orig, "original"
        if (root / "config.json").is_file() and not hf_ok:
            return root, "original"
        if layout == "original":
            raise InputError(f"{root}: --layout original, but there is no original/ folder with a config.json")
        raise InputError(f"{root}: no config.json (neither Hugging Face nor original/ layout)")
    if layout not in (None, "hf"):
        raise InputError(f"unknown checkpoint layout {layout!r}: expected 'hf' or 'original'")
    if not hf_ok:
        raise InputError(f"{root / 'config.json'}: not a Hugging Face model config (no model_type)")
    return root, "hf"


def _get(config: dict, path: Path, *keys: str, kind=int, default=None):
    for key in keys:
        if key in config:
            try:
                return kind(config[key])
            except (TypeError, ValueError):
                raise InputError(f"{path}: {key} must be {kind.__name__}, got {config[key]!r}") from None
    if default is not None:
        return default
    raise InputError(f"{path}: missing key {' / '.join(keys)}")


def _facts_from_config(config: dict, path: Path, layout: str) -> ModelFacts:
    if layout == "hf":
        model_type = config.get("model_type")
        if model_type != "gpt_oss":
            raise InputError(f"{path}: model_type is {model_type!r}, expected 'gpt_oss'")
        quant = config.get("quantization_config")
        if not isinstance(quant, dict) or "quant_method" not in quant:
            raise InputError(
                f"{path}: no quantization_config.quant_method; expected one of "
                f"{', '.join(SUPPORTED_QUANT_METHODS)} (an MXFP4 GPT-OSS checkpoint)"
            )
        method = str(quant["quant_method"])
        if method not in SUPPORTED_QUANT_METHODS:
            raise InputError(
                f"{path}: quantization_config.quant_method is {method!r}; mxconvert reads "
                f"{', '.join(SUPPORTED_QUANT_METHODS)}"
            )
        experts = _get(config, path, "num_local_experts", "num_experts")
    else:
        model_type, method = "gpt_oss", "mxfp4"
        experts = _get(config, path, "num_experts", "num_local_experts")
    facts = ModelFacts(
        model_type=model_type,
        quant_method=method,
        num_layers=_get(config, path, "num_hidden_layers"),
        num_experts=experts,
        experts_per_token=_get(config, path, "num_experts_per_tok", "experts_per_token", default=4),
        hidden_size=_get(config, path, "hidden_size"),
        intermediate_size=_get(config, path, "intermediate_size"),
        swiglu_limit=_get(config, path, "swiglu_limit", kind=float, default=7.0),
        layout=layout,
    )
    for key in ("hidden_size", "intermediate_size"):
        value = getattr(facts, key)
        if value <= 0 or value % 32:
            raise InputError(f"{path}: {key} = {value} is not a positive multiple of 32 (MXFP4 blocks)")
    if facts.num_layers <= 0 or facts.num_experts <= 0:
        raise InputError(f"{path}: num_hidden_layers and the expert count must be positive")
    return facts


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def open_checkpoint(source: str, *, revision: str | None = None, cache_dir: str | None = None,
                    layout: str | None = None, probe=None) -> Checkpoint:
    """Open a local folder, or a Hugging Face repo id through huggingface_hub's cache.

    The hub path honours `HF_HUB_OFFLINE`, `HF_HUB_CACHE`/`HF_HOME` and `--cache-dir`, so an
    already-downloaded model is used without any network access.
    """
    path = Path(source).expanduser()
    if path.exists():
        from .hub import snapshot_identity

        if revision is not None:
            raise InputError(f"--revision {revision}: {source} is a local folder, which has no revisions "
                             "(give a hub repo id to pick a revision)")
        hub = snapshot_identity(path)
        identity = (SourceIdentity("hub", str(path.absolute()), repo_id=hub[0], revision=hub[1]) if hub
                    else SourceIdentity("local", str(path.resolve())))
        other = probe(path.resolve(), identity) if probe and path.is_dir() else None
        return other or Checkpoint(path.resolve(), identity, layout)
    if not _REPO_ID.match(source):
        raise InputError(f"{source}: no such directory, and not a Hugging Face repo id (org/name)")
    from .hub import fetch

    snap = fetch(source, revision=revision, cache_dir=cache_dir, layout=layout)
    identity = SourceIdentity("hub", str(snap.folder), repo_id=source, revision=snap.commit)
    other = probe(snap.folder, identity) if probe else None
    ckpt = other or Checkpoint(snap.folder, identity, layout)
    ckpt.hub_snapshot = snap  # hub sha256 of the LFS files (describe_files), what was fetched
    return ckpt
