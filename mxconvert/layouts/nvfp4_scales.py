"""NVFP4 scale arithmetic: the kernel tensors computed from whole canonical scale tensors of a rank.

They are arithmetic, not moves (`DerivedTensor`: no inverse; verify recomputes them):
- activation scales: backends with a global scale factor (`NVFP4_GLOBAL_SF_BACKENDS`) reduce the
  input scales to one maximum, repeated per local expert; the others keep per-expert maxima;
- global scales: folded in place (`w_scale_2 * a`) or handed to the kernels as `g*_alphas = a * w`,
  as the revision row says (`nvfp4_fold_global_scales`); TRTLLM also reads `g1_scale_c`;
- Marlin rescales block scales and global scales (`marlin_scales`, `marlin_global_scales`).
Formulas and the vLLM functions they mirror: docs/layouts.md, "NVFP4 scales" and "MARLIN".
Each is a scale the kernel multiplies or divides by: the values computed are refused unless
finite, positive and normal (`DerivedTensor.check_values`, derived.py), since products and
reciprocals of scales that are each in range can leave the range.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import BFLOAT16, FLOAT8_E4M3FN, FLOAT32
from mxconvert.layouts.base import pad_dims
from mxconvert.layouts.derived import DerivedTensor, Formula, Spec, formula
from mxconvert.layouts.engine.shapes import ShapeOnly, broadcast_shapes
from mxconvert.target.backends import NVFP4_GLOBAL_SF_BACKENDS
from mxconvert.target.revisions import RuntimeRevision

if TYPE_CHECKING:
    import torch
else:  # imported when a scale is computed: planning only reads the formulas' specs
    from mxconvert.core.lazy_import import torch

#: A reduction of activation scales (one input).
Reduce = Formula

#: Info recorded for every NVFP4 block-scale tensor.
E4M3_BLOCK_SCALES = {"scale_encoding": "e4m3 block scales (group 16)"}


# ---- activation scales --------------------------------------------------------------------------
def global_max(num_local: int) -> Reduce:
    """One maximum over every element (all experts, both w13 columns), repeated per local expert."""

    @formula(lambda a: (FLOAT32, (num_local,)))
    def compute(a: torch.Tensor) -> torch.Tensor:
        return a.max().float().repeat(num_local)

    return compute


@formula(lambda a13: (FLOAT32, (*a13[1][:1], *a13[1][2:])))
def per_expert_max(a13: torch.Tensor) -> torch.Tensor:
    """w13: the larger of each expert's gate and up input scales."""
    return a13.max(dim=1).values.float()


@formula(lambda a: (FLOAT32, a[1]))
def unchanged(a: torch.Tensor) -> torch.Tensor:
    return a.float().clone()


# ---- global scales ------------------------------------------------------------------------------
def folded(reduce: Reduce):
    """`w_scale_2 * reduce(a_scale)`: one f32 multiply, in the order w * a."""

    @formula(lambda w, a: (FLOAT32, broadcast_shapes(w[1], reduce.spec(a)[1])))
    def compute(w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return w * reduce(a)

    return compute


def alphas(reduce: Reduce):
    """Unfolded: `g_alphas = reduce(a_scale) * w_scale_2`, in the order a * w."""

    @formula(lambda w, a: (FLOAT32, broadcast_shapes(reduce.spec(a)[1], w[1])))
    def compute(w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return reduce(a) * w

    return compute


def scale_c_folded(reduce13: Reduce, reduce2: Reduce):
    """TRTLLM `g1_scale_c = (w13_scale_2 * a13) * (1 / a2)`."""

    @formula(lambda w13, a13, a2: _scale_c_spec(reduce13, reduce2, w13, a13, a2))
    def compute(w13: torch.Tensor, a13: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
        return (w13 * reduce13(a13)) * (1.0 / reduce2(a2))

    return compute


def scale_c_unfolded(reduce13: Reduce, reduce2: Reduce):
    """TRTLLM `g1_scale_c = a13 * w13_scale_2 / a2` (may differ from the folded form in the last ulp)."""

    @formula(lambda w13, a13, a2: _scale_c_spec(reduce13, reduce2, w13, a13, a2))
    def compute(w13: torch.Tensor, a13: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
        return reduce13(a13) * w13 / reduce2(a2)

    return compute


def _scale_c_spec(reduce13: Reduce, reduce2: Reduce, w13: Spec, a13: Spec, a2: Spec) -> Spec:
    return FLOAT32, broadcast_shapes(w13[1], reduce13.spec(a13)[1], reduce2.spec(a2)[1])


def activation_params(backend: Enum, revision: RuntimeRevision) -> dict:
    """The manifest's record of how this target treats its global and activation scales."""
    global_sf = backend in NVFP4_GLOBAL_SF_BACKENDS
    return {
        "global_scales_folded": revision.nvfp4_fold_global_scales,
        "activation_scale": "global max" if global_sf else "per expert",
    }


def activation_and_global_scales(
    backend: Enum, revision: RuntimeRevision, num_local: int, trtllm: bool = False
) -> dict[str, DerivedTensor]:
    """The derived scale tensors of every NVFP4 backend prepared by FlashInfer's or vLLM's CUTLASS
    path (all but MARLIN): reduced activation scales, global scales (folded or with alphas), and
    for TRTLLM `g1_scale_c`."""
    global_sf = backend in NVFP4_GLOBAL_SF_BACKENDS
    reduce13 = global_max(num_local) if global_sf else per_expert_max
    reduce2 = global_max(num_local) if global_sf else unchanged
    derived = {
        "w13_input_scale": DerivedTensor(
            "w13_input_scale", ("w13_input_scale",), reduce13, ("activation scale reduction",), {}
        ),
        "w2_input_scale": DerivedTensor(
            "w2_input_scale", ("w2_input_scale",), reduce2, ("activation scale reduction",), {}
        ),
    }
    fold = revision.nvfp4_fold_global_scales
    if fold:
        derived["w13_weight_scale_2"] = DerivedTensor(
            "w13_weight_scale_2",
            ("w13_weight_scale_2", "w13_input_scale"),
            folded(reduce13),
            ("fold: w13_weight_scale_2 *= a13",),
            {"meaning": "g1_alphas"},
        )
        derived["w2_weight_scale_2"] = DerivedTensor(
            "w2_weight_scale_2",
            ("w2_weight_scale_2", "w2_input_scale"),
            folded(reduce2),
            ("fold: w2_weight_scale_2 *= a2",),
            {"meaning": "g2_alphas"},
        )
    else:
        derived["w13_weight_scale_2"] = DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2",), unchanged, (), {})
        derived["w2_weight_scale_2"] = DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2",), unchanged, (), {})
        derived["g1_alphas"] = DerivedTensor(
            "g1_alphas", ("w13_weight_scale_2", "w13_input_scale"), alphas(reduce13), ("a13 * w13_scale_2",), {}
        )
        derived["g2_alphas"] = DerivedTensor(
            "g2_alphas", ("w2_weight_scale_2", "w2_input_scale"), alphas(reduce2), ("a2 * w2_scale_2",), {}
        )
    if trtllm:
        scale_c = scale_c_folded if fold else scale_c_unfolded
        derived["g1_scale_c"] = DerivedTensor(
            "g1_scale_c",
            ("w13_weight_scale_2", "w13_input_scale", "w2_input_scale"),
            scale_c(reduce13, reduce2),
            ("g1_alphas * (1 / a2)",),
            {},
        )
    return derived


# ---- Marlin -------------------------------------------------------------------------------------
def marlin_scale_factor(scales: torch.Tensor) -> float:
    """`_nvfp4_compute_scale_factor` for bf16 activations: a power of two that lifts the largest scale."""
    x = scales.to(torch.bfloat16).float() * 128
    m = float(x[x > 0].max()) if bool((x > 0).any()) else 0.0
    if 0 < m < 448 * 128:
        return float(torch.exp2(torch.floor(torch.log2(torch.tensor(57344.0 / m, dtype=torch.float32)))))
    return 1.0


def marlin_process_scales(scales: torch.Tensor, sf: float, zero_below_2: bool = True) -> torch.Tensor:
    """Per expert: transpose to `[k/16, n]`, `marlin_permute_scales` (8x8 transpose per 64), then
    `nvfp4_marlin_process_scales`: [0,2,1,3] swap, x sf, x 128 in half, < 2 -> 0 (unless
    `zero_below_2` is off: the "plain" revisions keep subnormal scales), high byte of bits << 1
    (FP8-S0E5M3)."""
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


Pad = Callable[["torch.Tensor"], "torch.Tensor"]


def marlin_scales(pad: Pad):
    """Rescaled Marlin block scales of the (padded) scales `pad(scales)`."""

    @formula(lambda scales: _marlin_scales_spec(pad(ShapeOnly(scales[1])).shape))  # type: ignore[arg-type]
    def compute(scales: torch.Tensor) -> torch.Tensor:
        padded = pad(scales.to(torch.bfloat16))
        if scales.device.type == "meta":
            e, n, kg = padded.shape
            return torch.empty((e, kg, n), dtype=torch.float8_e4m3fn, device="meta")
        return marlin_process_scales(padded, marlin_scale_factor(padded))

    return compute


def marlin_global_scales(pad: Pad):
    """`w * 2^119 / sf`, with `sf` the scale factor of the (padded) block scales."""

    @formula(lambda w, scales: (FLOAT32, w[1]))
    def compute(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if scales.device.type == "meta":
            return torch.empty(w.shape, dtype=torch.float32, device="meta")
        return w.float() * 2.0**119 / marlin_scale_factor(pad(scales.to(torch.bfloat16)))

    return compute


def _marlin_scales_spec(shape: tuple[int, ...]) -> Spec:
    """Marlin block scales `[E, N, K/16]` -> `[E, K/16, N]` float8_e4m3fn (`marlin_process_scales`)."""
    e, n, kg = shape
    return FLOAT8_E4M3FN, (e, kg, n)


@formula(lambda s: _marlin_scales_spec(s[1]))
def plain_marlin_scales(s: torch.Tensor) -> torch.Tensor:
    """Marlin block scales without padding or factor, subnormals kept."""
    if s.device.type == "meta":
        return torch.empty((s.shape[0], s.shape[2], s.shape[1]), dtype=torch.float8_e4m3fn, device="meta")
    return marlin_process_scales(s, 1.0, zero_below_2=False)


@formula(lambda w: (BFLOAT16, w[1]))
def plain_marlin_global_scales(w: torch.Tensor) -> torch.Tensor:
    """`bf16(w) * 2^119`, held in bfloat16."""
    return w.to(torch.bfloat16) * 2.0**119


def pad_scale_halves(n_to: int) -> Pad:
    """w13 block scales `[E, 2N, K/16]`: each half padded to `n_to` rows with zeros."""

    def pad(scales: torch.Tensor) -> torch.Tensor:
        e, m, kg = scales.shape
        return pad_dims(scales.reshape(e, 2, m // 2, kg), {2: n_to}, 0).reshape(e, 2 * n_to, kg)

    return pad


def pad_scale_columns(cols: int) -> Pad:
    """w2 block scales `[E, K, N/16]`: columns padded to `cols` with zeros."""

    def pad(scales: torch.Tensor) -> torch.Tensor:
        return pad_dims(scales, {2: cols}, 0)

    return pad


# ---- SGLang's CuTe DSL standard path ------------------------------------------------------------
def cutedsl_standard_scales(num_local: int) -> dict[str, DerivedTensor]:
    """The scalars SGLang 0.5.23's CuTe DSL v2 standard path keeps on the layer (docs/sglang.md,
    "NVFP4"; the row's `nvfp4_cutedsl_prepare` "interleaved-unfolded"): `ModelOptNvFp4FusedMoEMethod.
    process_weights_after_loading` reduces w13's input scales to one maximum, repeated per expert, but
    keeps w2's per expert, and leaves the weight global scales unfolded, because at the first forward
    `resolve_cutedsl_standard_scales` (layers/moe/moe_runner/flashinfer_cutedsl.py) divides the raw
    `w13/w2_weight_scale_2` by the reciprocal of the largest input scale, which a folded `w * a` is
    not bit for bit. Held: both reduced input scales, both raw global scales and SGLang's
    `g1_alphas` = a13 * w13's, `g2_alphas` = a2[e] * w2's (`_compute_gemm1_alphas`, order a * w)."""
    reduce13 = global_max(num_local)
    return {
        "w13_input_scale": DerivedTensor(
            "w13_input_scale", ("w13_input_scale",), reduce13, ("activation scale reduction",), {}
        ),
        "w2_input_scale": DerivedTensor("w2_input_scale", ("w2_input_scale",), unchanged, ("per expert",), {}),
        "w13_weight_scale_2": DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2",), unchanged, (), {}),
        "w2_weight_scale_2": DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2",), unchanged, (), {}),
        "g1_alphas": DerivedTensor(
            "g1_alphas", ("w13_weight_scale_2", "w13_input_scale"), alphas(reduce13), ("a13 * w13_scale_2",), {}
        ),
        "g2_alphas": DerivedTensor(
            "g2_alphas", ("w2_weight_scale_2", "w2_input_scale"), alphas(unchanged), ("a2[e] * w2_scale_2",), {}
        ),
    }


# ---- SGLang's compressed-tensors W4A4 scheme, FlashInfer CUTLASS --------------------------------
#: The layout description's `activation_scale` of this variant: what `layout_from_target` rebuilds it by.
CT_W4A4_CUTLASS_ACTIVATION_SCALE = "per expert, stored input_global_scale (w13: min of gate, up)"


@formula(lambda raw13: (FLOAT32, (*raw13[1][:1], *raw13[1][2:])))
def stored_min(raw13: torch.Tensor) -> torch.Tensor:
    """`w13_input_global_scale.min(dim=1).values.to(torch.float32)`: the smaller stored (encode) scale."""
    return raw13.min(dim=1).values.to(torch.float32)


@formula(lambda w, raw: (FLOAT32, broadcast_shapes(raw[1][:1], w[1])))
def ct_w13_alphas(w: torch.Tensor, raw13: torch.Tensor) -> torch.Tensor:
    """`g1_alphas = (1 / stored_min) * w13_weight_scale_2`, SGLang's order."""
    return (1 / raw13.min(dim=1).values.to(torch.float32)) * w


@formula(lambda w, raw: (FLOAT32, broadcast_shapes(raw[1], w[1])))
def ct_w2_alphas(w: torch.Tensor, raw2: torch.Tensor) -> torch.Tensor:
    """`g2_alphas = ((1 / w2_input_global_scale) * w2_weight_scale_2).to(torch.float32)`."""
    return ((1 / raw2) * w).to(torch.float32)


def ct_w4a4_cutlass_scales() -> dict[str, DerivedTensor]:
    """The scalars SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE.process_weights_after_loading`
    (layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py, the CUTLASS
    branch) leaves for `cutlass_fused_moe` (docs/sglang.md, "NVFP4"): per expert, `w13_input_scale_quant`
    is the smaller of gate's and up's *stored* `input_global_scale` (compressed-tensors stores the
    encode scale; `1 / (1 / x)` of the decoded canonical scale is not x for about one float32 in eight,
    so these read the stored scales, the canonical `w13/w2_input_global_scale`), `w2_input_scale_quant`
    w2's stored one, `g1_alphas` / `g2_alphas` their reciprocals times the (decoded) weight global scales,
    which `w13/w2_weight_scale_2` hold as the canonical tensors do (`1 / gate's`, `1 / w2's`)."""
    return {
        "w13_weight_scale_2": DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2",), unchanged, (), {}),
        "w2_weight_scale_2": DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2",), unchanged, (), {}),
        "g1_alphas": DerivedTensor(
            "g1_alphas",
            ("w13_weight_scale_2", "w13_input_global_scale"),
            ct_w13_alphas,
            ("(1 / min(stored gate, up input scale)) * w13_scale_2",),
            {},
        ),
        "g2_alphas": DerivedTensor(
            "g2_alphas",
            ("w2_weight_scale_2", "w2_input_global_scale"),
            ct_w2_alphas,
            ("(1 / stored w2 input scale) * w2_scale_2",),
            {},
        ),
        "w13_input_scale_quant": DerivedTensor(
            "w13_input_scale_quant",
            ("w13_input_global_scale",),
            stored_min,
            ("min of gate's and up's stored input_global_scale",),
            {},
        ),
        "w2_input_scale_quant": DerivedTensor(
            "w2_input_scale_quant", ("w2_input_global_scale",), unchanged, ("stored input_global_scale",), {}
        ),
    }


# ---- SGLang's compressed-tensors W4A4 scheme, FlashInfer TRT-LLM --------------------------------
#: The layout description's `activation_scale` of this variant: what `layout_from_target` rebuilds it by.
CT_W4A4_TRTLLM_ACTIVATION_SCALE = "one min of the stored input_global_scale over local experts, repeated"


def stored_global_min(num_local: int) -> Reduce:
    """`input_global_scale.min().to(torch.float32).expand(num_local)`: the smallest stored (encode) scale
    of every local expert (w13: gate's and up's), one value repeated per local expert."""

    @formula(lambda raw: (FLOAT32, (num_local,)))
    def compute(raw: torch.Tensor) -> torch.Tensor:
        return raw.min().to(torch.float32).expand(num_local).contiguous()

    return compute


def ct_w4a4_trtllm_scales(num_local: int) -> dict[str, DerivedTensor]:
    """The scalars SGLang 0.5.23's `CompressedTensorsW4A4Nvfp4MoE.process_weights_after_loading` (the
    `use_flashinfer_trtllm` branch, layers/quantization/compressed_tensors/schemes/
    compressed_tensors_w4a4_nvfp4_moe.py) leaves for `trtllm_fp4_block_scale_moe` (docs/sglang.md, "NVFP4"):
    `w13_input_scale_quant` ONE minimum of the *stored* `w13_input_global_scale` over all local experts
    (gate and up), repeated per expert, `w2_input_scale_quant` the same of w2's, `g1_alphas` /
    `g2_alphas` their reciprocals times the (decoded) weight global scales, and `g1_scale_c =
    w2_input_scale_quant * g1_alphas`. The stored scales are read (`1 / (1 / x)` of the decoded canonical
    ones is not x for about one float32 in eight)."""
    w13_min, w2_min = stored_global_min(num_local), stored_global_min(num_local)

    @formula(lambda w, raw: (FLOAT32, broadcast_shapes((num_local,), w[1])))
    def w13_alphas(w: torch.Tensor, raw13: torch.Tensor) -> torch.Tensor:
        """`g1_alphas = (1 / w13_input_scale_quant) * w13_weight_scale_2`, SGLang's order."""
        return (1 / w13_min(raw13)) * w

    @formula(lambda w, raw: (FLOAT32, broadcast_shapes((num_local,), w[1])))
    def w2_alphas(w: torch.Tensor, raw2: torch.Tensor) -> torch.Tensor:
        """`g2_alphas = ((1 / w2_input_scale_quant) * w2_weight_scale_2).to(torch.float32)`."""
        return ((1 / w2_min(raw2)) * w).to(torch.float32)

    @formula(lambda w, raw13, raw2: (FLOAT32, broadcast_shapes((num_local,), w[1])))
    def scale_c(w: torch.Tensor, raw13: torch.Tensor, raw2: torch.Tensor) -> torch.Tensor:
        """`g1_scale_c = (w2_input_scale_quant * g1_alphas).to(torch.float32)`."""
        return (w2_min(raw2) * w13_alphas(w, raw13)).to(torch.float32)

    w13, w2 = "w13_input_global_scale", "w2_input_global_scale"
    return {
        "w13_weight_scale_2": DerivedTensor("w13_weight_scale_2", ("w13_weight_scale_2",), unchanged, (), {}),
        "w2_weight_scale_2": DerivedTensor("w2_weight_scale_2", ("w2_weight_scale_2",), unchanged, (), {}),
        "g1_alphas": DerivedTensor(
            "g1_alphas",
            ("w13_weight_scale_2", w13),
            w13_alphas,
            ("(1 / min stored w13 input scale) * w13_scale_2",),
            {},
        ),
        "g2_alphas": DerivedTensor(
            "g2_alphas", ("w2_weight_scale_2", w2), w2_alphas, ("(1 / min stored w2 input scale) * w2_scale_2",), {}
        ),
        "g1_scale_c": DerivedTensor(
            "g1_scale_c",
            ("w13_weight_scale_2", w13, w2),
            scale_c,
            ("min stored w2 input scale * g1_alphas",),
            {},
        ),
        "w13_input_scale_quant": DerivedTensor(
            "w13_input_scale_quant", (w13,), w13_min, ("min of every local expert's stored gate, up input scale",), {}
        ),
        "w2_input_scale_quant": DerivedTensor(
            "w2_input_scale_quant", (w2,), w2_min, ("min of every local expert's stored w2 input scale",), {}
        ),
    }
