"""Test helpers for tiny NVFP4 MoE checkpoints (ModelOpt and compressed-tensors; Qwen3-MoE and
DeepSeek-V3), built by `examples/make_tiny_nvfp4_moe.py`.

    make_nvfp4_checkpoint(tmp_path, name="tiny-nvfp4", **kw)   fresh copy of a checkpoint folder
    reference_nvfp4_tensors(**kw)                              TinyNvfp4Tensors: the on-disk tensors, the
                                                               bf16 weights the experts were quantized
                                                               from, and the quantized pieces
    dequantize_nvfp4(packed, weight_scale, global_scale, *, global_is_encode=False)
    quantize_nvfp4(w, weight_scale_2=None, input_scale=None)   ModelOpt's NVFP4 quantizer
    nvfp4_error_bound(w, q)                                    per-element |w - dequant(q)| bound
    read_checkpoint_tensors(ckpt_dir)                          every tensor of a folder, via its index
    EXAMPLE_DIRS                                               the four committed examples

kw are `write_tiny_nvfp4_moe` arguments: fmt ("modelopt" | "compressed-tensors"), arch ("qwen3_moe" |
"deepseek_v3"), num_layers, num_experts, hidden_size, moe_intermediate_size, seed, w4a16,
gate_up_global_scale_differ, num_shards, and any TinyNvfp4Config field (modelopt_config,
quantize_shared_experts, edge_blocks, vocab_size, ...). `reference_nvfp4_tensors(**kw)` with the kw of
`make_nvfp4_checkpoint(tmp_path, **kw)` describes exactly that checkpoint (num_shards is ignored).

Conventions (as vLLM 0.33.0 modelopt.py / compressed_tensors_moe.py read them):
`TinyNvfp4Tensors.quantized[module]` holds ModelOpt's
decode scales (weight_scale_2 = amax / 2688, input_scale = act_amax / 2688); a compressed-tensors
checkpoint stores `weight_global_scale = 1 / weight_scale_2` and `input_global_scale = 1 / input_scale`
(float32, shape [1]) next to the same packed bytes (`weight_packed`) and block scales.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import torch
from fixtures_ckpt import load_script
from safetensors.torch import load_file

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SCRIPT = REPO_ROOT / "examples" / "make_tiny_nvfp4_moe.py"
INDEX_NAME = "model.safetensors.index.json"


def load_nvfp4_example_module():
    """The module `examples/make_tiny_nvfp4_moe.py`."""
    return load_script(EXAMPLE_SCRIPT)


_mod = load_nvfp4_example_module()
quantize_nvfp4 = _mod.quantize_nvfp4
dequantize_nvfp4 = _mod.dequantize_nvfp4
nvfp4_error_bound = _mod.nvfp4_error_bound
pack_fp4 = _mod.pack_fp4
unpack_fp4 = _mod.unpack_fp4
E2M1_VALUES = _mod.E2M1_VALUES
NVFP4Weight = _mod.NVFP4Weight
TinyNvfp4Config = _mod.TinyNvfp4Config
TinyNvfp4Tensors = _mod.TinyNvfp4Tensors

#: Committed example folder -> the write_tiny_nvfp4_moe kw that regenerate it.
EXAMPLE_KW: dict[str, dict] = {name: dict(kw) for name, kw in _mod.COMMITTED_EXAMPLES.items()}
#: Committed example folder name -> its path (examples/tiny-nvfp4-*).
EXAMPLE_DIRS: dict[str, Path] = {name: REPO_ROOT / "examples" / name for name in EXAMPLE_KW}

_BUILT: dict[tuple, Path] = {}
_BUILD_ROOT: Path | None = None


def _build_root() -> Path:
    global _BUILD_ROOT
    if _BUILD_ROOT is None:
        _BUILD_ROOT = Path(tempfile.mkdtemp(prefix="tiny-nvfp4-"))
        atexit.register(shutil.rmtree, _BUILD_ROOT, True)
    return _BUILD_ROOT


def _key(kw: dict) -> tuple:
    return tuple(sorted(kw.items()))


def make_nvfp4_checkpoint(tmp_path: str | Path, name: str = "tiny-nvfp4", **kw) -> Path:
    """A fresh copy of a tiny NVFP4 MoE checkpoint at `tmp_path / name` (kw: see the module docstring).

    Each distinct kw set is generated once per process and copied, so faults planted in one copy never
    leak into another."""
    key = _key(kw)
    src = _BUILT.get(key)
    if src is None or not src.is_dir():
        src = _build_root() / f"c{len(_BUILT)}"
        _mod.write_tiny_nvfp4_moe(src, **kw)
        _BUILT[key] = src
    dst = Path(tmp_path) / name
    shutil.copytree(src, dst)
    return dst


def _config(**kw) -> TinyNvfp4Config:
    kw = {k: v for k, v in kw.items() if k not in ("num_shards", "overwrite")}
    unknown = set(kw) - set(TinyNvfp4Config.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown arguments: {sorted(unknown)}")
    return TinyNvfp4Config(**kw)


def reference_nvfp4_tensors(**kw) -> TinyNvfp4Tensors:
    """TinyNvfp4Tensors for the same kw as make_nvfp4_checkpoint: `.tensors` (on-disk name -> tensor,
    for kw's fmt), `.reference` (quantized module name -> bf16 weight [N, K]), `.quantized` (module ->
    NVFP4Weight, ModelOpt decode scales), `.unquantized_linears`, `.config`, and
    `.stacked_reference(layer)` -> (w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I])."""
    return _mod.build_tiny_nvfp4_tensors(_config(**kw))


def read_checkpoint_tensors(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder (through its index when there is one)."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / INDEX_NAME
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else [p.name for p in sorted(ckpt_dir.glob("*.safetensors"))]
    )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(ckpt_dir / f)))
    return out


def expert_tensor_names(fmt: str, module: str, *, w4a16: bool = False) -> dict[str, str]:
    """Role -> on-disk name for one NVFP4 linear `module` in `fmt`. Roles: weight, weight_scale,
    global_scale, input_scale (absent for w4a16)."""
    if fmt == "modelopt":
        names = {
            "weight": ".weight",
            "weight_scale": ".weight_scale",
            "global_scale": ".weight_scale_2",
            "input_scale": ".input_scale",
        }
    elif fmt == "compressed-tensors":
        names = {
            "weight": ".weight_packed",
            "weight_scale": ".weight_scale",
            "global_scale": ".weight_global_scale",
            "input_scale": ".input_global_scale",
        }
    else:
        raise ValueError(f"unknown fmt {fmt!r}")
    if w4a16:
        del names["input_scale"]
    return {role: module + suffix for role, suffix in names.items()}
