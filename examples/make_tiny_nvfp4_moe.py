#!/usr/bin/env python3
"""Write tiny, deterministic, real-format NVFP4 MoE checkpoints (test tooling, not package code).

`python examples/make_tiny_nvfp4_moe.py` regenerates the four committed examples:

    examples/tiny-nvfp4-modelopt-qwen3/     ModelOpt, Qwen3-MoE,    hf_quant_config.json + config.json
    examples/tiny-nvfp4-ct-qwen3/           compressed-tensors, Qwen3-MoE
    examples/tiny-nvfp4-modelopt-deepseek/  ModelOpt, DeepSeek-V3,  legacy hf_quant_config.json only
    examples/tiny-nvfp4-ct-deepseek/        compressed-tensors, DeepSeek-V3

`write_tiny_nvfp4_moe(out_dir, fmt=..., arch=..., ...)` writes any other variant; `python
examples/make_tiny_nvfp4_moe.py --out DIR [--fmt ... --arch ... --w4a16 ...]` does the same from the
shell. Everything is plain torch + safetensors, no network. The same arguments give the same bytes in
every file: every random tensor has its own RNG stream seeded from `seed` and the module name (never
from `fmt`, so the ModelOpt and compressed-tensors variants of one configuration hold the very same
FP4 codes and block scales); JSON is written with `sort_keys=True, indent=2` and a final newline.

Formats: docs/checkpoints.md ("NVFP4 on disk", "NVFP4 canonical tensors").

Number format and quantizer (ModelOpt `NVFP4QTensor`, `qtensor/nvfp4_tensor.py`)
----------------------------------------------------------------------------
`quantize_nvfp4(w)` is a transcription of ModelOpt's dynamic-path NVFP4 quantizer, in float32:
  weight_scale_2 = amax(|W|) / (6 * 448)                           (f32; ModelOpt decode multiplier)
  weight_scale   = e4m3( clamp(block_amax / (6 * weight_scale_2), min=2^-9) ), all-zero blocks -> 1.0
                   one per 16 consecutive K elements of a row, shape [N, K/16], row-major
  code           = E2M1( W / (float(weight_scale) * weight_scale_2) ), round to nearest, ties to the
                   even code (ModelOpt `_cast_fp4`: searchsorted + bump at 0.75, 1.75, 3.5), saturating
                   at 6; sign in bit 3 (a negative value that rounds to zero gives code 8, -0)
  packed         = (code[..., 1::2] << 4) | code[..., 0::2]       (low nibble = even element), [N, K/2]
  dequant        = E2M1_VALUES[code] * (float(weight_scale) * weight_scale_2)
Input (activation) scales are ModelOpt's `amax(x) / (6 * 448)`; the activation amax is drawn at random
per expert (there is no calibration data), once for gate/up (same input) and once for down.
ModelOpt's export unifies the per-tensor amax of modules that read the same input
(`export/quant_utils.py::preprocess_linear_fusion`), so gate_proj and up_proj of one expert (and of
the shared expert) get the same weight_scale_2 (from max(amax_gate, amax_up)) and the same input_scale.
`gate_up_global_scale_differ=True` breaks that for expert 1 (expert 0 if there is only one) of every
MoE layer: gate and up are then quantized with their own amax, and up's float weights are scaled by
1.75 first so the two global scales clearly differ (vLLM keeps gate's and warns,
docs/checkpoints.md "NVFP4 canonical tensors").

Formats (docs/checkpoints.md "NVFP4 on disk"), per quantized linear module `P`
---------------------------------------------------------------------------
fmt="modelopt"            P.weight u8 [N, K/2], P.weight_scale f8e4m3 [N, K/16],
                          P.weight_scale_2 f32 [] (scalar), P.input_scale f32 [] (absent with w4a16)
fmt="compressed-tensors"  P.weight_packed u8 [N, K/2] (same bytes), P.weight_scale f8e4m3 [N, K/16]
                          (same bytes), P.weight_global_scale f32 [1] = 1 / weight_scale_2,
                          P.input_global_scale f32 [1] = 1 / input_scale (absent with w4a16)
The compressed-tensors variant is what the official converter (llm-compressor
`entrypoints/convert/converters/modelopt_nvfp4.py`) makes of the ModelOpt one: bytes kept,
`weight` renamed `weight_packed`, global scales replaced by their float32 reciprocals (encode scales).

Configs:
  ModelOpt, `modelopt_config="hf_quant_config"`: only the legacy `hf_quant_config.json`
      {"producer": {"name": "modelopt", "version": ...}, "quantization": {"quant_algo": "NVFP4",
       "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": [...]}}
    (vLLM requires group_size, kv_cache_quant_algo and exclude_modules there: vLLM 0.33.0
    modelopt.py `ModelOptNvFp4Config`).
  ModelOpt, `modelopt_config="config"`: only `config.json["quantization_config"]`, the form ModelOpt's
      `convert_hf_quant_config_format` writes: {"quant_method": "modelopt", "quant_algo": "NVFP4",
       "group_size": 16, "ignore": [...], "config_groups": {"group_0": {"input_activations": {...},
       "weights": {...}, "targets": ["Linear"]}}, "producer": {...}}
  ModelOpt, `modelopt_config="both"` (default): both files, as current ModelOpt exports ship.
  compressed-tensors: `config.json["quantization_config"]` = {"quant_method": "compressed-tensors",
      "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {"format": "nvfp4-pack-quantized",
       "targets": ["Linear"], "weights": {num_bits 4, type float, strategy tensor_group, group_size 16,
       symmetric, dynamic false}, "input_activations": {same, dynamic "local"} | null,
       "output_activations": null}}, "ignore": [...], "quantization_status": "compressed", ...}
w4a16=True: ModelOpt quant_algo "W4A16_NVFP4" (the string vLLM 0.33 `modelopt.py` QUANT_ALGOS and
ModelOpt `convert_hf_config.py` use; config.json group without input_activations); compressed-tensors
input_activations null (preset NVFP4A16). No input scale tensors in either.

Exclusions: everything that is not an NVFP4 expert linear is plain BF16 and listed. ModelOpt
`exclude_modules` / `ignore` are ModelOpt's prefix-wildcard summary (a re-implementation of
`quant_utils._prefix_wildcard_summarize_exclude_modules`, sorted), e.g. "lm_head",
"model.layers.0.self_attn*", "model.layers.0.mlp.gate*", "model.layers.0*" (a dense DeepSeek layer);
compressed-tensors `ignore` lists the exact module names, in module order, as compressed-tensors does.

Architectures
-------------
arch="qwen3_moe"   (Qwen3-30B-A3B style; config `model_type: qwen3_moe`, `num_experts`,
                   `moe_intermediate_size`, `num_experts_per_tok`, `norm_topk_prob`, ...). Every layer is
                   MoE. Per layer L:
  model.layers.L.input_layernorm.weight / post_attention_layernorm.weight   bf16 [H]
  model.layers.L.self_attn.{q,k,v,o}_proj.weight                           bf16 (no biases)
  model.layers.L.self_attn.{q,k}_norm.weight                               bf16 [head_dim]
  model.layers.L.mlp.gate.weight                                          bf16 [E, H]  (router; excluded)
  model.layers.L.mlp.experts.e.{gate,up}_proj.*  NVFP4 [I, H]; ...down_proj.* NVFP4 [H, I]
arch="deepseek_v3" (DeepSeek-V3 / R1 style; `model_type: deepseek_v3`, `n_routed_experts`,
                   `moe_intermediate_size`, `first_k_dense_replace`, `n_shared_experts`, noaux_tc
                   sigmoid routing). Layers < first_k_dense_replace are dense (bf16 MLP, excluded);
                   the others are MoE. Per layer L:
  self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
             o_proj}.weight                                               bf16 (a reduced MLA set)
  dense:  mlp.{gate,up,down}_proj.weight                                   bf16 [I_dense, H] / [H, I_dense]
  MoE:    mlp.gate.weight bf16 [E, H], mlp.gate.e_score_correction_bias f32 [E],
          mlp.experts.e.{gate,up,down}_proj.*                              NVFP4
          mlp.shared_experts.{gate,up,down}_proj.*   NVFP4 (I_shared = moe_intermediate_size *
                                                     n_shared_experts), bf16 `.weight` when
                                                     quantize_shared_experts=False
plus model.embed_tokens.weight bf16 [V, H], model.norm.weight bf16 [H], lm_head.weight bf16 [V, H]
(tie_word_embeddings false, as in both families).

Files: config.json, generation_config.json, tokenizer.json, tokenizer_config.json (+ vocab.json and
merges.txt for Qwen3, as Qwen repos ship), README.md, hf_quant_config.json (ModelOpt, unless
modelopt_config="config"), model-0000k-of-0000n.safetensors shards (transformers naming, metadata
{"format": "pt"}, tensors in model order, cut by bytes so a layer can straddle shards) and
model.safetensors.index.json ({"metadata": {"total_size": ...}, "weight_map": {...}}).

Choices where the real format was not pinned down (and what decided them)
-------------------------------------------------------------------------
* DeepSeek shared experts are NVFP4 (with input_scale), routers and the dense first layers BF16: as in
  a ModelOpt NVFP4 export of a DeepSeek-V3-architecture model whose tensor listing was found in a
  public repository (GLM-5.1 NVFP4: shared_experts.* u8 / e4m3 / f32 [] scalars, mlp.gate.weight
  bf16, mlp.gate.e_score_correction_bias f32, dense mlp.*_proj bf16, attention bf16).
  nvidia/DeepSeek-R1-FP4 itself was not checked. quantize_shared_experts=False gives BF16
  shared experts (then excluded).
* Attention is BF16 and excluded in every variant (nvidia/DeepSeek-R1-FP4's card: only linear
  operators in the MoE blocks quantized; RedHatAI Qwen3 NVFP4 quantizes attention too, but the brief
  asks for BF16 non-MoE tensors).
* The DeepSeek router (`mlp.gate`) is not a Linear in the HF/DeepSeek code, so it is not listed in
  the exclude/ignore lists; the Qwen3 router is an nn.Linear and is listed.
* kv_cache_quant_algo is null (no k/v scales written); producer version strings are stand-ins.
* DeepSeek configs carry no `auto_map` and no MTP layer (num_nextn_predict_layers 0): the real repos
  ship remote-code .py files and layer-61 MTP weights, which vLLM's main model does not load.
* Tokenizer and generation files are small stand-ins with the real file names and special tokens
  remapped into a tiny byte-level BPE vocabulary; mxconvert copies them unchanged.
* edge_blocks=True plants, in expert 0 gate_proj of each MoE layer, one all-zero 16-block (block
  scale 1.0, codes 0) and one tiny block whose e4m3 block scale is subnormal (vLLM 0.33.0's Marlin
  zeroes those: docs/layouts.md "NVFP4 scales"). Off by default and in the committed examples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import save_file

# ----------------------------------------------------------------------------------------------
# NVFP4: E2M1 values, FP8 E4M3 block scales per 16 values, FP32 per-tensor global scale
# ----------------------------------------------------------------------------------------------

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E2M1_MAGNITUDES = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32)
_E2M1_MIDPOINTS = (_E2M1_MAGNITUDES[1:] + _E2M1_MAGNITUDES[:-1]) / 2  # .25 .75 1.25 1.75 2.5 3.5 5
GROUP_SIZE = 16
FP4_MAX = 6.0
FP8_E4M3_MAX = 448.0
_MIN_BLOCK_SCALE = 2.0**-9  # smallest e4m3 subnormal; ModelOpt clamps block scales up to it


class NVFP4Weight(NamedTuple):
    """One NVFP4-quantized linear weight, ModelOpt conventions (decode multipliers)."""

    packed: torch.Tensor  # uint8 [..., N, K/2], low nibble = even element
    weight_scale: torch.Tensor  # float8_e4m3fn [..., N, K/16]
    weight_scale_2: torch.Tensor  # float32 [] : W ~= e2m1 * float(weight_scale) * weight_scale_2
    input_scale: torch.Tensor | None  # float32 [] (activation amax / 2688), None for W4A16


def global_scale_for_amax(amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's per-tensor decode scale: amax / (6 * 448), float32 scalar."""
    return (amax.float() / (FP4_MAX * FP8_E4M3_MAX)).reshape(())


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round float32 `x` to E2M1 codes (uint8 0..15): nearest magnitude, ties to the even code,
    saturating at 6; bit 3 = sign (x < 0), so small negatives give code 8 (-0)."""
    mag = x.abs()
    lo = torch.bucketize(mag, _E2M1_MIDPOINTS, right=False)  # at a tie: the lower code
    hi = torch.bucketize(mag, _E2M1_MIDPOINTS, right=True)  # at a tie: the upper code
    code = torch.where((lo != hi) & (lo % 2 == 1), hi, lo)
    code = code | torch.where(x < 0, 8, 0)
    return code.to(torch.uint8)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., K] -> bytes [..., K/2], byte j = code[2j] | code[2j+1] << 4."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """bytes uint8 [..., K/2] -> codes uint8 [..., K] (inverse of pack_fp4)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_nvfp4(
    w: torch.Tensor, weight_scale_2: torch.Tensor | None = None, input_scale: torch.Tensor | None = None
) -> NVFP4Weight:
    """Quantize `w[..., N, K]` (K % 16 == 0) along its last dim, as ModelOpt's NVFP4QTensor does.

    weight_scale_2 defaults to amax(|w|) / 2688 (pass one to share it between fused modules)."""
    if w.shape[-1] % GROUP_SIZE:
        raise ValueError(f"last dim {w.shape[-1]} is not a multiple of {GROUP_SIZE}")
    x = w.to(torch.float32)
    if weight_scale_2 is None:
        weight_scale_2 = global_scale_for_amax(x.abs().amax())
    ws2 = weight_scale_2.to(torch.float32).reshape(())
    if not torch.isfinite(ws2) or ws2 <= 0:
        raise ValueError("weight_scale_2 must be finite and > 0 (an all-zero tensor cannot be quantized)")
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, GROUP_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    scale = block_amax / (FP4_MAX * ws2)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = scale.clamp(min=_MIN_BLOCK_SCALE).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.to(torch.float32) * ws2).unsqueeze(-1)
    codes = e2m1_codes(scaled).reshape(x.shape)
    return NVFP4Weight(
        pack_fp4(codes),
        scale.contiguous(),
        ws2.clone(),
        None if input_scale is None else input_scale.to(torch.float32).reshape(()).clone(),
    )


def dequantize_nvfp4(
    packed: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    *,
    global_is_encode: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """packed u8 [..., N, K/2] + block scales e4m3 [..., N, K/16] + global scale -> values [..., N, K].

    global_scale is a decode multiplier (ModelOpt `weight_scale_2`), or with global_is_encode=True an
    encode scale (compressed-tensors `weight_global_scale`) that is divided by. It may be a scalar or
    broadcast against [..., N, K/16] (e.g. shape [E, 1, 1] for stacked experts)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    codes = unpack_fp4(packed).long()
    vals = lut[codes].reshape(*codes.shape[:-1], codes.shape[-1] // GROUP_SIZE, GROUP_SIZE)
    g = torch.as_tensor(global_scale, dtype=torch.float32)
    s = weight_scale.to(torch.float32)
    s = s / g if global_is_encode else s * g
    return (vals * s.unsqueeze(-1)).reshape(codes.shape).to(dtype)


def nvfp4_error_bound(w: torch.Tensor, q: NVFP4Weight) -> torch.Tensor:
    """Per-element bound on |w - dequant(q)| for a round-to-nearest quantization with q's scales:
    half the E2M1 gap at |w| / s (0.25 s below 2, 0.5 s below 4, 1 s above), s the block's
    effective scale float(weight_scale) * weight_scale_2; beyond 6 s it is |w| - 6 s (saturation)."""
    x = w.to(torch.float32)
    s = (q.weight_scale.to(torch.float32) * q.weight_scale_2).repeat_interleave(GROUP_SIZE, dim=-1)
    r = x.abs() / s
    half_gap = torch.where(r <= 2, 0.25, torch.where(r <= 4, 0.5, 1.0))
    return torch.maximum(half_gap * s, x.abs() - FP4_MAX * s)


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------

FORMATS = ("modelopt", "compressed-tensors")
ARCHS = ("qwen3_moe", "deepseek_v3")
MODELOPT_CONFIGS = ("both", "hf_quant_config", "config")
MODELOPT_VERSION = "0.37.0"  # stand-in producer version
CT_VERSION = "0.12.2"  # stand-in compressed-tensors version
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TinyNvfp4Config:
    fmt: str = "modelopt"
    arch: str = "qwen3_moe"
    num_layers: int | None = None  # None: 2 MoE layers (deepseek: first_k_dense_replace + 2)
    num_experts: int = 4
    hidden_size: int = 256
    moe_intermediate_size: int = 128
    seed: int = 0
    w4a16: bool = False
    gate_up_global_scale_differ: bool = False
    vocab_size: int = 288
    experts_per_token: int = 2
    intermediate_size: int = 192  # deepseek dense-layer MLP width (qwen3: config value only)
    num_attention_heads: int = 2
    num_key_value_heads: int = 1  # qwen3
    head_dim: int = 32  # qwen3
    first_k_dense_replace: int = 1  # deepseek
    n_shared_experts: int = 1  # deepseek
    quantize_shared_experts: bool = True  # deepseek
    q_lora_rank: int = 64  # deepseek MLA
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 16
    v_head_dim: int = 16
    modelopt_config: str = "both"
    edge_blocks: bool = False

    @property
    def n_layers(self) -> int:
        if self.num_layers is not None:
            return self.num_layers
        return 2 + (self.first_k_dense_replace if self.arch == "deepseek_v3" else 0)

    def is_moe_layer(self, layer: int) -> bool:
        return self.arch != "deepseek_v3" or layer >= self.first_k_dense_replace

    @property
    def moe_layers(self) -> list[int]:
        return [L for L in range(self.n_layers) if self.is_moe_layer(L)]

    @property
    def shared_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.n_shared_experts

    def validate(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, not {self.fmt!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, not {self.arch!r}")
        if self.modelopt_config not in MODELOPT_CONFIGS:
            raise ValueError(f"modelopt_config must be one of {MODELOPT_CONFIGS}")
        for name in (
            "num_experts",
            "hidden_size",
            "moe_intermediate_size",
            "vocab_size",
            "experts_per_token",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.n_layers < 1:
            raise ValueError("num_layers must be >= 1")
        for name in ("hidden_size", "moe_intermediate_size"):
            if getattr(self, name) % GROUP_SIZE:
                raise ValueError(f"{name} must be a multiple of {GROUP_SIZE} (NVFP4 blocks)")
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must be <= num_experts")
        if self.arch == "qwen3_moe" and self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.arch == "deepseek_v3":
            if self.first_k_dense_replace < 0 or self.n_shared_experts < 0:
                raise ValueError("first_k_dense_replace and n_shared_experts must be >= 0")
            if self.quantize_shared_experts and self.n_shared_experts and self.shared_intermediate_size % GROUP_SIZE:
                raise ValueError("shared expert width must be a multiple of 16")
        if not self.moe_layers:
            raise ValueError("the model has no MoE layer")
        if self.vocab_size < _tokenizer_size(self.arch):
            raise ValueError(f"vocab_size must be >= {_tokenizer_size(self.arch)} (tokenizer size)")

    @property
    def n_group(self) -> int:  # deepseek grouped routing: 2 groups when the experts split evenly
        return 2 if self.num_experts % 2 == 0 and self.num_experts >= 4 else 1

    @property
    def topk_group(self) -> int:  # enough groups to hold experts_per_token experts
        per_group = self.num_experts // self.n_group
        return min(self.n_group, -(-self.experts_per_token // per_group))


# ----------------------------------------------------------------------------------------------
# Tokenizer stand-ins
# ----------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100..."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("o", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("Ġ", "s"),
    ("e", "n"),
    ("a", "t"),
    ("o", "r"),
    ("Ġ", "o"),
    ("Ġ", "w"),
    ("e", "s"),
    ("i", "s"),
    ("Ġ", "c"),
    ("i", "t"),
    ("a", "l"),
]
# Special tokens. Qwen3: after the regular tokens (as in Qwen's vocab, 151643..). DeepSeek-V3: ids
# 0, 1, 2 (bos, eos, pad), before the regular tokens, as in DeepSeek's vocab.
_QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]


def _tokenizer_size(arch: str) -> int:
    return 256 + len(_MERGES) + len(_QWEN3_SPECIALS if arch == "qwen3_moe" else _DEEPSEEK_SPECIALS)


def _vocab(arch: str) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """(BPE model vocab: token -> id, [(id, special token)])."""
    b2u = _bytes_to_unicode()
    if arch == "qwen3_moe":
        base, specials = 0, [(256 + len(_MERGES) + i, t) for i, t in enumerate(_QWEN3_SPECIALS)]
    else:
        base, specials = len(_DEEPSEEK_SPECIALS), list(enumerate(_DEEPSEEK_SPECIALS))
    vocab = {t: i for i, t in specials} if base else {}  # DeepSeek's BPE vocab holds its specials (ids 0-2)
    vocab.update({b2u[b]: base + b for b in range(256)})
    for i, (a, b) in enumerate(_MERGES):
        vocab[a + b] = base + 256 + i
    return vocab, specials


def _special_id(arch: str, token: str) -> int:
    return dict((t, i) for i, t in _vocab(arch)[1])[token]


def tokenizer_json(c: TinyNvfp4Config) -> dict:
    vocab, specials = _vocab(c.arch)
    added = [
        {
            "content": t,
            "id": i,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in specials
    ]
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    return {
        "added_tokens": added,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "byte_fallback": False,
            "continuing_subword_prefix": "",
            "dropout": None,
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "ignore_merges": False,
            "merges": [[a, b] for a, b in _MERGES],
            "type": "BPE",
            "unk_token": None,
            "vocab": vocab,
        },
        "normalizer": {"type": "NFC"} if c.arch == "qwen3_moe" else None,
        "padding": None,
        "post_processor": {"type": "ByteLevel", **byte_level},
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "truncation": None,
        "version": "1.0",
    }


_QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
_DEEPSEEK_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{ '<｜User｜>' + message['content'] }}{%- else %}{{ '<｜Assistant｜>' + message['content']"
    " + eos_token }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<｜Assistant｜>' }}"
    "{%- endif %}"
)


def tokenizer_config(c: TinyNvfp4Config) -> dict:
    _, specials = _vocab(c.arch)
    decoder = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in specials
    }
    if c.arch == "qwen3_moe":
        return {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": decoder,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "chat_template": _QWEN3_CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 131072,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "bos_token": _DEEPSEEK_SPECIALS[0],
        "chat_template": _DEEPSEEK_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": _DEEPSEEK_SPECIALS[1],
        "legacy": True,
        "model_max_length": 163840,
        "pad_token": _DEEPSEEK_SPECIALS[1],
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizerFast",
        "unk_token": None,
        "use_default_system_prompt": False,
    }


# ----------------------------------------------------------------------------------------------
# config.json, generation_config.json, quantization configs
# ----------------------------------------------------------------------------------------------


def model_config(c: TinyNvfp4Config) -> dict:
    """config.json without quantization_config: the keys of the published Qwen3-30B-A3B /
    DeepSeek-V3 configs with tiny values."""
    if c.arch == "qwen3_moe":
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": _special_id(c.arch, "<|endoftext|>"),
            "decoder_sparse_step": 1,
            "eos_token_id": _special_id(c.arch, "<|im_end|>"),
            "head_dim": c.head_dim,
            "hidden_act": "silu",
            "hidden_size": c.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": c.intermediate_size,
            "max_position_embeddings": 40960,
            "max_window_layers": c.n_layers,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": c.moe_intermediate_size,
            "norm_topk_prob": True,
            "num_attention_heads": c.num_attention_heads,
            "num_experts": c.num_experts,
            "num_experts_per_tok": c.experts_per_token,
            "num_hidden_layers": c.n_layers,
            "num_key_value_heads": c.num_key_value_heads,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": c.vocab_size,
        }
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": c.first_k_dense_replace,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "kv_lora_rank": c.kv_lora_rank,
        "max_position_embeddings": 163840,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": c.moe_intermediate_size,
        "moe_layer_freq": 1,
        "n_group": c.n_group,
        "n_routed_experts": c.num_experts,
        "n_shared_experts": c.n_shared_experts,
        "norm_topk_prob": True,
        "num_attention_heads": c.num_attention_heads,
        "num_experts_per_tok": c.experts_per_token,
        "num_hidden_layers": c.n_layers,
        "num_key_value_heads": c.num_attention_heads,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": c.q_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": c.topk_group,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "v_head_dim": c.v_head_dim,
        "vocab_size": c.vocab_size,
    }


def generation_config(c: TinyNvfp4Config) -> dict:
    if c.arch == "qwen3_moe":
        eot, im_end = _special_id(c.arch, "<|endoftext|>"), _special_id(c.arch, "<|im_end|>")
        return {
            "bos_token_id": eot,
            "do_sample": True,
            "eos_token_id": [im_end, eot],
            "pad_token_id": eot,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.51.0",
        }
    return {
        "_from_model_config": True,
        "bos_token_id": 0,
        "do_sample": True,
        "eos_token_id": 1,
        "temperature": 0.6,
        "top_p": 0.95,
        "transformers_version": "4.46.3",
    }


def summarize_exclude_modules(unquantized: list[str], quantized: list[str]) -> list[str]:
    """ModelOpt's prefix-wildcard summary of the unquantized module names (re-implemented from
    `modelopt/torch/export/quant_utils.py::_prefix_wildcard_summarize_exclude_modules`), sorted."""
    negative: set[str] = set()
    for name in quantized:
        negative.add(name)
        negative.update(name[:i] + "*" for i in range(len(name) + 1))

    def candidates(name: str):
        for i, ch in enumerate(name):
            if ch == ".":
                yield [name[:i] + "*"]
                yield [name[:i], name[:i] + ".*"]
        yield [name]

    summary: set[str] = set()
    for name in unquantized:
        chosen: list[str] = []
        for wildcards in candidates(name):
            if any(w in negative for w in wildcards):
                continue
            if all(w in summary for w in wildcards):
                chosen = []
                break
            chosen = wildcards
            break
        summary.update(chosen)
    return sorted(summary)


def _modelopt_quant_algo(c: TinyNvfp4Config) -> str:
    return "W4A16_NVFP4" if c.w4a16 else "NVFP4"


def hf_quant_config(c: TinyNvfp4Config, exclude: list[str]) -> dict:
    """The legacy ModelOpt hf_quant_config.json (docs/checkpoints.md "NVFP4 on disk")."""
    return {
        "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
        "quantization": {
            "exclude_modules": exclude,
            "group_size": GROUP_SIZE,
            "kv_cache_quant_algo": None,
            "quant_algo": _modelopt_quant_algo(c),
        },
    }


def modelopt_quantization_config(c: TinyNvfp4Config, exclude: list[str]) -> dict:
    """config.json quantization_config of a ModelOpt export (ModelOpt `convert_hf_quant_config_format`;
    plus group_size, which vLLM 0.33.0 modelopt.py reads)."""
    fp4 = {"dynamic": False, "group_size": GROUP_SIZE, "num_bits": 4, "type": "float"}
    group = {"targets": ["Linear"], "weights": dict(fp4)}
    if not c.w4a16:
        group["input_activations"] = dict(fp4)
    return {
        "config_groups": {"group_0": group},
        "group_size": GROUP_SIZE,
        "ignore": exclude,
        "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
        "quant_algo": _modelopt_quant_algo(c),
        "quant_method": "modelopt",
    }


def ct_quantization_config(c: TinyNvfp4Config, ignore: list[str]) -> dict:
    """config.json quantization_config of a compressed-tensors NVFP4 (or NVFP4A16) checkpoint (docs/checkpoints.md)."""
    args = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": GROUP_SIZE,
        "num_bits": 4,
        "observer": "minmax",
        "observer_kwargs": {},
        "strategy": "tensor_group",
        "symmetric": True,
        "type": "float",
    }
    acts = None if c.w4a16 else dict(args, dynamic="local")
    return {
        "config_groups": {
            "group_0": {
                "format": "nvfp4-pack-quantized",
                "input_activations": acts,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": args,
            }
        },
        "format": "nvfp4-pack-quantized",
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": CT_VERSION,
    }


# ----------------------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------------------


def _gen(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"tiny-nvfp4-moe:{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
    return (torch.randn(shape, generator=_gen(seed, name), dtype=torch.float32) * std + mean).to(torch.bfloat16)


def _linear_weight(seed: int, name: str, shape: tuple[int, int]) -> torch.Tensor:
    """bf16 [N, K]: per-row std log-uniform in [2^-7, 2^-4] times a per-module factor in [2^-1, 2^1],
    so block scales spread over the e4m3 range and global scales differ between experts."""
    g = _gen(seed, name)
    n, k = shape
    module_log2 = torch.rand((), generator=g, dtype=torch.float32) * 2.0 - 1.0
    row_log2 = torch.rand((n, 1), generator=g, dtype=torch.float32) * 3.0 - 7.0
    x = torch.randn(shape, generator=g, dtype=torch.float32) * torch.exp2(row_log2 + module_log2)
    return x.to(torch.bfloat16)


def _activation_amax(seed: int, name: str) -> torch.Tensor:
    """A stand-in calibrated activation amax, log-uniform in [1, 16]."""
    return torch.exp2(torch.rand((), generator=_gen(seed, "act:" + name), dtype=torch.float32) * 4.0)


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass
class TinyNvfp4Tensors:
    """Everything in one tiny checkpoint.

    tensors:    on-disk name -> tensor, in shard-writing (model) order, for `config.fmt`
    reference:  quantized module name (e.g. "model.layers.1.mlp.experts.0.gate_proj") -> the bf16
                weight [N, K] it was quantized from
    quantized:  same keys -> NVFP4Weight (ModelOpt conventions: weight_scale_2 and input_scale are
                decode multipliers; compressed-tensors files hold their reciprocals)
    unquantized_linears: module names of the BF16 linears (what the exclude/ignore lists cover)
    """

    config: TinyNvfp4Config
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    reference: dict[str, torch.Tensor] = field(default_factory=dict)
    quantized: dict[str, NVFP4Weight] = field(default_factory=dict)
    unquantized_linears: list[str] = field(default_factory=list)

    def expert_module(self, layer: int, expert: int, proj: str) -> str:
        return f"model.layers.{layer}.mlp.experts.{expert}.{proj}"

    def stacked_reference(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H] = [gate; up] rows, w2 [E, H, I]) bf16, vLLM's w13 half order."""
        E = self.config.num_experts
        w13 = torch.stack(
            [
                torch.cat(
                    [
                        self.reference[self.expert_module(layer, e, "gate_proj")],
                        self.reference[self.expert_module(layer, e, "up_proj")],
                    ]
                )
                for e in range(E)
            ]
        )
        w2 = torch.stack([self.reference[self.expert_module(layer, e, "down_proj")] for e in range(E)])
        return w13, w2


def _quantize_group(
    seed: int,
    names: dict[str, tuple[int, int]],
    input_name: str,
    *,
    unify: bool,
    w4a16: bool,
    scale: dict[str, float] | None = None,
    edge: str | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, NVFP4Weight]]:
    """Random bf16 weights for the modules `names` (module -> [N, K]) that read one input, quantized.
    unify: one weight_scale_2 from the max amax (ModelOpt preprocess_linear_fusion); the input scale is
    shared always (same input)."""
    ref = {}
    for mod, shape in names.items():
        w = _linear_weight(seed, mod, shape)
        if scale and mod in scale:
            w = (w.float() * scale[mod]).to(torch.bfloat16)
        if edge == mod:
            w = w.clone()
            w[0, :GROUP_SIZE] = 0  # an all-zero block: block scale 1.0, codes 0
            w[1, :GROUP_SIZE] = (w[1, :GROUP_SIZE].float() * 2.0**-14).to(torch.bfloat16)  # subnormal scale
        ref[mod] = w
    input_scale = None if w4a16 else global_scale_for_amax(_activation_amax(seed, input_name))
    shared_ws2 = None
    if unify:
        shared_ws2 = global_scale_for_amax(torch.stack([w.float().abs().amax() for w in ref.values()]).amax())
    q = {mod: quantize_nvfp4(w, shared_ws2, input_scale) for mod, w in ref.items()}
    return ref, q


def _quantized_tensors(fmt: str, prefix: str, q: NVFP4Weight) -> dict[str, torch.Tensor]:
    if fmt == "modelopt":
        out = {
            prefix + ".weight": q.packed,
            prefix + ".weight_scale": q.weight_scale,
            prefix + ".weight_scale_2": q.weight_scale_2.reshape(()),
        }
        if q.input_scale is not None:
            out[prefix + ".input_scale"] = q.input_scale.reshape(())
        return out
    out = {
        prefix + ".weight_packed": q.packed,
        prefix + ".weight_scale": q.weight_scale,
        prefix + ".weight_global_scale": (1.0 / q.weight_scale_2).reshape(1).to(torch.float32),
    }
    if q.input_scale is not None:
        out[prefix + ".input_global_scale"] = (1.0 / q.input_scale).reshape(1).to(torch.float32)
    return out


def build_tiny_nvfp4_tensors(c: TinyNvfp4Config | None = None, **kw) -> TinyNvfp4Tensors:
    """All tensors of the tiny checkpoint for `c.fmt`, plus the float references and quantized pieces."""
    c = c or TinyNvfp4Config(**kw)
    c.validate()
    s, H, V, E, I = c.seed, c.hidden_size, c.vocab_size, c.num_experts, c.moe_intermediate_size
    out = TinyNvfp4Tensors(config=c)
    t = out.tensors
    t["model.embed_tokens.weight"] = _normal(s, "model.embed_tokens.weight", (V, H), 0.02)
    for L in range(c.n_layers):
        p = f"model.layers.{L}."
        layer: dict[str, torch.Tensor] = {}
        bf16_linears: dict[str, tuple[int, int]] = {}
        layer[p + "input_layernorm.weight"] = _normal(s, p + "input_layernorm.weight", (H,), 0.1, 1.0)
        layer[p + "post_attention_layernorm.weight"] = _normal(s, p + "post_attention_layernorm.weight", (H,), 0.1, 1.0)
        if c.arch == "qwen3_moe":
            nq, nkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            bf16_linears.update(
                {
                    p + "self_attn.q_proj": (nq, H),
                    p + "self_attn.k_proj": (nkv, H),
                    p + "self_attn.v_proj": (nkv, H),
                    p + "self_attn.o_proj": (H, nq),
                }
            )
            for n in ("q_norm", "k_norm"):
                layer[p + f"self_attn.{n}.weight"] = _normal(s, p + f"self_attn.{n}.weight", (c.head_dim,), 0.1, 1.0)
        else:
            nh, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
            bf16_linears.update(
                {
                    p + "self_attn.q_a_proj": (c.q_lora_rank, H),
                    p + "self_attn.q_b_proj": (nh * qk, c.q_lora_rank),
                    p + "self_attn.kv_a_proj_with_mqa": (c.kv_lora_rank + c.qk_rope_head_dim, H),
                    p + "self_attn.kv_b_proj": (nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
                    p + "self_attn.o_proj": (H, nh * c.v_head_dim),
                }
            )
            layer[p + "self_attn.q_a_layernorm.weight"] = _normal(
                s, p + "self_attn.q_a_layernorm.weight", (c.q_lora_rank,), 0.1, 1.0
            )
            layer[p + "self_attn.kv_a_layernorm.weight"] = _normal(
                s, p + "self_attn.kv_a_layernorm.weight", (c.kv_lora_rank,), 0.1, 1.0
            )
        if not c.is_moe_layer(L):  # a dense DeepSeek layer: BF16 MLP
            Id = c.intermediate_size
            bf16_linears.update(
                {p + "mlp.gate_proj": (Id, H), p + "mlp.up_proj": (Id, H), p + "mlp.down_proj": (H, Id)}
            )
        else:
            if c.arch == "qwen3_moe":
                bf16_linears[p + "mlp.gate"] = (E, H)  # nn.Linear router
            else:
                layer[p + "mlp.gate.weight"] = _normal(s, p + "mlp.gate.weight", (E, H), 0.02)
                layer[p + "mlp.gate.e_score_correction_bias"] = (
                    torch.randn((E,), generator=_gen(s, p + "mlp.gate.e_score_correction_bias")) * 0.01
                )
            differ_expert = (1 if E > 1 else 0) if c.gate_up_global_scale_differ else -1
            groups: list[tuple[str, int, bool]] = [(p + f"mlp.experts.{e}.", I, e != differ_expert) for e in range(E)]
            if c.arch == "deepseek_v3" and c.n_shared_experts:
                if c.quantize_shared_experts:
                    groups.append((p + "mlp.shared_experts.", c.shared_intermediate_size, True))
                else:
                    Is = c.shared_intermediate_size
                    bf16_linears.update(
                        {
                            p + "mlp.shared_experts.gate_proj": (Is, H),
                            p + "mlp.shared_experts.up_proj": (Is, H),
                            p + "mlp.shared_experts.down_proj": (H, Is),
                        }
                    )
            for mp, width, unify in groups:
                gate, up, down = mp + "gate_proj", mp + "up_proj", mp + "down_proj"
                edge = gate if (c.edge_blocks and mp == p + "mlp.experts.0.") else None
                ref, q = _quantize_group(
                    s,
                    {gate: (width, H), up: (width, H)},
                    mp + "gate_up",
                    unify=unify,
                    w4a16=c.w4a16,
                    scale=None if unify else {up: 1.75},
                    edge=edge,
                )
                ref2, q2 = _quantize_group(s, {down: (H, width)}, down, unify=True, w4a16=c.w4a16)
                ref.update(ref2)
                q.update(q2)
                out.reference.update(ref)
                out.quantized.update(q)
                for mod in (gate, up, down):
                    layer.update(_quantized_tensors(c.fmt, mod, q[mod]))
        for mod, shape in bf16_linears.items():
            layer[mod + ".weight"] = _normal(s, mod + ".weight", shape, 0.02)
        out.unquantized_linears.extend(bf16_linears)  # module order
        for name in sorted(layer, key=_natural_key):
            t[name] = layer[name]
    t["model.norm.weight"] = _normal(s, "model.norm.weight", (H,), 0.1, 1.0)
    t["lm_head.weight"] = _normal(s, "lm_head.weight", (V, H), 0.02)
    out.unquantized_linears.append("lm_head")
    return out


def exclude_list(tt: TinyNvfp4Tensors) -> list[str]:
    """The exclude/ignore list of the checkpoint's quantization config."""
    if tt.config.fmt == "modelopt":
        return summarize_exclude_modules(tt.unquantized_linears, list(tt.quantized))
    return list(tt.unquantized_linears)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _split_by_bytes(tensors: dict[str, torch.Tensor], num_shards: int) -> list[list[str]]:
    """Cut the ordered tensors into `num_shards` contiguous, non-empty runs of about equal bytes."""
    names = list(tensors)
    if not 1 <= num_shards <= len(names):
        raise ValueError(f"num_shards must be in 1..{len(names)}")
    total = sum(_nbytes(tensors[n]) for n in names)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    start, k = 0, 0
    for i, n in enumerate(names):
        want = (start * num_shards) // total
        k = min(max(want, num_shards - (len(names) - i)), k + 1) if i else 0
        shards[k].append(n)
        start += _nbytes(tensors[n])
    assert all(shards), shards
    return shards


def shard_names(num_shards: int) -> list[str]:
    """transformers' save_pretrained names (a lone shard is model.safetensors, without an index)."""
    if num_shards == 1:
        return ["model.safetensors"]
    return [f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors" for k in range(num_shards)]


def _readme(c: TinyNvfp4Config, name: str) -> str:
    fmt = "ModelOpt (modelopt_fp4)" if c.fmt == "modelopt" else "compressed-tensors (nvfp4-pack-quantized)"
    algo = "W4A16 (weight-only)" if c.w4a16 else "W4A4"
    return (
        f"# {name}\n\n"
        f"A tiny random {c.arch} checkpoint in the real {fmt} NVFP4 on-disk format ({algo}; NVFP4 MoE\n"
        "experts, BF16 elsewhere), written by `examples/make_tiny_nvfp4_moe.py` for tests. It is not a\n"
        "trained model.\n\n"
        f"layers={c.n_layers} moe_layers={c.moe_layers} experts={c.num_experts} hidden={c.hidden_size} "
        f"moe_intermediate={c.moe_intermediate_size} vocab={c.vocab_size} seed={c.seed}\n"
    )


def write_tiny_nvfp4_moe(
    out_dir: str | Path,
    *,
    fmt: str = "modelopt",
    arch: str = "qwen3_moe",
    num_layers: int | None = None,
    num_experts: int = 4,
    hidden_size: int = 256,
    moe_intermediate_size: int = 128,
    seed: int = 0,
    w4a16: bool = False,
    gate_up_global_scale_differ: bool = False,
    num_shards: int = 2,
    overwrite: bool = False,
    **extra,
) -> Path:
    """Write a tiny NVFP4 MoE checkpoint under `out_dir` and return `out_dir` (see the module docstring).

    num_layers: hidden layers (None: 2 MoE layers; for deepseek_v3 that is first_k_dense_replace + 2).
    extra: any other TinyNvfp4Config field (vocab_size, experts_per_token, intermediate_size,
    first_k_dense_replace, n_shared_experts, quantize_shared_experts, modelopt_config, edge_blocks, ...).
    `out_dir` must be absent or empty, unless overwrite=True, which first removes a previous tiny
    checkpoint there (a folder holding config.json; anything else is refused)."""
    unknown = set(extra) - set(TinyNvfp4Config.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown arguments: {sorted(unknown)}")
    c = TinyNvfp4Config(
        fmt=fmt,
        arch=arch,
        num_layers=num_layers,
        num_experts=num_experts,
        hidden_size=hidden_size,
        moe_intermediate_size=moe_intermediate_size,
        seed=seed,
        w4a16=w4a16,
        gate_up_global_scale_differ=gate_up_global_scale_differ,
        **extra,
    )
    c.validate()
    names = shard_names(num_shards)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty (pass overwrite=True to replace it)")
        if not (out / "config.json").is_file():
            raise FileExistsError(f"refusing to overwrite {out}: it does not look like a checkpoint")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    tt = build_tiny_nvfp4_tensors(c)
    excl = exclude_list(tt)
    cfg = model_config(c)
    if c.fmt == "modelopt":
        if c.modelopt_config in ("both", "hf_quant_config"):
            _write_json(out / "hf_quant_config.json", hf_quant_config(c, excl))
        if c.modelopt_config in ("both", "config"):
            cfg["quantization_config"] = modelopt_quantization_config(c, excl)
    else:
        cfg["quantization_config"] = ct_quantization_config(c, excl)
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", generation_config(c))
    _write_json(out / "tokenizer.json", tokenizer_json(c))
    _write_json(out / "tokenizer_config.json", tokenizer_config(c))
    if c.arch == "qwen3_moe":
        _write_json(out / "vocab.json", _vocab(c.arch)[0])
        (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _MERGES), encoding="utf-8")
    (out / "README.md").write_text(_readme(c, out.name), encoding="utf-8")

    groups = _split_by_bytes(tt.tensors, num_shards)
    weight_map = {}
    for fname, group in zip(names, groups):
        save_file({n: tt.tensors[n].contiguous() for n in group}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    if num_shards > 1:
        total = sum(_nbytes(x) for x in tt.tensors.values())
        _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return out


#: The committed examples: folder name -> write_tiny_nvfp4_moe arguments. Qwen3: H = 256, I = 128
#: (every backend's alignment met). DeepSeek: H = 128, I = 96, so TRT-LLM pads I to 128 and hidden to
#: 256, Marlin pads I to 128, and FI/vLLM CUTLASS refuse (2I = 192 not a multiple of 128; docs/layouts.md "CUTLASS").
COMMITTED_EXAMPLES: dict[str, dict] = {
    "tiny-nvfp4-modelopt-qwen3": dict(fmt="modelopt", arch="qwen3_moe", modelopt_config="both"),
    "tiny-nvfp4-ct-qwen3": dict(fmt="compressed-tensors", arch="qwen3_moe"),
    "tiny-nvfp4-modelopt-deepseek": dict(
        fmt="modelopt", arch="deepseek_v3", hidden_size=128, moe_intermediate_size=96, modelopt_config="hf_quant_config"
    ),
    "tiny-nvfp4-ct-deepseek": dict(
        fmt="compressed-tensors", arch="deepseek_v3", hidden_size=128, moe_intermediate_size=96
    ),
}


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write one variant there (replaced if it holds a checkpoint); without --out, "
        "regenerate the four committed examples under examples/",
    )
    ap.add_argument("--fmt", choices=FORMATS, default="modelopt")
    ap.add_argument("--arch", choices=ARCHS, default="qwen3_moe")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--moe-intermediate", type=int, default=128)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--w4a16", action="store_true")
    ap.add_argument("--gate-up-global-scale-differ", action="store_true")
    ap.add_argument("--modelopt-config", choices=MODELOPT_CONFIGS, default="both")
    ap.add_argument("--bf16-shared-experts", action="store_true", help="deepseek: leave shared experts BF16")
    ap.add_argument("--edge-blocks", action="store_true")
    a = ap.parse_args(argv)
    if a.out is None:
        jobs = [(here / name, kw) for name, kw in COMMITTED_EXAMPLES.items()]
    else:
        jobs = [
            (
                a.out,
                dict(
                    fmt=a.fmt,
                    arch=a.arch,
                    num_layers=a.layers,
                    num_experts=a.experts,
                    hidden_size=a.hidden,
                    moe_intermediate_size=a.moe_intermediate,
                    num_shards=a.shards,
                    seed=a.seed,
                    w4a16=a.w4a16,
                    gate_up_global_scale_differ=a.gate_up_global_scale_differ,
                    modelopt_config=a.modelopt_config,
                    quantize_shared_experts=not a.bf16_shared_experts,
                    edge_blocks=a.edge_blocks,
                ),
            )
        ]
    for path, kw in jobs:
        out = write_tiny_nvfp4_moe(path, overwrite=True, **kw)
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"wrote {out} ({size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
