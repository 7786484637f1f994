"""NVFP4 MoE layouts (spec nvfp4_transforms.md §4-§5, §10), keyed by backend and runtime revision.

Canonical input (one rank, spec §5 "common input"): `w13_weight u8 [E, 2N, K/2]` rows [w1; w3],
`w13_weight_scale e4m3 [E, 2N, K/16]`, `w13_weight_scale_2 f32 [E]` (gate's decode scale),
`w13_input_scale f32 [rows, 2]`, `w2_weight u8 [E, K, N/2]`, `w2_weight_scale e4m3 [E, K, N/16]`,
`w2_weight_scale_2 f32 [E]`, `w2_input_scale f32 [rows]`.

Weights and block scales are moves (`TensorLayout`, exact inverse); the global and activation scales
the kernels read are arithmetic on whole tensors (`DerivedTensor`, verified by recomputation):
- global-SF backends (TRTLLM, FlashInfer CUTLASS, CuteDSL, CuteDSL batched) reduce the activation
  scales to one max, repeated per expert (§4.2); VLLM_CUTLASS keeps per-expert maxima;
- vLLM 0.33 folds them into the weight global scales in place (`w_scale_2 * a_scale`, §5.9);
  the older revision keeps the weight scales and hands the kernels `g*_alphas = a * w`;
- TRTLLM also reads `g1_scale_c = g1_alphas * (1/a2)` (0.33) or `a13 * w13_scale_2 / a2` (older);
- Marlin rescales its block scales and global scales (§4.8 d-f) and reads no activation scales.
"""
from __future__ import annotations

import torch

from ..backends import Nvfp4Backend as NB
from ..errors import UnsupportedError
from ..revisions import RuntimeRevision
from .base import DerivedTensor, NIBBLES, TensorLayout, chain, pad_dims, permuted_view, round_up
from .marlin import PackInt32, repack_16bit
from .trtllm import row_shuffle_32


# ---- moves ------------------------------------------------------------------------------------------
def swap_halves(x: torch.Tensor, fill: int) -> torch.Tensor:
    """`reorder_w1w3_to_w3w1`: [w1; w3] -> [w3; w1] along the rows (dim 1)."""
    e, m, *rest = x.shape
    return x.reshape(e, 2, m // 2, *rest).flip(1).reshape(e, m, *rest)


def interleave_halves(x: torch.Tensor, fill: int) -> torch.Tensor:
    """FlashInfer's gated-act row reorder (`perm0`): out[2i] = first half i, out[2i+1] = second half i."""
    e, m, *rest = x.shape
    return x.reshape(e, 2, m // 2, *rest).transpose(1, 2).reshape(e, m, *rest)


def interleave_linear_and_gate(x: torch.Tensor, fill: int) -> torch.Tensor:
    """CuteDSL (§4.7): each 128-row block holds 64 rows of the first half, then 64 of the second."""
    e, m, *rest = x.shape
    if m % 128:
        raise ValueError(f"CuteDSL gate/linear interleave needs rows % 128 == 0, got {m}")
    return x.reshape(e, 2, m // 128, 64, *rest).transpose(1, 2).reshape(e, m, *rest)


def swizzle_128x4_padded(x: torch.Tensor, fill: int) -> torch.Tensor:
    """vLLM `swizzle_blockscale` (§4.5): pad to [E, ru(M,128), ru(K,4)], then the 128x4 swizzle;
    the result keeps the padded 3-D shape."""
    e, m, k = x.shape
    mp, kp = round_up(m, 128), round_up(k, 4)
    y = pad_dims(x, {1: mp, 2: kp}, fill)
    return y.reshape(e, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(e, mp, kp)


def _pad_halves(n_to: int):
    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, m, *rest = x.shape
        return pad_dims(x.reshape(e, 2, m // 2, *rest), {2: n_to}, fill).reshape(e, 2 * n_to, *rest)
    return arrange


def _pad(sizes_of):
    """Pad dims 1 and 2 to sizes computed from the input shape."""
    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        return pad_dims(x, sizes_of(tuple(x.shape)), fill)
    return arrange



def _no_move(x: torch.Tensor, fill: int) -> torch.Tensor:
    return x


# ---- activation / global scales ---------------------------------------------------------------------
def _global_max(num_local: int):
    def compute(a: torch.Tensor) -> torch.Tensor:
        return a.max().float().repeat(num_local)
    return compute


def _per_expert_max(a13: torch.Tensor) -> torch.Tensor:
    return a13.max(dim=1).values.float()


def _same(a: torch.Tensor) -> torch.Tensor:
    return a.float().clone()


def _times(reduce):
    """Folded weight global scale: `w_scale_2 * reduce(a_scale)` (one f32 multiply, order w*a)."""
    def compute(w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return w * reduce(a)
    return compute


def _alphas_unfolded(reduce):
    """Unfolded global scales: `g_alphas = a * w` from the quant config (order a*w)."""
    def compute(w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return reduce(a) * w
    return compute


def _scale_c_folded(reduce13, reduce2):
    """TRTLLM, folded global scales: `g1_scale_c = (w13_scale_2 * a13) * (1 / a2)`."""
    def compute(w13: torch.Tensor, a13: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
        return (w13 * reduce13(a13)) * (1.0 / reduce2(a2))
    return compute


def _scale_c_unfolded(reduce13, reduce2):
    """TRTLLM, unfolded global scales: `g1_scale_c = a13 * w13_scale_2 / a2`."""
    def compute(w13: torch.Tensor, a13: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
        return reduce13(a13) * w13 / reduce2(a2)
    return compute


# ---- Marlin scale processing (§4.8 c-f), all experts of a rank at once ---------------------------------
def marlin_scale_factor(scales: torch.Tensor) -> float:
    """`_nvfp4_compute_scale_factor` for bf16 activations: a power of two that lifts the largest scale."""
    x = scales.to(torch.bfloat16).float() * 128
    m = float(x[x > 0].max()) if bool((x > 0).any()) else 0.0
    if 0 < m < 448 * 128:
        return float(torch.exp2(torch.floor(torch.log2(torch.tensor(57344.0 / m, dtype=torch.float32)))))
    return 1.0


def marlin_process_scales(scales: torch.Tensor, sf: float, zero_below_2: bool = True) -> torch.Tensor:
    """Per expert: transpose to `[k/16, n]`, `marlin_permute_scales` (8x8 transpose per 64), then
    `nvfp4_marlin_process_scales`: [0,2,1,3] swap, x sf, x 128 in half, < 2 -> 0 (vLLM 0.33; the older
    revision keeps subnormal scales), high byte of bits << 1 (FP8-S0E5M3)."""
    e, n, kg = scales.shape
    s = scales.to(torch.bfloat16).transpose(1, 2).reshape(e, -1)
    s = s.reshape(e, -1, 8, 8).transpose(-1, -2).reshape(e, kg, n)
    ms = s.to(torch.half).reshape(e, -1, 4)[..., [0, 2, 1, 3]].reshape(e, kg, n)
    if sf > 1:
        ms = (ms.float() * sf).to(torch.half)
    ms = ms * 128
    if zero_below_2:
        ms = torch.where(ms < 2, torch.zeros_like(ms), ms)
    bits = (ms.view(torch.int16) << 1).view(torch.float8_e4m3fn)
    return bits.reshape(e, kg, 2 * n)[..., 1::2].contiguous()


def _marlin_scales(pad_rows, pad_cols):
    def compute(scales: torch.Tensor) -> torch.Tensor:
        padded = pad_dims(scales.to(torch.bfloat16), {1: pad_rows(scales.shape), 2: pad_cols(scales.shape)}, 0)
        if scales.device.type == "meta":
            e, n, kg = padded.shape
            return torch.empty((e, kg, n), dtype=torch.float8_e4m3fn, device="meta")
        return marlin_process_scales(padded, marlin_scale_factor(padded))
    return compute


def _marlin_global(pad_rows, pad_cols):
    def compute(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if scales.device.type == "meta":
            return torch.empty(w.shape, dtype=torch.float32, device="meta")
        padded = pad_dims(scales.to(torch.bfloat16), {1: pad_rows(scales.shape), 2: pad_cols(scales.shape)}, 0)
        return w.float() * 2.0**119 / marlin_scale_factor(padded)
    return compute


# ---- per backend ------------------------------------------------------------------------------------
_E4M3 = {"scale_encoding": "e4m3 block scales (group 16)"}


def nvfp4_layout_parts(backend: NB, revision: RuntimeRevision, hidden: int, inter: int, num_local: int,
                       gated: bool = True) -> tuple[dict, dict, dict]:
    """(tensor layouts, derived tensors, params) for one NVFP4 target."""
    fold = revision.nvfp4_fold_global_scales
    K, N = hidden, inter
    rows13 = {"row_order": "[w1 (gate); w3 (up)]"}
    w3w1 = {"row_order": "[w3 (up); w1 (gate)]"}
    natural = {"row_order": "natural"}
    global_sf = backend in (NB.FLASHINFER_TRTLLM, NB.FLASHINFER_CUTLASS, NB.FLASHINFER_CUTEDSL,
                            NB.FLASHINFER_CUTEDSL_BATCHED)
    reduce13 = _global_max(num_local) if global_sf else _per_expert_max
    reduce2 = _global_max(num_local) if global_sf else _same
    params: dict = {"global_scales_folded": fold, "activation_scale": "global max" if global_sf else "per expert"}

    def scales(extra_trtllm: bool) -> dict:
        derived = {
            "w13_input_scale": DerivedTensor("w13_input_scale", ("w13_input_scale",), reduce13,
                                             ("activation scale reduction",), {}),
            "w2_input_scale": DerivedTensor("w2_input_scale", ("w2_input_scale",), reduce2,
                                            ("activation scale reduction",), {}),
        }
        if fold:
            derived["w13_weight_scale_2"] = DerivedTensor(
                "w13_weight_scale_2", ("w13_weight_scale_2", "w13_input_scale"), _times(reduce13),
                ("fold: w13_weight_scale_2 *= a13",), {"meaning": "g1_alphas"})
            derived["w2_weight_scale_2"] = DerivedTensor(
                "w2_weight_scale_2", ("w2_weight_scale_2", "w2_input_scale"), _times(reduce2),
                ("fold: w2_weight_scale_2 *= a2",), {"meaning": "g2_alphas"})
        else:
            derived["w13_weight_scale_2"] = DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2",), _same, (), {})
            derived["w2_weight_scale_2"] = DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2",), _same, (), {})
            derived["g1_alphas"] = DerivedTensor("g1_alphas", ("w13_weight_scale_2", "w13_input_scale"),
                                                 _alphas_unfolded(reduce13), ("a13 * w13_scale_2",), {})
            derived["g2_alphas"] = DerivedTensor("g2_alphas", ("w2_weight_scale_2", "w2_input_scale"),
                                                 _alphas_unfolded(reduce2), ("a2 * w2_scale_2",), {})
        if extra_trtllm:
            fn = _scale_c_folded if fold else _scale_c_unfolded
            derived["g1_scale_c"] = DerivedTensor("g1_scale_c", ("w13_weight_scale_2", "w13_input_scale",
                                                                 "w2_input_scale"), fn(reduce13, reduce2),
                                                  ("g1_alphas * (1 / a2)",), {})
        return derived

    if backend == NB.FLASHINFER_TRTLLM:
        pad = revision.nvfp4_fi_padding
        kp, np_ = (round_up(K, pad[0]), round_up(N, pad[1])) if pad else (K, N)
        params.update({"hidden_padded": kp, "intermediate_padded": np_, "epilogue_tile_m": 128})
        tensors = {
            "w13_weight": TensorLayout("w13_weight", chain(swap_halves, _pad_halves(np_), _pad(lambda s: {2: kp // 2}),
                                                           interleave_halves, row_shuffle_32),
                                       steps=("reorder w1w3 -> w3w1", f"pad N to {np_}, K to {kp}",
                                              "gated row interleave", "row_shuffle_32"), info=w3w1),
            "w13_weight_scale": TensorLayout("w13_weight_scale", chain(swap_halves, _pad_halves(np_),
                                                                       _pad(lambda s: {2: kp // 16}), interleave_halves,
                                                                       row_shuffle_32, swizzle_128x4_padded),
                                             steps=("reorder w1w3 -> w3w1", "pad", "gated row interleave",
                                                    "row_shuffle_32", "swizzle_128x4"), info=w3w1 | _E4M3),
            "w2_weight": TensorLayout("w2_weight", chain(_pad(lambda s: {1: kp, 2: np_ // 2}), row_shuffle_32),
                                      steps=("pad", "row_shuffle_32"), info=natural),
            "w2_weight_scale": TensorLayout("w2_weight_scale", chain(_pad(lambda s: {1: kp, 2: np_ // 16}),
                                                                     row_shuffle_32, swizzle_128x4_padded),
                                            steps=("pad", "row_shuffle_32", "swizzle_128x4"), info=natural | _E4M3),
        }
        if pad is None and ((2 * N) % 128 or K % 128):
            raise UnsupportedError(f"FLASHINFER_TRTLLM in {revision.name} does not pad, and FlashInfer's scale row "
                                   f"shuffle needs rows % 128 == 0: 2N = {2 * N}, K = {K}")
        return tensors, scales(True), params

    if backend in (NB.FLASHINFER_CUTLASS, NB.VLLM_CUTLASS, NB.FLASHINFER_CUTEDSL_BATCHED) or (
            backend == NB.FLASHINFER_CUTEDSL and revision.nvfp4_cutedsl_prepare == "fi-or-cutlass"):
        reorder = backend == NB.FLASHINFER_CUTLASS
        if gated and (2 * N) % 128:
            raise UnsupportedError(f"{backend.value} cannot run 2N = {2 * N} (not a multiple of 128): vLLM raises "
                                   "NotImplementedError for padding a gated layer")
        first = (swap_halves,) if reorder else ()
        order = w3w1 if reorder else rows13
        steps = ("reorder w1w3 -> w3w1",) if reorder else ()
        tensors = {
            "w13_weight": TensorLayout("w13_weight", chain(*first) if first else _no_move, steps=steps, info=order),
            "w13_weight_scale": TensorLayout("w13_weight_scale", chain(*first, swizzle_128x4_padded),
                                             steps=(*steps, "swizzle_blockscale"), info=order | _E4M3),
            "w2_weight": TensorLayout("w2_weight", _no_move, info=natural),
            "w2_weight_scale": TensorLayout("w2_weight_scale", swizzle_128x4_padded, steps=("swizzle_blockscale",),
                                            info=natural | _E4M3),
        }
        return tensors, scales(False), params

    if backend == NB.FLASHINFER_CUTEDSL:  # vLLM 0.33's own prepare (§5.4)
        pad = revision.nvfp4_fi_padding or (1, 1)
        kp, np_ = round_up(K, pad[0]), round_up(N, pad[1])
        params.update({"hidden_padded": kp, "intermediate_padded": np_})
        mma = permuted_view(lambda s: (s[0], s[1] // 128, s[2] // 4, 32, 4, 4), (3, 4, 1, 5, 2, 0))
        mix = {"row_order": "[w3; w1], 64-row blocks of up then gate"}
        tensors = {
            "w13_weight": TensorLayout("w13_weight", chain(swap_halves, _pad_halves(np_), _pad(lambda s: {2: kp // 2}),
                                                           interleave_linear_and_gate),
                                       steps=("reorder w13 -> w31", "pad", "interleave_linear_and_gate(64)"), info=mix),
            "w13_weight_scale": TensorLayout("w13_weight_scale", chain(swap_halves, _pad_halves(np_),
                                                                       _pad(lambda s: {2: kp // 16}),
                                                                       interleave_linear_and_gate, swizzle_128x4_padded),
                                             view=mma, steps=("reorder", "pad", "interleave_linear_and_gate(64)",
                                                              "swizzle_blockscale", "view: cute mma layout"),
                                             info=mix | _E4M3),
            "w2_weight": TensorLayout("w2_weight", _pad(lambda s: {1: kp, 2: np_ // 2}), steps=("pad",), info=natural),
            "w2_weight_scale": TensorLayout("w2_weight_scale", chain(_pad(lambda s: {1: kp, 2: np_ // 16}),
                                                                     swizzle_128x4_padded),
                                            view=mma, steps=("pad", "swizzle_blockscale", "view: cute mma layout"),
                                            info=natural | _E4M3),
        }
        return tensors, scales(False), params

    if backend == NB.MARLIN and revision.nvfp4_marlin_scales == "plain":
        return _marlin_plain(K, N)
    if backend == NB.MARLIN:
        if K % 64:
            raise UnsupportedError(f"MARLIN needs the hidden size to be a multiple of 64, got {K}")
        np_ = round_up(N, 64) if K % 128 == 0 else round_up(N, 128)
        params = {"intermediate_padded": np_, "marlin_input_dtype": None}
        int32 = PackInt32("pack 8 codes per int32")

        def repack_w2(codes, fill):  # [E, K, N'] codes: size_k = N', size_n = K
            return repack_16bit(pad_dims(codes, {2: np_}, fill), fill)
        tensors = {
            "w13_weight": TensorLayout("w13_weight", chain(_pad_halves(np_), repack_16bit), int32, split=NIBBLES,
                                       steps=("pad halves", "gptq_marlin_repack 16x64", "pack int32"), info=rows13),
            "w2_weight": TensorLayout("w2_weight", repack_w2, int32, split=NIBBLES,
                                      steps=("pad", "gptq_marlin_repack 16x64", "pack int32"), info=natural),
        }
        derived = {
            "w13_weight_scale": DerivedTensor("w13_weight_scale", ("w13_weight_scale",),
                                              _marlin_scales_halves(np_), ("marlin scales",), _E4M3),
            "w13_weight_scale_2": DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2", "w13_weight_scale"),
                                                _marlin_global_halves(np_), ("w * 2^119 / sf",), {}),
            "w2_weight_scale": DerivedTensor("w2_weight_scale", ("w2_weight_scale",),
                                             _marlin_scales(lambda s: s[1], lambda s: np_ // 16), ("marlin scales",), _E4M3),
            "w2_weight_scale_2": DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2", "w2_weight_scale"),
                                               _marlin_global(lambda s: s[1], lambda s: np_ // 16), ("w * 2^119 / sf",), {}),
        }
        return tensors, derived, params
    raise UnsupportedError(f"NVFP4 backend {backend.value} is not laid out by this version of mxconvert")


def _marlin_plain(K: int, N: int) -> tuple[dict, dict, dict]:
    """MARLIN of the older revision (spec §10): no N padding, no rescale factor, subnormal block
    scales kept, global scales `bf16(w) * 2^119` held in bfloat16."""
    int32 = PackInt32("pack 8 codes per int32")

    def scales(s: torch.Tensor) -> torch.Tensor:
        if s.device.type == "meta":
            return torch.empty((s.shape[0], s.shape[2], s.shape[1]), dtype=torch.float8_e4m3fn, device="meta")
        return marlin_process_scales(s, 1.0, zero_below_2=False)

    def global_scale(w: torch.Tensor) -> torch.Tensor:
        return w.to(torch.bfloat16) * 2.0**119
    tensors = {
        "w13_weight": TensorLayout("w13_weight", repack_16bit, int32, split=NIBBLES,
                                   steps=("gptq_marlin_repack 16x64", "pack int32"),
                                   info={"row_order": "[w1 (gate); w3 (up)]"}),
        "w2_weight": TensorLayout("w2_weight", repack_16bit, int32, split=NIBBLES,
                                  steps=("gptq_marlin_repack 16x64", "pack int32"), info={"row_order": "natural"}),
    }
    derived = {
        name: DerivedTensor(name, (name,), scales, ("marlin scales (subnormals kept)",), _E4M3)
        for name in ("w13_weight_scale", "w2_weight_scale")
    } | {
        name: DerivedTensor(name, (name,), global_scale, ("bf16(w) * 2^119",), {})
        for name in ("w13_weight_scale_2", "w2_weight_scale_2")
    }
    return tensors, derived, {"intermediate_padded": N, "marlin_input_dtype": None}


def _halves_padded(scales: torch.Tensor, np_: int) -> torch.Tensor:
    e, m, kg = scales.shape
    return pad_dims(scales.reshape(e, 2, m // 2, kg), {2: np_}, 0).reshape(e, 2 * np_, kg)


def _marlin_scales_halves(np_: int):
    inner = _marlin_scales(lambda s: s[1], lambda s: s[2])

    def compute(scales: torch.Tensor) -> torch.Tensor:
        return inner(_halves_padded(scales, np_))
    return compute


def _marlin_global_halves(np_: int):
    inner = _marlin_global(lambda s: s[1], lambda s: s[2])

    def compute(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return inner(w, _halves_padded(scales, np_))
    return compute
