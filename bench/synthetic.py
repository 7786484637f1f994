"""A gpt-oss-shaped synthetic MXFP4 checkpoint (HF layout), cheap to make: one layer's random
expert bytes are drawn once and written for every layer; the non-expert tensors are small, or with
`real_sizes` those of gpt-oss (vocabulary 201088, attention projections, sinks), so a 24-layer,
32-expert checkpoint has gpt-oss-20b's ~13.8 GB and a 128-expert one gpt-oss-120b's per-layer size.

    python bench/synthetic.py OUT --layers 4 --experts 32                  # gpt-oss-20b expert shape
    python bench/synthetic.py OUT --layers 24 --experts 32 --real-sizes    # gpt-oss-20b, all of it

Needs only numpy (no torch), so it also runs where mxconvert is not installed.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

VOCAB = 512
REAL_VOCAB = 201088  # gpt-oss-20b / 120b
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64


def _config(layers: int, experts: int, hidden: int, inter: int, vocab: int = VOCAB) -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": vocab,
        "swiglu_limit": 7.0,
        "torch_dtype": "bfloat16",
        "layer_types": ["sliding_attention", "full_attention"] * ((layers + 1) // 2),
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
    }


def _write_shard(path: Path, tensors: list[tuple[str, str, tuple[int, ...], bytes | memoryview]]) -> None:
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


def layer_bytes(experts: int, hidden: int = 2880, inter: int = 2880) -> int:
    """Bytes of one layer's expert tensors (what a conversion writes per layer, about)."""
    e, h, i = experts, hidden, inter
    return e * 2 * i * h // 2 + e * 2 * i * h // 32 + e * 2 * i * 2 + e * h * i // 2 + e * h * i // 32 + e * h * 2


def write_synthetic(
    out: Path,
    layers: int,
    experts: int,
    hidden: int = 2880,
    inter: int = 2880,
    seed: int = 0,
    real_sizes: bool = False,
) -> Path:
    """Write the checkpoint at `out` (one shard per layer plus one for the rest); returns `out`.
    `real_sizes`: gpt-oss's vocabulary and attention tensors instead of small stand-ins."""
    rng = np.random.default_rng(seed)
    vocab = REAL_VOCAB if real_sizes else VOCAB
    out.mkdir(parents=True, exist_ok=True)
    e, h, i = experts, hidden, inter

    def bf16(*shape):  # small normal values, as bf16 bytes (the upper half of float32)
        if np.prod(shape) > 1 << 24:  # a real-size table or projection: copied as bytes, drawn cheaply
            return rng.integers(0x3C00, 0x3D00, shape, dtype=np.uint16).tobytes()  # 0.0078 .. 0.031
        return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()

    expert = [  # one layer's expert tensors: random fp4 codes, E8M0 scales near 1.0
        (
            "gate_up_proj_blocks",
            "U8",
            (e, 2 * i, h // 32, 16),
            rng.integers(0, 256, e * 2 * i * h // 2, dtype=np.uint8),
        ),
        ("gate_up_proj_scales", "U8", (e, 2 * i, h // 32), rng.integers(118, 130, e * 2 * i * h // 32, dtype=np.uint8)),
        ("gate_up_proj_bias", "BF16", (e, 2 * i), np.frombuffer(bf16(e, 2 * i), np.uint8)),
        ("down_proj_blocks", "U8", (e, h, i // 32, 16), rng.integers(0, 256, e * h * i // 2, dtype=np.uint8)),
        ("down_proj_scales", "U8", (e, h, i // 32), rng.integers(118, 130, e * h * i // 32, dtype=np.uint8)),
        ("down_proj_bias", "BF16", (e, h), np.frombuffer(bf16(e, h), np.uint8)),
    ]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    attention = (
        [  # one layer's attention tensors (real_sizes), drawn once
            ("self_attn.q_proj.weight", "BF16", (q, h), bf16(q, h)),
            ("self_attn.q_proj.bias", "BF16", (q,), bf16(q)),
            ("self_attn.k_proj.weight", "BF16", (kv, h), bf16(kv, h)),
            ("self_attn.k_proj.bias", "BF16", (kv,), bf16(kv)),
            ("self_attn.v_proj.weight", "BF16", (kv, h), bf16(kv, h)),
            ("self_attn.v_proj.bias", "BF16", (kv,), bf16(kv)),
            ("self_attn.o_proj.weight", "BF16", (h, q), bf16(h, q)),
            ("self_attn.o_proj.bias", "BF16", (h,), bf16(h)),
            ("self_attn.sinks", "BF16", (HEADS,), bf16(HEADS)),
            ("post_attention_layernorm.weight", "BF16", (h,), bf16(h)),
            ("mlp.router.bias", "BF16", (e,), bf16(e)),
        ]
        if real_sizes
        else []
    )
    n = layers + 1
    weight_map = {}
    for layer in range(layers):
        name = f"model-{layer + 1:05d}-of-{n:05d}.safetensors"
        tensors: list[tuple[str, str, tuple[int, ...], bytes | memoryview]] = [
            (f"model.layers.{layer}.mlp.experts.{t}", d, s, b.data) for t, d, s, b in expert
        ]
        tensors += [
            (f"model.layers.{layer}.mlp.router.weight", "BF16", (e, h), bf16(e, h)),
            (f"model.layers.{layer}.input_layernorm.weight", "BF16", (h,), bf16(h)),
        ]
        if real_sizes:
            tensors += [(f"model.layers.{layer}.{tensor}", d, s, b) for tensor, d, s, b in attention]
        _write_shard(out / name, tensors)
        weight_map.update({t[0]: name for t in tensors})
    name = f"model-{n:05d}-of-{n:05d}.safetensors"
    table = bf16(vocab, h)  # embedding and head: one draw, written twice
    rest = [
        ("model.embed_tokens.weight", "BF16", (vocab, h), table),
        ("model.norm.weight", "BF16", (h,), bf16(h)),
        ("lm_head.weight", "BF16", (vocab, h), table),
    ]
    _write_shard(out / name, rest)
    weight_map.update({t[0]: name for t in rest})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(_config(layers, experts, hidden, inter, vocab), indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--real-sizes", action="store_true", help="gpt-oss's vocabulary and attention tensors")
    args = parser.parse_args()
    write_synthetic(args.out, args.layers, args.experts, args.hidden, args.intermediate, real_sizes=args.real_sizes)


if __name__ == "__main__":
    main()
