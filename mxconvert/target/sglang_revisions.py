"""SGLang runtime revisions: one row per mirrored SGLang release (docs/sglang.md).

The rows are `RuntimeRevision`s with `runtime="sglang"`, kept apart from vLLM's `REVISIONS`
(target/revisions.py): `--runtime sglang==X.Y.Z` resolves to them (target/releases.py), and no
code that walks vLLM's rows (the plugin's checks, `mxconvert runtimes`) meets them.

What differs from vLLM is a field of the row, as for vLLM's rows:

* `mxfp4_round_up`: SGLang 0.5.23's own padding of GPT-OSS MXFP4 experts
  (sglang/srt/layers/quantization/mxfp4.py `Mxfp4MoEMethod.create_weights`, and `FusedMoE.__init__`
  in layers/moe/fused_moe_triton/layer.py, which first rounds the hidden size to 256 for
  `flashinfer_mxfp4`).
* `mxfp4_scale_pad_fill`: SGLang fills the padding of its MXFP4 scale parameters with 0x7F
  (`_UE8M0_ONE`, E8M0 1.0: `create_weights` makes them with `torch.full(..., _UE8M0_ONE)` and the
  GPT-OSS loader copies the checkpoint into `[:, :rows, :cols]` only, `FusedMoE.weight_loader`),
  where vLLM pads with zeros; the canonical tensors take the row's fill
  (formats/mxfp4/canonical.py), and with it the reused FlashInfer TRT-LLM layout gives SGLang's
  bytes bit for bit (tests/test_sglang_golden.py).
* `mxfp4_marlin_w13_rows`: "halves": SGLang de-interleaves GPT-OSS's gate/up rows before its Marlin
  preparation (layers/quantization/marlin_utils_fp4.py `deinterleave_moe_mxfp4_w13_for_marlin`), the
  rest of which is vLLM's MXFP4 Marlin layout bit for bit (tests/test_sglang_marlin.py).
* `unproven_layouts`: every backend not proven yet, each with the reason, so `convert` refuses to
  write those bytes (layouts/registry.py `build_layout`). A key "nvfp4:MARLIN" names one format's
  backend where MXFP4's and NVFP4's enums share the value (`unproven_layout_reason`).

NVFP4 (docs/sglang.md, "NVFP4"): the row selects (selection/sglang/nvfp4_0_5_23.py) and writes
FLASHINFER_TRTLLM, SGLang's pick on SM100, MARLIN, its pick on SM80-SM90, and FLASHINFER_CUTLASS
(`--moe-runner-backend flashinfer_cutlass` on Blackwell) for ModelOpt checkpoints: `nvfp4_fi_padding`
(1, 64) with the folded global scales (the default `nvfp4_fold_global_scales`), `nvfp4_marlin_scales`
"plain", and vLLM's FlashInfer CUTLASS NVFP4 layout (layouts/cutlass.py, no row field: SGLang's
[up; gate] loading and `swizzle_blockscale` are its bytes) give SGLang's own bytes
(tests/test_sglang_nvfp4_golden.py, tests/test_sglang_nvfp4_cutlass.py, tools/golden/sglang_nvfp4.py).
FLASHINFER_CUTEDSL (`--moe-runner-backend flashinfer_cutedsl`, the v2 standard path) is written too: vLLM
0.33's "interleaved" CuTe DSL bytes with SGLang's own scalars (`nvfp4_cutedsl_prepare` "interleaved-unfolded",
tests/test_sglang_nvfp4_cutedsl.py). compressed-tensors checkpoints: MARLIN
(`CompressedTensorsW4A16Nvfp4MoE`) is written, the rest refused (`SGLANG_NVFP4_COMPRESSED_TENSORS` below,
formats/nvfp4/format.py; tests/test_sglang_nvfp4_ct.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mxconvert.core.errors import InputError
from mxconvert.target.backends import CUTLASS_BACKENDS, MARLIN_BACKENDS, TRTLLM_BACKENDS, Nvfp4Backend
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.revisions import RoundUpRule, RuntimeRevision, get_revision

#: The runtime name of these rows (`RuntimeRevision.runtime`, `--runtime sglang==X.Y.Z`).
RUNTIME = "sglang"


def _rule(backends, platforms, i_align: int, h_align: int | None) -> RoundUpRule:
    return RoundUpRule(
        frozenset(backends) if backends is not None else None,
        frozenset(platforms) if platforms is not None else None,
        i_align,
        h_align,
    )


# SGLang 0.5.23 `Mxfp4MoEMethod.create_weights` (first branch that applies wins):
#  * marlin: I -> 128, H -> 256;
#  * SM100 flashinfer_mxfp4 (TRT-LLM): FusedMoE rounds H to 256, create_weights I -> 128, H -> 128;
#  * SM90 / SM120 flashinfer_mxfp4 (CUTLASS): FusedMoE rounds H to 256, create_weights leaves I as
#    the checkpoint's (a multiple of 32 wherever SGLang can load it: `cutlass_layer_refusal`) and
#    `_process_weights_for_sm{90,120}_cutlass` pads I to 128 after loading, with zeros: the layout's
#    step (the row's `mxfp4_cutlass_pad`, layouts/cutlass.py);
#  * ROCm with SGLANG_USE_AITER: I -> 256, H -> 256 (128 with SGLANG_AITER_K3_OPT);
#  * XPU: I -> 32, H unchanged;
#  * triton_kernels installed: I -> 64, H unchanged.
_ROUND_UP_0_5_23 = (
    _rule(MARLIN_BACKENDS, None, 128, 256),
    _rule(TRTLLM_BACKENDS, None, 128, 256),
    _rule(CUTLASS_BACKENDS, None, 32, 256),
    _rule({B.AITER_MXFP4_BF16}, {"rocm"}, 256, 256),
    _rule({B.XPU}, None, 32, None),
    _rule(None, None, 64, None),
)

_TRITON = (
    "SGLang 0.5.23 uses whichever triton_kernels is installed (it vendors none; its torch pin brings triton 3.8). "
    "Run with the package index's copy of that API (tokenspeed-triton-kernels 1.0.0.post20260510), its SM90 "
    "scales hold two padding values (SGLang's 0x7F scale groups, the Hopper scale layout's zero rows) that one "
    "layout pad value cannot write (tools/golden/sglang_mxfp4_triton.py), and triton 3.8 pads the Hopper values "
    'differently (triton PR #10428), with no reference run (docs/sglang.md, "triton_kernels")'
)

#: SGLang 0.5.23's NVFP4 MoE preparation per backend, and why it is not written yet (docs/sglang.md, "NVFP4"):
#: none left for ModelOpt checkpoints. FLASHINFER_CUTLASS is written: [up; gate] loading and
#: `swizzle_blockscale` are vLLM's FlashInfer CUTLASS NVFP4 layout with the folded global scales, bit for
#: bit (tests/test_sglang_nvfp4_cutlass.py); FLASHINFER_CUTEDSL (the v2 standard path) is written: its
#: `interleave_w13_halves` of [up; gate] in 64-row chunks, `swizzle_blockscale` and
#: `convert_sf_to_mma_layout` are vLLM 0.33's "interleaved" CuTe DSL bytes, its scalars the row's
#: `nvfp4_cutedsl_prepare` "interleaved-unfolded" (tests/test_sglang_nvfp4_cutedsl.py).
_NVFP4_UNPROVEN: tuple[tuple[str, str], ...] = ()

SGLANG_REVISIONS: dict[str, RuntimeRevision] = {
    r.name: r
    for r in (
        RuntimeRevision(
            name="sglang-0.5.23",
            runtime=RUNTIME,
            versions="0.5.23",
            formats=frozenset({"mxfp4", "nvfp4"}),
            # SGLang 0.5.23 imports `triton_kernels` from wherever it is installed (utils/common.py
            # `is_triton_kernels_available`); it is not among the wheel's requirements.
            triton_kernels="unpinned",
            # sglang-0.5.23 METADATA: flashinfer_python[cu13]==0.7.2. Its Python helpers the TRT-LLM
            # preparation calls (flashinfer/utils.py, get_w2_permute_indices_with_cache) are the
            # same as 0.7.2.post1's (docs/sglang.md, "FlashInfer").
            flashinfer="0.7.2",
            selection="sglang-0.5.23",
            mxfp4_round_up=_ROUND_UP_0_5_23,
            # create_weights makes the scale parameters with torch.full(..., _UE8M0_ONE) and the
            # GPT-OSS loader copies the checkpoint into [:, :rows, :cols] only (docs/sglang.md).
            mxfp4_scale_pad_fill=0x7F,
            # process_weights_after_loading runs deinterleave_moe_mxfp4_w13_for_marlin (GPT-OSS has
            # gemm1_alpha and interleaved gate/up) before vLLM's Marlin preparation (docs/sglang.md).
            mxfp4_marlin_w13_rows="halves",
            # FLASHINFER_CUTLASS (SM90 BF16, SM120 MXFP8): _process_weights_for_sm{90,120}_cutlass pad I
            # to 128 after loading, then vLLM 0.33's moves (docs/sglang.md, "FLASHINFER_CUTLASS").
            mxfp4_cutlass_pad="after-load-128",
            # FLASHINFER_TRTLLM_MXFP4_MXFP8 is proven: tests/test_sglang_golden.py; MARLIN:
            # tests/test_sglang_marlin.py; FLASHINFER_CUTLASS_MXFP4_BF16 and _MXFP8: tests/test_sglang_cutlass.py;
            # AITER_MXFP4_BF16 (ROCm gfx95x, SGLANG_USE_AITER=1 with SGLANG_AITER_K3_OPT off and
            # SGLANG_USE_AITER_MOE_GU_ITLV on, the defaults; other values are refused by the mirror):
            # the `_use_aiter` branch de-interleaves w13 over the padded rows (I 256, H 256, scales 0x7F)
            # and runs shuffle_weight_a16w4 / shuffle_scale_a16w4, which is vLLM's AITER layout
            # (layouts/aiter.py) bit for bit on the row's canonical tensors: tests/test_sglang_aiter.py.
            unproven_layouts=(
                (B.TRITON.value, _TRITON),
                (B.XPU.value, "SGLang 0.5.23's XPU path keeps the checkpoint layout; not compared yet"),
                (B.CPU.value, "SGLang 0.5.23's Intel AMX packing (sgl_kernel.convert_weight_packed) is not mirrored"),
                # NVFP4: selected, never written yet (docs/sglang.md, "NVFP4").
                *_NVFP4_UNPROVEN,
            ),
            # NVFP4 FLASHINFER_TRTLLM (ModelOpt): create_weights rounds a gated layer's I to 64 and
            # trtllm_nvfp4_hidden_alignment leaves H unpadded (1; per-token non-gated layers are not
            # mirrored); with vLLM 0.33's moves (layouts/trtllm.py) and folded global scales that is
            # SGLang's bytes bit for bit (tests/test_sglang_nvfp4_golden.py).
            nvfp4_fi_padding=(1, 64),
            # NVFP4 MARLIN (ModelOpt, SGLang's pick on SM80-SM90): prepare_moe_nvfp4_layer_for_marlin pads no
            # gated layer, keeps subnormal block scales (nvfp4_marlin_process_scales) and hands the kernel
            # bf16(w) * 2^119 (nvfp4_marlin_process_global_scale): vLLM ~0.15's "plain" Marlin scales, bit for
            # bit (tests/test_sglang_nvfp4_golden.py).
            nvfp4_marlin_scales="plain",
            # NVFP4 FLASHINFER_CUTEDSL (ModelOpt, the v2 standard path, a2a none): SGLang loads w13 as [up; gate],
            # interleave_w13_halves(64), swizzle_blockscale, convert_sf_to_mma_layout: vLLM 0.33's "interleaved"
            # bytes (an I / tp not a multiple of 64 SGLang raises on; the mirror refuses it, so nothing is padded).
            # Its scalars differ: w2's input scales stay per expert and the global scales unfolded, which
            # resolve_cutedsl_standard_scales divides by 1 / a (layouts/nvfp4_scales.py cutedsl_standard_scales;
            # tests/test_sglang_nvfp4_cutedsl.py).
            nvfp4_cutedsl_prepare="interleaved-unfolded",
            releases={"mxfp4": ("0.5.23",), "nvfp4": ("0.5.23",)},
            notes=(
                "SGLang: selection mirrored; MXFP4 FLASHINFER_TRTLLM_MXFP4_MXFP8, MARLIN, FLASHINFER_CUTLASS and "
                "AITER_MXFP4_BF16 proven, others refused; "
                "NVFP4 selection mirrored, FLASHINFER_TRTLLM, MARLIN, FLASHINFER_CUTLASS and FLASHINFER_CUTEDSL "
                "(ModelOpt) and MARLIN (compressed-tensors) proven, others refused"
            ),
        ),
    )
}


def unproven_layout_reason(row: RuntimeRevision, fmt: str, backend: str) -> str | None:
    """Why `row` does not write `backend` of weight format `fmt` (its `unproven_layouts`), or None.

    A key "fmt:BACKEND" names one format's backend (NVFP4's MARLIN is not MXFP4's proven MARLIN, yet
    both enums spell it "MARLIN"); a bare key names the value in every format, as vLLM's rows use it.
    """
    table = dict(row.unproven_layouts)
    return table.get(f"{fmt}:{backend}", table.get(backend))


def get_sglang_revision(name: str, fmt: str = "mxfp4") -> RuntimeRevision:
    """An SGLang row by name (`sglang-0.5.23`) that defines layouts for `fmt`.

    Raises:
        `InputError`: an unknown row (the message lists the known ones), or one without `fmt`.
    """
    key = name.strip().lower()
    row = SGLANG_REVISIONS.get(key)
    if row is None:
        raise InputError(f"unknown SGLang runtime revision {name!r}: known are {', '.join(sorted(SGLANG_REVISIONS))}")
    if fmt not in row.formats:
        raise InputError(f"SGLang runtime revision {row.name} defines no {fmt.upper()} backend choice yet")
    return row


def runtime_row(name: str, fmt: str = "mxfp4") -> RuntimeRevision:
    """Any runtime row by the name a manifest records (`target.runtime_revision`): an SGLang row
    (`sglang-0.5.23`) or a vLLM one (`get_revision`, which also knows its aliases)."""
    if name.strip().lower() in SGLANG_REVISIONS:
        return get_sglang_revision(name, fmt)
    return get_revision(name, fmt)


def sglang_row_for_release(release: str, fmt: str) -> RuntimeRevision | None:
    """The SGLang row that covers `release` for `fmt`, or None."""
    for row in SGLANG_REVISIONS.values():
        if release in row.releases.get(fmt, ()):
            return row
    return None


def sglang_coverage(fmt: str) -> str:
    """`0.5.23 (sglang-0.5.23)`: the SGLang releases covered for `fmt`, or "none"."""
    parts = [f"{release} ({row.name})" for row in SGLANG_REVISIONS.values() for release in row.releases.get(fmt, ())]
    return ", ".join(parts) or "none"


@dataclass(frozen=True)
class CompressedTensorsNvfp4:
    """What an SGLang row does with a compressed-tensors NVFP4 MoE checkpoint beyond what its ModelOpt
    bytes already hold (docs/sglang.md, "NVFP4"). SGLang 0.5.23 takes `CompressedTensorsW4A16Nvfp4MoE`
    below capability 10.0 (a W4A4 checkpoint served weight-only) and `CompressedTensorsW4A4Nvfp4MoE`
    from it; the W4A16 scheme's `process_weights_after_loading` renames the `_packed` weights, takes
    the reciprocal of gate's weight global scale (the canonical tensors' decode, formats/nvfp4/checkpoint.py)
    and runs the ModelOpt Marlin preparation, so its bytes are the row's NVFP4 Marlin layout; what
    differs is what it refuses, held here."""

    #: Backends whose compressed-tensors preparation is proven to be the row's layout, by value.
    written: frozenset[str]
    #: Why the others are not written.
    unwritten_reason: str
    #: The W4A16 scheme raises unless hidden_size is a multiple of this ...
    marlin_hidden_multiple: int
    #: ... and intermediate_size_per_partition (the TP shard) a multiple of this.
    marlin_shard_multiple: int
    #: The W4A16 scheme raises on an expert whose gate and up weight global scales differ (stored values,
    #: bit for bit), where ModelOpt's Marlin keeps gate's with a warning.
    marlin_shared_w13_global: bool


#: Per SGLang row name: its compressed-tensors NVFP4 handling (a row without an entry writes none).
#: sglang-0.5.23: MARLIN proven (tests/test_sglang_nvfp4_ct.py against SGLang's own
#: CompressedTensorsW4A16Nvfp4MoE, tools/golden/sglang_nvfp4.py); its W4A4 scheme's FLASHINFER_CUTLASS
#: (SM100+) proven (tests/test_sglang_nvfp4_ct_w4a4.py), its FLASHINFER_TRTLLM too
#: (tests/test_sglang_nvfp4_ct_w4a4_trtllm.py).
SGLANG_NVFP4_COMPRESSED_TENSORS: dict[str, CompressedTensorsNvfp4] = {
    "sglang-0.5.23": CompressedTensorsNvfp4(
        # CompressedTensorsW4A4Nvfp4MoE's CUTLASS branch (SM100+): the row's CUTLASS layout with the scheme's
        # own per-expert scalars of the stored input scales (layouts/cutlass.py sglang_ct_w4a4_cutlass;
        # tests/test_sglang_nvfp4_ct_w4a4.py, the nvfp4-ct-cutlass golden); its TRT-LLM branch
        # (flashinfer_trtllm): the row's TRT-LLM moves, unpadded, with one minimum of the stored input scales
        # over the local experts (layouts/trtllm.py sglang_ct_w4a4_trtllm; tests/test_sglang_nvfp4_ct_w4a4_trtllm.py)
        written=frozenset(
            {Nvfp4Backend.MARLIN.value, Nvfp4Backend.FLASHINFER_CUTLASS.value, Nvfp4Backend.FLASHINFER_TRTLLM.value}
        ),
        unwritten_reason=(
            "SGLang 0.5.23 serves a compressed-tensors NVFP4 MoE with CompressedTensorsW4A16Nvfp4MoE (MARLIN) or "
            "CompressedTensorsW4A4Nvfp4MoE (FLASHINFER_CUTLASS, FLASHINFER_TRTLLM) only; no other preparation is "
            "compared, so mxconvert does not write it"
        ),
        marlin_hidden_multiple=128,
        marlin_shard_multiple=64,
        marlin_shared_w13_global=True,
    ),
}


def compressed_tensors_nvfp4(row_name: str) -> CompressedTensorsNvfp4 | None:
    """The compressed-tensors NVFP4 handling of the row named `row_name` (`sglang-0.5.23`), or None where
    it writes no such checkpoint."""
    return SGLANG_NVFP4_COMPRESSED_TENSORS.get(row_name)
