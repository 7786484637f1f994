"""A gpt-oss-shaped synthetic MXFP4 checkpoint (HF layout), cheap to make: one layer's random
expert bytes are drawn once and written for every layer; the non-expert tensors are small.

    python bench/synthetic.py OUT --layers 4 --experts 32   # gpt-oss-20b shape (H = I = 2880)

Needs only numpy (no torch), so it also runs where mxconvert is not installed.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

VOCAB = 512


def _config(layers: int, experts: int, hidden: int, inter: int) -> dict:
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
        "vocab_size": VOCAB,
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


def write_synthetic(out: Path, layers: int, experts: int, hidden: int = 2880, inter: int = 2880, seed: int = 0) -> Path:
    """Write the checkpoint at `out` (one shard per layer plus one for the rest); returns `out`."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    e, h, i = experts, hidden, inter

    def bf16(*shape):  # small normal values, as bf16 bytes (the upper half of float32)
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
    n = layers + 1
    weight_map = {}
    for layer in range(layers):
        name = f"model-{layer + 1:05d}-of-{n:05d}.safetensors"
        tensors = [(f"model.layers.{layer}.mlp.experts.{t}", d, s, memoryview(b)) for t, d, s, b in expert]
        tensors += [
            (f"model.layers.{layer}.mlp.router.weight", "BF16", (e, h), bf16(e, h)),
            (f"model.layers.{layer}.input_layernorm.weight", "BF16", (h,), bf16(h)),
        ]
        _write_shard(out / name, tensors)
        weight_map.update({t[0]: name for t in tensors})
    name = f"model-{n:05d}-of-{n:05d}.safetensors"
    rest = [
        ("model.embed_tokens.weight", "BF16", (VOCAB, h), bf16(VOCAB, h)),
        ("model.norm.weight", "BF16", (h,), bf16(h)),
        ("lm_head.weight", "BF16", (VOCAB, h), bf16(VOCAB, h)),
    ]
    _write_shard(out / name, rest)
    weight_map.update({t[0]: name for t in rest})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(_config(layers, experts, hidden, inter), indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    args = parser.parse_args()
    write_synthetic(args.out, args.layers, args.experts, args.hidden, args.intermediate)


if __name__ == "__main__":
    main()
