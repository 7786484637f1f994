"""Deterministic canonical NVFP4 MoE inputs for the golden data (plain torch only).

``make_nvfp4_canonical(E, K, N, seed, *, gated=True, w4a16=False)`` returns the canonical NVFP4
tensors of one rank (docs/checkpoints.md, "NVFP4 canonical tensors"): exactly the tensors vLLM's NVFP4 MoE
quant method hands to ``convert_to_nvfp4_moe_kernel_format`` (ModelOpt and compressed-tensors
agree from this point on). Names are vLLM's layer-parameter names; ``S = 2 if gated else 1``.

    w13_weight          uint8          [E, S*N, K/2]   rows [w1 = gate ; w3 = up] (gated)
    w13_weight_scale    float8_e4m3fn  [E, S*N, K/16]
    w13_weight_scale_2  float32        [E]             gate's decode global scale (up's is dropped)
    w13_input_scale     float32        [E, S]          a13 (decode), per expert and half
    w2_weight           uint8          [E, K, N/2]
    w2_weight_scale     float8_e4m3fn  [E, K, N/16]
    w2_weight_scale_2   float32        [E]
    w2_input_scale      float32        [E]             a2 (decode)

With ``w4a16=True`` (ModelOpt ``W4A16_NVFP4`` / CT NVFP4A16) the two ``*_input_scale`` entries
are absent.

Random data comes from ONE ``torch.Generator().manual_seed(seed)``, drawn only with
``torch.randint`` (no float sampling), in this fixed order:

    1. w13_weight          randint(0, 256, [E, S*N, K/2], uint8)
    2. w13_weight_scale    e4m3 byte codes randint(1, 127)  -> 0x01..0x7E: every positive
                           finite e4m3 value, max 448, 7 of the 126 codes subnormal (< 2^-6)
    3. w13_weight_scale_2  _random_f32(E,  exp2 in [-14, -8])
    4. w13_input_scale     _random_f32(E*S, exp2 in [-10, -5]) reshaped [E, S]  (skipped if w4a16)
    5. w2_weight           randint(0, 256, [E, K, N/2], uint8)
    6. w2_weight_scale     e4m3 byte codes randint(1, 96)   -> 0x01..0x5F: max 30.0 (so Marlin's
                           power-of-two rescale factor is 8 for w2, 1 for w13), subnormals included
    7. w2_weight_scale_2   _random_f32(E,  exp2 in [-14, -8])
    8. w2_input_scale      _random_f32(E,  exp2 in [-10, -5])                   (skipped if w4a16)

``_random_f32(n, lo, hi)`` draws an unbiased exponent in [lo, hi] then 23 mantissa bits (two
randint calls, exponent first) and assembles the float32 bit pattern: positive, normal, exact.
The gate and up columns of ``w13_input_scale`` differ on purpose (real ModelOpt exports unify
them; different values make the per-expert ``max(dim=1)`` of VLLM_CUTLASS observable).

Not a package module: import it with ``sys.path.insert(0, "tests/golden")`` or importlib.
"""

from __future__ import annotations

import torch

NAMES = (
    "w13_weight",
    "w13_weight_scale",
    "w13_weight_scale_2",
    "w13_input_scale",
    "w2_weight",
    "w2_weight_scale",
    "w2_weight_scale_2",
    "w2_input_scale",
)

W13_SCALE_CODES = (1, 127)  # randint bounds (high exclusive): 0x01..0x7E
W2_SCALE_CODES = (1, 96)    # 0x01..0x5F


def _random_f32(n: int, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    exp = torch.randint(lo + 127, hi + 128, (n,), dtype=torch.int64, generator=g)
    mant = torch.randint(0, 1 << 23, (n,), dtype=torch.int64, generator=g)
    bits = (exp << 23) | mant  # sign 0, always < 2^31
    return bits.to(torch.int32).view(torch.float32)


def _e4m3(shape, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(lo, hi, shape, dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)


def make_nvfp4_canonical(E: int, K: int, N: int, seed: int, *, gated: bool = True,
                         w4a16: bool = False) -> dict[str, torch.Tensor]:
    """Canonical NVFP4 tensors (as handed to the conversion) for E local experts, hidden K, per-rank intermediate N."""
    if K % 16 or N % 16:
        raise ValueError(f"K={K} and N={N} must be multiples of 16")
    S = 2 if gated else 1
    g = torch.Generator().manual_seed(seed)
    u8 = torch.uint8
    out: dict[str, torch.Tensor] = {}
    out["w13_weight"] = torch.randint(0, 256, (E, S * N, K // 2), dtype=u8, generator=g)
    out["w13_weight_scale"] = _e4m3((E, S * N, K // 16), *W13_SCALE_CODES, g)
    out["w13_weight_scale_2"] = _random_f32(E, -14, -8, g)
    if not w4a16:
        out["w13_input_scale"] = _random_f32(E * S, -10, -5, g).reshape(E, S)
    out["w2_weight"] = torch.randint(0, 256, (E, K, N // 2), dtype=u8, generator=g)
    out["w2_weight_scale"] = _e4m3((E, K, N // 16), *W2_SCALE_CODES, g)
    out["w2_weight_scale_2"] = _random_f32(E, -14, -8, g)
    if not w4a16:
        out["w2_input_scale"] = _random_f32(E, -10, -5, g)
    return out
