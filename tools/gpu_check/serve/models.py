"""Checkpoints with random weights for the serving check.

GPT-OSS MXFP4 (`write_gpt_oss`, numpy only, fast): the config is examples/make_tiny_gpt_oss.py's
(`hf_config`), so the architecture, rope scaling, sliding-window layers and quantization config are
those of the real gpt-oss checkpoints; the sizes are chosen per run. Weights are random: MXFP4 codes
uniform over all 16 values with E8M0 scales 2^-9..2^-3 (so the experts' outputs stay in bf16's
comfortable range), bf16 normals elsewhere. One layer's expert bytes are drawn once and written for
every layer (cheap to write at 120b sizes; the loaders cannot tell). Tensor names and shapes are the HF
layout's, exactly those the example writes.

Qwen3-MoE NVFP4 (`write_qwen3_nvfp4`, torch): examples/make_tiny_nvfp4_moe.py's `write_tiny_nvfp4_moe`
(the writer of the committed tiny-nvfp4-*-qwen3 examples) with serving-check sizes: architecture
`Qwen3MoeForCausalLM`, ModelOpt NVFP4 (`hf_quant_config.json` and `config.json["quantization_config"]`,
as current ModelOpt exports ship both) or compressed-tensors `nvfp4-pack-quantized`, random bf16 weights
quantized with ModelOpt's NVFP4 quantizer (same FP4 codes and block scales in both formats for one seed).
The default sizes (`NVFP4_SIZES`) are Qwen3-30B-A3B's hidden size and attention shape with a MoE
intermediate size of 736 (mxconvert takes multiples of 32): Marlin's NVFP4 MoE preparation (vLLM 0.26.0
marlin_utils_fp4.py `prepare_nvfp4_moe_layer_for_marlin`) pads it to 768 (hidden % 128 == 0: a multiple
of 64), so the serving check also covers the padded layout; hidden 2048 and the padded 768 fit Marlin's
thread tiles.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]


def _example():
    sys.path.insert(0, str(REPO / "examples"))
    import make_tiny_gpt_oss  # noqa: PLC0415 - examples/ is no package

    return make_tiny_gpt_oss


def _bf16(rng: np.random.Generator, shape: tuple[int, ...], std: float, mean: float = 0.0) -> bytes:
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _write_shard(path: Path, tensors: list[tuple[str, str, tuple[int, ...], bytes]]) -> None:
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for *_, data in tensors:
            f.write(data)


def write_gpt_oss(
    out: Path,
    *,
    layers: int,
    experts: int,
    hidden: int = 2880,
    intermediate: int = 2880,
    heads: int = 64,
    kv_heads: int = 8,
    head_dim: int = 64,
    experts_per_token: int = 4,
    vocab: int = 2048,
    seed: int = 0,
) -> Path:
    """Write the checkpoint to `out` (one shard per layer, one for the rest) and return `out`."""
    m = _example()
    cfg = m.TinyConfig(
        num_layers=layers,
        num_experts=experts,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        experts_per_token=experts_per_token,
        seed=seed,
    )
    cfg.validate()
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    e, h, i = experts, hidden, intermediate
    q, kv = heads * head_dim, kv_heads * head_dim
    drawn: list[tuple[str, str, tuple[int, ...], bytes | np.ndarray]] = [
        ("gate_up_proj_blocks", "U8", (e, 2 * i, h // 32, 16), rng.integers(0, 256, e * 2 * i * h // 2, np.uint8)),
        ("gate_up_proj_scales", "U8", (e, 2 * i, h // 32), rng.integers(118, 125, e * 2 * i * h // 32, np.uint8)),
        ("gate_up_proj_bias", "BF16", (e, 2 * i), _bf16(rng, (e, 2 * i), 0.02)),
        ("down_proj_blocks", "U8", (e, h, i // 32, 16), rng.integers(0, 256, e * h * i // 2, np.uint8)),
        ("down_proj_scales", "U8", (e, h, i // 32), rng.integers(118, 125, e * h * i // 32, np.uint8)),
        ("down_proj_bias", "BF16", (e, h), _bf16(rng, (e, h), 0.02)),
    ]
    expert = [(n, d, s, b if isinstance(b, bytes) else b.tobytes()) for n, d, s, b in drawn]
    n_shards = layers + 1
    weight_map: dict[str, str] = {}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        tensors = [(f"{p}.mlp.experts.{n}", d, s, b) for n, d, s, b in expert]
        tensors += [
            (f"{p}.mlp.router.weight", "BF16", (e, h), _bf16(rng, (e, h), 0.02)),
            (f"{p}.mlp.router.bias", "BF16", (e,), _bf16(rng, (e,), 0.02)),
            (f"{p}.input_layernorm.weight", "BF16", (h,), _bf16(rng, (h,), 0.05, 1.0)),
            (f"{p}.post_attention_layernorm.weight", "BF16", (h,), _bf16(rng, (h,), 0.05, 1.0)),
            (f"{p}.self_attn.q_proj.weight", "BF16", (q, h), _bf16(rng, (q, h), 0.02)),
            (f"{p}.self_attn.q_proj.bias", "BF16", (q,), _bf16(rng, (q,), 0.02)),
            (f"{p}.self_attn.k_proj.weight", "BF16", (kv, h), _bf16(rng, (kv, h), 0.02)),
            (f"{p}.self_attn.k_proj.bias", "BF16", (kv,), _bf16(rng, (kv,), 0.02)),
            (f"{p}.self_attn.v_proj.weight", "BF16", (kv, h), _bf16(rng, (kv, h), 0.02)),
            (f"{p}.self_attn.v_proj.bias", "BF16", (kv,), _bf16(rng, (kv,), 0.02)),
            (f"{p}.self_attn.o_proj.weight", "BF16", (h, q), _bf16(rng, (h, q), 0.02)),
            (f"{p}.self_attn.o_proj.bias", "BF16", (h,), _bf16(rng, (h,), 0.02)),
            (f"{p}.self_attn.sinks", "BF16", (heads,), _bf16(rng, (heads,), 0.5)),
        ]
        name = f"model-{layer + 1:05d}-of-{n_shards:05d}.safetensors"
        _write_shard(out / name, tensors)
        weight_map.update({t[0]: name for t in tensors})
    rest = [
        ("model.embed_tokens.weight", "BF16", (vocab, h), _bf16(rng, (vocab, h), 1.0)),
        ("model.norm.weight", "BF16", (h,), _bf16(rng, (h,), 0.05, 1.0)),
        ("lm_head.weight", "BF16", (vocab, h), _bf16(rng, (vocab, h), 0.02)),
    ]
    name = f"model-{n_shards:05d}-of-{n_shards:05d}.safetensors"
    _write_shard(out / name, rest)
    weight_map.update({t[0]: name for t in rest})
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (out / "config.json").write_text(json.dumps(m.hf_config(cfg), indent=1))
    (out / "generation_config.json").write_text(json.dumps(m.generation_config(cfg), indent=1))
    return out


#: `write_qwen3_nvfp4` sizes of the serving check: Qwen3-30B-A3B's hidden size, heads and head size,
#: 8 experts (top-2) of a MoE intermediate size Marlin pads (736 -> 768), 2 layers, vocab 2048.
NVFP4_SIZES = dict(
    layers=2,
    experts=8,
    experts_per_token=2,
    hidden=2048,
    intermediate=736,
    heads=32,
    kv_heads=4,
    head_dim=128,
    vocab=2048,
)
#: `write_qwen3_nvfp4` kind -> examples/make_tiny_nvfp4_moe.py `fmt`.
NVFP4_KINDS = {"modelopt": "modelopt", "ct": "compressed-tensors"}


def _nvfp4_example():
    sys.path.insert(0, str(REPO / "examples"))
    import make_tiny_nvfp4_moe  # noqa: PLC0415 - examples/ is no package

    return make_tiny_nvfp4_moe


def write_qwen3_nvfp4(
    out: Path,
    kind: str,
    *,
    layers: int,
    experts: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    experts_per_token: int,
    vocab: int = 2048,
    seed: int = 0,
) -> Path:
    """Write a Qwen3-MoE NVFP4 checkpoint of `kind` ("modelopt", "ct") to `out` (emptied first when it
    holds a checkpoint) and return `out`. `write_qwen3_nvfp4(out, "ct", **NVFP4_SIZES)`: the serving
    check's."""
    if kind not in NVFP4_KINDS:
        raise ValueError(f"kind must be one of {sorted(NVFP4_KINDS)}, not {kind!r}")
    return _nvfp4_example().write_tiny_nvfp4_moe(
        out,
        fmt=NVFP4_KINDS[kind],
        arch="qwen3_moe",
        num_layers=layers,
        num_experts=experts,
        hidden_size=hidden,
        moe_intermediate_size=intermediate,
        seed=seed,
        num_shards=layers + 1,
        overwrite=True,
        experts_per_token=experts_per_token,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=intermediate * experts_per_token,
        modelopt_config="both",
    )
