"""Reading GPT-OSS MXFP4 checkpoints: a local folder or a Hugging Face repo id, in the Hugging Face
layout or in OpenAI's `original/` layout (the layouts vLLM 0.33.0 vllm/model_executor/models/gpt_oss.py loads).

The reader validates everything it will rely on before any work starts: the config, the index, the
headers of every shard, and the name, dtype and shape of every expert tensor of every layer. A
checkpoint that is not what it claims is refused with the file, the tensor and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from mxconvert.core.dtypes import BFLOAT16, UINT8, DType
from mxconvert.core.errors import InputError
from mxconvert.formats.base import FORMATS_READ
from mxconvert.storage.files import read_folder_json
from mxconvert.storage.hub import folder_files
from mxconvert.storage.source import SafetensorsSource, SourceIdentity, resolve_source

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


def expert_tensor_name(facts: ModelFacts, layer: int, tensor: str) -> str:
    if facts.layout == "original":
        return f"block.{layer}.mlp.{_ORIGINAL_NAMES[tensor]}"
    return f"model.layers.{layer}.mlp.experts.{tensor}"


def expected_expert_spec(facts: ModelFacts, tensor: str) -> tuple[DType, tuple[int, ...]]:
    """dtype and shape the checkpoint must hold for one expert tensor (as vLLM 0.33.0 gpt_oss.py reads it)."""
    e, h, i = facts.num_experts, facts.hidden_size, facts.intermediate_size
    return {
        "gate_up_proj_blocks": (UINT8, (e, 2 * i, h // 32, 16)),
        "gate_up_proj_scales": (UINT8, (e, 2 * i, h // 32)),
        "gate_up_proj_bias": (BFLOAT16, (e, 2 * i)),
        "down_proj_blocks": (UINT8, (e, h, i // 32, 16)),
        "down_proj_scales": (UINT8, (e, h, i // 32)),
        "down_proj_bias": (BFLOAT16, (e, h)),
    }[tensor]


class Checkpoint(SafetensorsSource):
    """A validated GPT-OSS MXFP4 checkpoint on local disk."""

    format_name = "mxfp4"
    #: Names that look like GPT-OSS expert tensors (HF and original layouts).
    EXPERT_LIKE = re.compile(r"\.mlp\.experts\.|^block\.\d+\.mlp\.mlp[12]_")

    def __init__(self, root: Path, identity: SourceIdentity, layout: str | None = None) -> None:
        folder, self.layout = locate(root, layout)
        super().__init__(folder, identity)
        self.config = self._read_config()
        self.facts = _facts_from_config(self.config, self.config_path, self.layout)
        self._open_weights()
        self._check_expert_tensors()
        self.account()

    def _check_expert_tensors(self) -> None:
        for layer in range(self.facts.num_layers):
            for tensor in EXPERT_TENSORS:
                info = self.info(expert_tensor_name(self.facts, layer, tensor))
                dtype, shape = expected_expert_spec(self.facts, tensor)
                where = self.root / self.weight_map[info.name]
                if info.dtype != dtype:
                    raise InputError(f"{where}: tensor {info.name} has dtype {info.dtype}, expected {dtype}")
                if info.shape != shape:
                    raise InputError(
                        f"{where}: tensor {info.name} has shape {list(info.shape)}, expected "
                        f"{list(shape)} (from {self.config_path.name}: E={self.facts.num_experts}, "
                        f"H={self.facts.hidden_size}, I={self.facts.intermediate_size})"
                    )

    def _accounting_hint(self) -> str:
        return f"{self.config_path.name}: {self.facts.num_layers} layers of {', '.join(EXPERT_TENSORS)}"

    @property
    def moe_layers(self) -> list[int]:
        """Layers that hold routed experts (every GPT-OSS layer)."""
        return list(range(self.facts.num_layers))

    def expert_names(self) -> set[str]:
        return {
            expert_tensor_name(self.facts, layer, t) for layer in range(self.facts.num_layers) for t in EXPERT_TENSORS
        }


def locate(root: Path, layout: str | None) -> tuple[Path, str]:
    """Find the folder holding the weights, and its layout ("hf" or "original")."""
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    hf_ok = (root / "config.json").exists() and "model_type" in read_folder_json(root / "config.json")
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
            except (TypeError, ValueError, OverflowError):
                raise InputError(f"{path}: {key} must be {kind.__name__}, got {config[key]!r}") from None
    if default is not None:
        return default
    raise InputError(f"{path}: missing key {' / '.join(keys)}")


def _quantization_of(quant) -> str:
    """The config's quantization, as a refusal names it: `none`, or its method and kind."""
    if not isinstance(quant, dict) or not quant:
        return "quantization_config: none"
    shown = [f"{key} {quant[key]!r}" for key in ("quant_method", "quant_algo", "format", "fmt") if key in quant]
    return "quantization_config: " + (", ".join(shown) or "no quant_method")


def _not_read(path: Path, model_type, quant, method: str | None) -> str:
    """Why a Hugging Face config is no checkpoint mxconvert reads: the model and its quantization,
    then what mxconvert does read (an unquantized or FP8 checkpoint is not told 'expected gpt_oss')."""
    what = f"a {model_type} checkpoint" if isinstance(model_type, str) and model_type else "a checkpoint"
    if method in SUPPORTED_QUANT_METHODS:
        return (
            f"{path}: {what} with MXFP4 quantization ({_quantization_of(quant)}), but MXFP4 is read for "
            f"GPT-OSS (model_type 'gpt_oss') only; {FORMATS_READ}"
        )
    return f"{path}: {what} without FP4 quantization ({_quantization_of(quant)}); {FORMATS_READ}"


def _facts_from_config(config: dict, path: Path, layout: str) -> ModelFacts:
    if layout == "hf":
        model_type = config.get("model_type")
        quant = config.get("quantization_config")
        method = str(quant["quant_method"]) if isinstance(quant, dict) and "quant_method" in quant else None
        if model_type != "gpt_oss" or method not in SUPPORTED_QUANT_METHODS:
            raise InputError(_not_read(path, model_type, quant, method))
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


def open_checkpoint(
    source: str, *, revision: str | None = None, cache_dir: str | None = None, layout: str | None = None
) -> Checkpoint:
    """Open a GPT-OSS MXFP4 checkpoint: a local folder, or a Hugging Face repo id through
    huggingface_hub's cache (only the chosen layout's files are fetched). `open_model`
    (formats/registry.py) opens a checkpoint of any format.
    """
    resolved = resolve_source(
        source,
        lambda snapshot, repo_files: folder_files(snapshot, locate(snapshot, layout)[0], repo_files),
        revision=revision,
        cache_dir=cache_dir,
    )
    ckpt = Checkpoint(resolved.folder, resolved.identity, layout)
    ckpt.hub_snapshot = resolved.snapshot  # hub sha256 of the LFS files (describe_files), what was fetched
    return ckpt
