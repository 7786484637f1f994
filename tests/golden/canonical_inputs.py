"""Deterministic canonical MXFP4 MoE inputs for the golden data (plain torch only).

``make_canonical(E, H, I, Hp, Ip, seed)`` returns what vLLM's GPT-OSS loader holds for one rank
(docs/checkpoints.md, "GPT-OSS MXFP4 canonical tensors"): zero-filled parameters of the padded shapes, with random data
copied into the unpadded leading block of every dimension, exactly like
``param.data[:, :d1, :d2].copy_(w)``.

    w13_weight        uint8 [E, 2*Ip, Hp/2]   rows g0,u0,g1,u1,...
    w13_weight_scale  uint8 [E, 2*Ip, Hp/32]
    w13_bias          bf16  [E, 2*Ip]
    w2_weight         uint8 [E, Hp, Ip/2]
    w2_weight_scale   uint8 [E, Hp, Ip/32]
    w2_bias           bf16  [E, Hp]

Random data, drawn from ONE ``torch.Generator().manual_seed(seed)`` in this fixed order, each
with the unpadded shape:

    1. w13_weight        torch.randint(0, 256, [E, 2*I, H//2],  dtype=uint8)
    2. w13_weight_scale  torch.randint(100, 141, [E, 2*I, H//32], dtype=uint8)
    3. w13_bias          bf16 bit patterns, see _random_bf16, shape [E, 2*I]
    4. w2_weight         torch.randint(0, 256, [E, H, I//2],    dtype=uint8)
    5. w2_weight_scale   torch.randint(100, 141, [E, H, I//32],  dtype=uint8)
    6. w2_bias           bf16 bit patterns, shape [E, H]

Everything outside the unpadded block (w13 rows 2I..2Ip-1 and byte columns H/2..Hp/2-1, scale
columns H/32..Hp/32-1, w2 rows H..Hp-1 and byte columns I/2..Ip/2-1, bias tails) is 0.

Only ``torch.randint`` is used (no randn / rand), so the bytes do not depend on torch's
vectorised float sampling paths.
"""

from __future__ import annotations

import torch

NAMES = ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias")


def _random_bf16(shape, g: torch.Generator) -> torch.Tensor:
    """Random finite bf16: sign random, biased exponent in [120, 130] (|x| in [2^-7, 2^4)),
    7 random mantissa bits. Three randint draws, in the order sign, exponent, mantissa."""
    sign = torch.randint(0, 2, shape, dtype=torch.int32, generator=g)
    exp = torch.randint(120, 131, shape, dtype=torch.int32, generator=g)
    mant = torch.randint(0, 128, shape, dtype=torch.int32, generator=g)
    bits = (sign << 15) | (exp << 7) | mant  # 0 .. 65535
    bits = torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16)
    return bits.view(torch.bfloat16)


def make_canonical(E: int, H: int, I: int, Hp: int, Ip: int, seed: int) -> dict[str, torch.Tensor]:
    """Canonical loader tensors for E experts, hidden H, per-rank intermediate I, padded Hp/Ip."""
    for name, v in (("H", H), ("I", I), ("Hp", Hp), ("Ip", Ip)):
        if v % 32:
            raise ValueError(f"{name}={v} must be a multiple of 32")
    if Hp < H or Ip < I:
        raise ValueError("padded sizes must be >= unpadded sizes")
    g = torch.Generator().manual_seed(seed)
    u8 = torch.uint8

    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=u8, generator=g)
    s13 = torch.randint(100, 141, (E, 2 * I, H // 32), dtype=u8, generator=g)
    b13 = _random_bf16((E, 2 * I), g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=u8, generator=g)
    s2 = torch.randint(100, 141, (E, H, I // 32), dtype=u8, generator=g)
    b2 = _random_bf16((E, H), g)

    out = {
        "w13_weight": torch.zeros(E, 2 * Ip, Hp // 2, dtype=u8),
        "w13_weight_scale": torch.zeros(E, 2 * Ip, Hp // 32, dtype=u8),
        "w13_bias": torch.zeros(E, 2 * Ip, dtype=torch.bfloat16),
        "w2_weight": torch.zeros(E, Hp, Ip // 2, dtype=u8),
        "w2_weight_scale": torch.zeros(E, Hp, Ip // 32, dtype=u8),
        "w2_bias": torch.zeros(E, Hp, dtype=torch.bfloat16),
    }
    out["w13_weight"][:, : 2 * I, : H // 2] = w13
    out["w13_weight_scale"][:, : 2 * I, : H // 32] = s13
    out["w13_bias"][:, : 2 * I] = b13
    out["w2_weight"][:, :H, : I // 2] = w2
    out["w2_weight_scale"][:, :H, : I // 32] = s2
    out["w2_bias"][:, :H] = b2
    return out
