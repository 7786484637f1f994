#!/usr/bin/env python3
"""Write a tiny, deterministic, real-format GPT-OSS MXFP4 checkpoint (test tooling, not package code).

`python examples/make_tiny_gpt_oss.py` regenerates `examples/tiny-gpt-oss/` (Hugging Face layout,
2 layers, 4 experts, H = I = 320, 2 shards). `write_tiny_gpt_oss(out_dir, ...)` writes variants.

Everything is plain torch + safetensors, no network. The same arguments give the same bytes in
every file (per-tensor RNG streams seeded from `seed` and the tensor name; JSON written with
`sort_keys=True, indent=2` and a final newline, like transformers' `save_pretrained`).

Layouts (`layout=`)
-------------------
"hf"        the Hugging Face repo root, as `openai/gpt-oss-20b` / `-120b` ship it:
            config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
            special_tokens_map.json, chat_template.jinja, README.md,
            model-XXXXX-of-YYYYY.safetensors shards + model.safetensors.index.json.
"original"  only the OpenAI reference folder `<out_dir>/original/` (what
            `hf download ... --include "original/*"` leaves): config.json (OpenAI `ModelConfig`
            keys), dtypes.json, and `model.safetensors` (one shard, as in gpt-oss-20b) or
            `model--0000K-of-0000N.safetensors` + `model.safetensors.index.json` (several, as in
            gpt-oss-120b).
"both"      the whole repo: "hf" files at the root plus `original/`.
The return value is always `out_dir` (the repo root).

On-disk format (docs/checkpoints.md, "GPT-OSS MXFP4 on disk")
-------------------------------------------------------------
Per layer L, HF names (original names in brackets):
  model.layers.L.mlp.experts.gate_up_proj_blocks  u8   [E, 2I, H/32, 16]  [block.L.mlp.mlp1_weight.blocks]
  model.layers.L.mlp.experts.gate_up_proj_scales  u8   [E, 2I, H/32]      [block.L.mlp.mlp1_weight.scales]
  model.layers.L.mlp.experts.gate_up_proj_bias    bf16 [E, 2I]            [block.L.mlp.mlp1_bias]
  model.layers.L.mlp.experts.down_proj_blocks     u8   [E, H, I/32, 16]   [block.L.mlp.mlp2_weight.blocks]
  model.layers.L.mlp.experts.down_proj_scales     u8   [E, H, I/32]       [block.L.mlp.mlp2_weight.scales]
  model.layers.L.mlp.experts.down_proj_bias       bf16 [E, H]             [block.L.mlp.mlp2_bias]
  model.layers.L.mlp.router.weight / .bias        bf16 [E, H] / [E]       [block.L.mlp.gate.weight / .bias]
  model.layers.L.self_attn.q_proj.weight / .bias  bf16 [nh*hd, H] / [nh*hd]  \
  model.layers.L.self_attn.k_proj.weight / .bias  bf16 [kv*hd, H] / [kv*hd]   } [block.L.attn.qkv.weight / .bias,
  model.layers.L.self_attn.v_proj.weight / .bias  bf16 [kv*hd, H] / [kv*hd]  /   rows q, then k, then v]
  model.layers.L.self_attn.o_proj.weight / .bias  bf16 [H, nh*hd] / [H]   [block.L.attn.out.weight / .bias]
  model.layers.L.self_attn.sinks                  bf16 [nh]               [block.L.attn.sinks]
  model.layers.L.input_layernorm.weight           bf16 [H]                [block.L.attn.norm.scale]
  model.layers.L.post_attention_layernorm.weight  bf16 [H]                [block.L.mlp.norm.scale]
plus model.embed_tokens.weight bf16 [V, H] [embedding.weight], model.norm.weight bf16 [H]
[norm.scale], lm_head.weight bf16 [V, H] [unembedding.weight].

The expert weights are a real MXFP4 quantization of random bf16 weights (`quantize_mxfp4`): 32-value
blocks along the input dimension, one E8M0 scale per block chosen as the smallest power of two with
amax / scale <= 6 (triton_kernels `downcast_to_mxfp`, DequantScaleRoundingMode.ROUND_UP), values
rounded to the nearest E2M1 code (ties to even), low nibble = even element, code LUT
[0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6]. Gate/up rows are interleaved
(row 2i = gate_i, row 2i+1 = up_i). The original layout holds the very same expert bytes
(transformers' converter copies them unchanged). `build_tiny_gpt_oss_tensors` also returns the
bf16 weights the experts were quantized from, so tests can check dequantization against them.

Where the real format was checked, and choices made
---------------------------------------------------
* Original tensor names and dtypes: openai/gpt-oss `gpt_oss/torch/model.py` (parameter names),
  `weights.py` (`.blocks` / `.scales` suffixes), and the published `original/dtypes.json` of
  gpt-oss-20b/120b (every non-expert tensor, norms and sinks included, is BF16; blocks "FP4",
  scales "UE8"). Our dtypes.json uses the same vocabulary. HF renames: transformers
  `convert_gpt_oss_weights_to_hf.py` (qkv split in q, k, v order; norms keep their dtype, BF16).
* HF shard names: the real gpt-oss repos number shards from zero and write the LAST index as the
  total (`model-00000-of-00002` .. `model-00002-of-00002` for three shards in gpt-oss-20b; 15
  shards `-00000-of-00014` .. `-00014-of-00014` in 120b), a quirk of the converter's
  `save_sharded_model`. `shard_naming="gpt-oss"` (default) reproduces it; `"transformers"` gives
  the usual `model-00001-of-00002` (and a lone `model.safetensors` without index for 1 shard).
  Readers must follow the index's weight_map, never guess names.
* Original shard names: gpt-oss-20b ships one `original/model.safetensors`; gpt-oss-120b ships
  `original/model--00001-of-00007.safetensors` .. (double dash, from 1) with
  `original/model.safetensors.index.json`. We follow both.
* HF config.json: the keys of the published gpt-oss config (openai/gpt-oss-20b, -120b) with small values.
  generation_config.json, tokenizer files and chat_template.jinja are small stand-ins with the
  same file names and the gpt-oss special tokens remapped into the tiny vocabulary (their exact
  upstream contents were not checked; the tool copies them unchanged).
* Safetensors metadata is {"format": "pt"} in every shard (original shards too; whether
  OpenAI's original files carry it was not checked).
* Tensor order inside the shards: embedding, layer 0 .. L-1 (names sorted within a layer for HF,
  dtypes.json order for original), final norm, lm_head/unembedding; shards are cut by bytes, so
  a layer can straddle two shards as in the real checkpoints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

# ----------------------------------------------------------------------------------------------
# MXFP4 (E2M1 values, E8M0 shared scale per 32 values)
# ----------------------------------------------------------------------------------------------

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_FP4_MAGNITUDES = torch.tensor(FP4_VALUES[:8], dtype=torch.float32)
_FP4_MIDPOINTS = (_FP4_MAGNITUDES[1:] + _FP4_MAGNITUDES[:-1]) / 2  # 0.25 0.75 1.25 1.75 2.5 3.5 5
MXFP4_BLOCK = 32


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `w[..., K]` (K % 32 == 0) along its last dim.

    Returns (blocks u8 [..., K/32, 16], scales u8 [..., K/32]). Scale = smallest power of two 2^e with
    amax/2^e <= 6 (no saturation), stored as e + 127; all-zero blocks get scale byte 0 (2^-127).
    Values round to the nearest E2M1 magnitude, ties to the even code; the sign goes to bit 3
    (negative values that round to zero give code 8, -0). Low nibble = even element.
    """
    if w.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"last dim {w.shape[-1]} is not a multiple of {MXFP4_BLOCK}")
    x = w.to(torch.float32).reshape(*w.shape[:-1], w.shape[-1] // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = x.abs().amax(dim=-1)
    _, p = torch.frexp(amax)  # amax = m * 2^p, m in [0.5, 1)  =>  floor(log2 amax) = p - 1
    e = p.to(torch.int32) - 3  # amax / 2^e in [4, 8)
    e = torch.where(amax / torch.ldexp(torch.ones_like(amax), e) > 6.0, e + 1, e)
    e = torch.where(amax == 0, torch.full_like(e, -127), e).clamp(-127, 127)
    scaled = x / torch.ldexp(torch.ones_like(amax), e).unsqueeze(-1)  # exact: power-of-two divide
    mag = scaled.abs()
    lo = torch.bucketize(mag, _FP4_MIDPOINTS, right=False)  # at a tie: the lower code
    hi = torch.bucketize(mag, _FP4_MIDPOINTS, right=True)  # at a tie: the upper code
    code = torch.where((lo != hi) & (lo % 2 == 1), hi, lo)  # ties to the even code
    code = code | torch.where(scaled < 0, 8, 0)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (e + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of the packing: blocks [..., G, 16] + scales [..., G] -> values [..., G*32]."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).reshape(*blocks.shape[:-1], 32).long()
    vals = torch.ldexp(lut[codes], scales.to(torch.int32).unsqueeze(-1) - 127)
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32).to(dtype)


# ----------------------------------------------------------------------------------------------
# Shapes, configs, tokenizer stand-ins
# ----------------------------------------------------------------------------------------------

# The gpt-oss special tokens (o200k_harmony ids 199998..200018) come right after the regular tokens,
# as in o200k_harmony (199998 regular tokens, specials 199998..200018, config vocab padded to 201088):
# here 256 byte tokens + the merges below, then the 21 special ids, then padding up to vocab_size.
_HARMONY_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
_SPECIAL_SPAN = 200018 - 199998 + 1  # 21 ids, reserved ones included


@dataclass(frozen=True)
class TinyConfig:
    num_layers: int = 2
    num_experts: int = 4
    hidden_size: int = 320
    intermediate_size: int = 320
    vocab_size: int = 512
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 64
    experts_per_token: int = 2
    sliding_window: int = 128
    swiglu_limit: float = 7.0
    seed: int = 0

    def validate(self) -> None:
        for name in (
            "num_layers",
            "num_experts",
            "hidden_size",
            "intermediate_size",
            "vocab_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "experts_per_token",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.hidden_size % MXFP4_BLOCK or self.intermediate_size % MXFP4_BLOCK:
            raise ValueError("hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must be <= num_experts")
        if self.vocab_size < _SPECIAL_BASE + _SPECIAL_SPAN:
            raise ValueError(f"vocab_size must be >= {_SPECIAL_BASE + _SPECIAL_SPAN} (tokenizer size)")

    def special_id(self, real_id: int) -> int:
        return _SPECIAL_BASE + (real_id - 199998)

    @property
    def bos_token_id(self) -> int:
        return self.special_id(199998)

    @property
    def pad_token_id(self) -> int:  # <|endoftext|>, as in the published config
        return self.special_id(199999)

    @property
    def eos_token_id(self) -> int:  # <|return|>, as in the published config
        return self.special_id(200002)


def hf_config(c: TinyConfig) -> dict:
    """config.json of the HF layout: the keys of the published gpt-oss config.json."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": c.eos_token_id,
        "experts_per_token": c.experts_per_token,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_layers)],
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": c.num_attention_heads,
        "num_experts_per_tok": c.experts_per_token,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_key_value_heads,
        "num_local_experts": c.num_experts,
        "output_router_logits": False,
        "pad_token_id": c.pad_token_id,
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": c.sliding_window,
        "swiglu_limit": c.swiglu_limit,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": c.vocab_size,
    }


def original_config(c: TinyConfig) -> dict:
    """original/config.json: the fields of OpenAI's `ModelConfig` (gpt_oss/torch/model.py)."""
    return {
        "num_hidden_layers": c.num_layers,
        "num_experts": c.num_experts,
        "experts_per_token": c.experts_per_token,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "swiglu_limit": c.swiglu_limit,
        "head_dim": c.head_dim,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "sliding_window": c.sliding_window,
        "initial_context_length": 4096,
        "rope_theta": 150000,
        "rope_scaling_factor": 32.0,
        "rope_ntk_alpha": 1,
        "rope_ntk_beta": 32,
    }


def generation_config(c: TinyConfig) -> dict:
    return {
        "bos_token_id": c.bos_token_id,
        "do_sample": True,
        "eos_token_id": [c.eos_token_id, c.pad_token_id, c.special_id(200012)],
        "pad_token_id": c.pad_token_id,
        "transformers_version": "4.55.0.dev0",
    }


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
_SPECIAL_BASE = 256 + len(_MERGES)  # first special id (<|startoftext|>), 276


def _special_tokens(c: TinyConfig) -> list[tuple[int, str]]:
    out = []
    for real in range(199998, 200019):
        name = _HARMONY_SPECIALS.get(real, f"<|reserved_{real}|>")
        out.append((c.special_id(real), name))
    return out


def tokenizer_json(c: TinyConfig) -> dict:
    """A small valid byte-level BPE tokenizer (`tokenizers` JSON schema) with the harmony specials."""
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    next_id = 256
    for a, b in _MERGES:
        vocab[a + b] = next_id
        next_id += 1
    added = [
        {
            "content": name,
            "id": tid,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tid, name in _special_tokens(c)
    ]
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "added_tokens": added,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "byte_fallback": False,
            "continuing_subword_prefix": None,
            "dropout": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "ignore_merges": False,
            "merges": [[a, b] for a, b in _MERGES],
            "type": "BPE",
            "unk_token": None,
            "vocab": vocab,
        },
        "normalizer": None,
        "padding": None,
        "post_processor": {"type": "ByteLevel", **byte_level},
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "truncation": None,
        "version": "1.0",
    }


def tokenizer_config(c: TinyConfig) -> dict:
    return {
        "added_tokens_decoder": {
            str(tid): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tid, name in _special_tokens(c)
        },
        "bos_token": "<|startoftext|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


SPECIAL_TOKENS_MAP = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}

CHAT_TEMPLATE = (
    "{#- tiny stand-in for the gpt-oss harmony chat template -#}\n"
    "{%- for message in messages -%}\n"
    "<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}\n"
)


def _readme(c: TinyConfig) -> str:
    return (
        "# tiny-gpt-oss\n\n"
        "A tiny random GPT-OSS checkpoint in the real on-disk format (MXFP4 MoE experts, BF16 elsewhere),\n"
        "written by `examples/make_tiny_gpt_oss.py` for tests. It is not a trained model.\n\n"
        f"layers={c.num_layers} experts={c.num_experts} hidden={c.hidden_size} "
        f"intermediate={c.intermediate_size} vocab={c.vocab_size} seed={c.seed}\n"
    )


# ----------------------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------------------


def _gen(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"tiny-gpt-oss:{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
    x = torch.randn(shape, generator=_gen(seed, name), dtype=torch.float32) * std + mean
    return x.to(torch.bfloat16)


def _expert_weight(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """bf16 [E, N, K] with a per-row std drawn log-uniformly in [2^-6, 2^-2] (scale bytes ~119..126)."""
    g = _gen(seed, name)
    e, n, k = shape
    log2_std = torch.rand((e, n, 1), generator=g, dtype=torch.float32) * 4.0 - 6.0
    x = torch.randn(shape, generator=g, dtype=torch.float32) * torch.exp2(log2_std)
    return x.to(torch.bfloat16)


HF_LAYER_SUFFIXES = (
    "input_layernorm.weight",
    "mlp.experts.down_proj_bias",
    "mlp.experts.down_proj_blocks",
    "mlp.experts.down_proj_scales",
    "mlp.experts.gate_up_proj_bias",
    "mlp.experts.gate_up_proj_blocks",
    "mlp.experts.gate_up_proj_scales",
    "mlp.router.bias",
    "mlp.router.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.bias",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.q_proj.weight",
    "self_attn.sinks",
    "self_attn.v_proj.bias",
    "self_attn.v_proj.weight",
)

# original name suffix -> HF suffix (qkv is the concatenation of q, k, v)
ORIGINAL_LAYER_SUFFIXES = (
    ("attn.norm.scale", "input_layernorm.weight"),
    ("attn.qkv.weight", None),
    ("attn.qkv.bias", None),
    ("attn.sinks", "self_attn.sinks"),
    ("attn.out.weight", "self_attn.o_proj.weight"),
    ("attn.out.bias", "self_attn.o_proj.bias"),
    ("mlp.norm.scale", "post_attention_layernorm.weight"),
    ("mlp.gate.weight", "mlp.router.weight"),
    ("mlp.gate.bias", "mlp.router.bias"),
    ("mlp.mlp1_weight.blocks", "mlp.experts.gate_up_proj_blocks"),
    ("mlp.mlp1_weight.scales", "mlp.experts.gate_up_proj_scales"),
    ("mlp.mlp1_bias", "mlp.experts.gate_up_proj_bias"),
    ("mlp.mlp2_weight.blocks", "mlp.experts.down_proj_blocks"),
    ("mlp.mlp2_weight.scales", "mlp.experts.down_proj_scales"),
    ("mlp.mlp2_bias", "mlp.experts.down_proj_bias"),
)


@dataclass
class TinyTensors:
    """hf / original: name -> tensor in shard-writing order; reference: name -> the bf16 expert
    weights the MXFP4 tensors were quantized from, keyed
    `model.layers.L.mlp.experts.gate_up_proj` [E, 2I, H] and `...down_proj` [E, H, I]."""

    config: TinyConfig
    hf: dict[str, torch.Tensor] = field(default_factory=dict)
    original: dict[str, torch.Tensor] = field(default_factory=dict)
    reference: dict[str, torch.Tensor] = field(default_factory=dict)


def build_tiny_gpt_oss_tensors(c: TinyConfig | None = None, **kw) -> TinyTensors:
    """All tensors of the tiny checkpoint, in both namings, plus the float reference experts."""
    c = c or TinyConfig(**kw)
    c.validate()
    s, H, I, E, V = c.seed, c.hidden_size, c.intermediate_size, c.num_experts, c.vocab_size
    nq, nkv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = TinyTensors(config=c)
    hf = out.hf
    hf["model.embed_tokens.weight"] = _normal(s, "model.embed_tokens.weight", (V, H), 0.02)
    for L in range(c.num_layers):
        p = f"model.layers.{L}."
        t: dict[str, torch.Tensor] = {}
        t["input_layernorm.weight"] = _normal(s, p + "input_layernorm.weight", (H,), 0.1, 1.0)
        t["post_attention_layernorm.weight"] = _normal(s, p + "post_attention_layernorm.weight", (H,), 0.1, 1.0)
        for proj, rows in (("q", nq), ("k", nkv), ("v", nkv)):
            t[f"self_attn.{proj}_proj.weight"] = _normal(s, p + f"self_attn.{proj}_proj.weight", (rows, H), 0.02)
            t[f"self_attn.{proj}_proj.bias"] = _normal(s, p + f"self_attn.{proj}_proj.bias", (rows,), 0.01)
        t["self_attn.o_proj.weight"] = _normal(s, p + "self_attn.o_proj.weight", (H, nq), 0.02)
        t["self_attn.o_proj.bias"] = _normal(s, p + "self_attn.o_proj.bias", (H,), 0.01)
        t["self_attn.sinks"] = _normal(s, p + "self_attn.sinks", (c.num_attention_heads,), 0.5)
        t["mlp.router.weight"] = _normal(s, p + "mlp.router.weight", (E, H), 0.02)
        t["mlp.router.bias"] = _normal(s, p + "mlp.router.bias", (E,), 0.01)
        w13 = _expert_weight(s, p + "mlp.experts.gate_up_proj", (E, 2 * I, H))
        w2 = _expert_weight(s, p + "mlp.experts.down_proj", (E, H, I))
        out.reference[p + "mlp.experts.gate_up_proj"] = w13
        out.reference[p + "mlp.experts.down_proj"] = w2
        t["mlp.experts.gate_up_proj_blocks"], t["mlp.experts.gate_up_proj_scales"] = quantize_mxfp4(w13)
        t["mlp.experts.down_proj_blocks"], t["mlp.experts.down_proj_scales"] = quantize_mxfp4(w2)
        t["mlp.experts.gate_up_proj_bias"] = _normal(s, p + "mlp.experts.gate_up_proj_bias", (E, 2 * I), 0.02)
        t["mlp.experts.down_proj_bias"] = _normal(s, p + "mlp.experts.down_proj_bias", (E, H), 0.02)
        assert sorted(t) == list(HF_LAYER_SUFFIXES)
        for suffix in HF_LAYER_SUFFIXES:
            hf[p + suffix] = t[suffix]
    hf["model.norm.weight"] = _normal(s, "model.norm.weight", (H,), 0.1, 1.0)
    hf["lm_head.weight"] = _normal(s, "lm_head.weight", (V, H), 0.02)

    orig = out.original
    orig["embedding.weight"] = hf["model.embed_tokens.weight"]
    for L in range(c.num_layers):
        p = f"model.layers.{L}."
        for osuf, hsuf in ORIGINAL_LAYER_SUFFIXES:
            if hsuf is not None:
                orig[f"block.{L}.{osuf}"] = hf[p + hsuf]
            else:
                kind = osuf.rsplit(".", 1)[1]
                orig[f"block.{L}.{osuf}"] = torch.cat(
                    [hf[p + f"self_attn.{x}_proj.{kind}"] for x in ("q", "k", "v")], dim=0
                )
    orig["norm.scale"] = hf["model.norm.weight"]
    orig["unembedding.weight"] = hf["lm_head.weight"]
    return out


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _split_by_bytes(tensors: dict[str, torch.Tensor], num_shards: int) -> list[list[str]]:
    """Cut the ordered tensor list into `num_shards` contiguous, non-empty runs of similar bytes."""
    names = list(tensors)
    if not 1 <= num_shards <= len(names):
        raise ValueError(f"num_shards must be in 1..{len(names)}")
    total = sum(_nbytes(tensors[n]) for n in names)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    start, k = 0, 0
    for i, n in enumerate(names):
        want = (start * num_shards) // total  # the shard this tensor's first byte falls in
        left = len(names) - i  # tensors still to place, this one included
        # no shard skipped (at most one step per tensor), none left empty at the end
        k = min(max(want, num_shards - left), k + 1) if i else 0
        shards[k].append(n)
        start += _nbytes(tensors[n])
    assert all(shards), shards
    return shards


def _write_shards(
    folder: Path, tensors: dict[str, torch.Tensor], filenames: list[str], groups: list[list[str]], write_index: bool
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for fname, group in zip(filenames, groups):
        save_file({n: tensors[n].contiguous() for n in group}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    if write_index:
        total = sum(_nbytes(t) for t in tensors.values())
        _write_json(
            folder / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
        )


def hf_shard_names(num_shards: int, shard_naming: str = "gpt-oss") -> list[str]:
    if shard_naming == "gpt-oss":  # zero-based, "of" = last index (openai/gpt-oss-20b, -120b)
        return [f"model-{k:05d}-of-{num_shards - 1:05d}.safetensors" for k in range(num_shards)]
    if shard_naming == "transformers":
        if num_shards == 1:
            return ["model.safetensors"]
        return [f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors" for k in range(num_shards)]
    raise ValueError(f"shard_naming must be 'gpt-oss' or 'transformers', not {shard_naming!r}")


def original_shard_names(num_shards: int) -> list[str]:
    if num_shards == 1:  # gpt-oss-20b
        return ["model.safetensors"]
    return [f"model--{k + 1:05d}-of-{num_shards:05d}.safetensors" for k in range(num_shards)]  # gpt-oss-120b


_LAYOUTS = ("hf", "original", "both")


def write_tiny_gpt_oss(
    out_dir: str | Path,
    *,
    num_layers: int = 2,
    num_experts: int = 4,
    hidden_size: int = 320,
    intermediate_size: int = 320,
    layout: str = "hf",
    num_shards: int = 2,
    seed: int = 0,
    vocab_size: int = 512,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 1,
    head_dim: int = 64,
    experts_per_token: int = 2,
    shard_naming: str = "gpt-oss",
    original_num_shards: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the tiny checkpoint under `out_dir` and return `out_dir` (see the module docstring).

    num_shards: HF shards (layout "hf"/"both"), and original shards too unless
    `original_num_shards` is given. `out_dir` must be absent or empty, unless `overwrite=True`,
    which first removes a previous tiny checkpoint there (a folder holding config.json or
    original/config.json; anything else is refused).
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, not {layout!r}")
    c = TinyConfig(
        num_layers=num_layers,
        num_experts=num_experts,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        experts_per_token=experts_per_token,
        seed=seed,
    )
    c.validate()
    hf_names = hf_shard_names(num_shards, shard_naming)  # validates shard_naming early
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty (pass overwrite=True to replace it)")
        if not ((out / "config.json").is_file() or (out / "original" / "config.json").is_file()):
            raise FileExistsError(f"refusing to overwrite {out}: it does not look like a checkpoint")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    tensors = build_tiny_gpt_oss_tensors(c)
    if layout in ("hf", "both"):
        _write_json(out / "config.json", hf_config(c))
        _write_json(out / "generation_config.json", generation_config(c))
        _write_json(out / "tokenizer.json", tokenizer_json(c))
        _write_json(out / "tokenizer_config.json", tokenizer_config(c))
        _write_json(out / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        (out / "README.md").write_text(_readme(c), encoding="utf-8")
        groups = _split_by_bytes(tensors.hf, num_shards)
        _write_shards(
            out, tensors.hf, hf_names, groups, write_index=not (shard_naming == "transformers" and num_shards == 1)
        )
    if layout in ("original", "both"):
        n_orig = original_num_shards if original_num_shards is not None else num_shards
        odir = out / "original"
        _write_json(odir / "config.json", original_config(c))
        dtypes = {
            n: ("FP4" if n.endswith(".blocks") else "UE8" if n.endswith(".scales") else "BF16")
            for n in tensors.original
        }
        _write_json(odir / "dtypes.json", dtypes)
        groups = _split_by_bytes(tensors.original, n_orig)
        _write_shards(odir, tensors.original, original_shard_names(n_orig), groups, write_index=n_orig > 1)
    return out


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=here / "tiny-gpt-oss",
        help="output folder (default: examples/tiny-gpt-oss); replaced if it holds a checkpoint",
    )
    ap.add_argument("--layout", choices=_LAYOUTS, default="hf")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--intermediate", type=int, default=320)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--original-shards", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--shard-naming", choices=("gpt-oss", "transformers"), default="gpt-oss")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = write_tiny_gpt_oss(
        a.out,
        num_layers=a.layers,
        num_experts=a.experts,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        layout=a.layout,
        num_shards=a.shards,
        original_num_shards=a.original_shards,
        vocab_size=a.vocab,
        shard_naming=a.shard_naming,
        seed=a.seed,
        overwrite=True,
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
