"""Runtime revisions: the layout a runtime expects changes between its releases.

Every difference between the supported runtime revisions is a field of `RuntimeRevision`, and the
known revisions are rows of `REVISIONS`. Code asks the revision ("which triton_kernels generation?",
"how much does TRTLLM round the intermediate size?") instead of branching on version strings.
The chosen revision is recorded in every manifest and is part of the fingerprint.

Each row also names the vLLM releases it covers per format (`releases`): only releases whose
backend selection and weight preparation were shown identical to the row's reference release.
`--runtime vllm==X.Y.Z` is resolved against these lists (mxconvert/target/releases.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mxconvert.core.errors import InputError
from mxconvert.target.backends import Backend
from mxconvert.target.round_up import ROUND_UP_0_20, ROUND_UP_0_22, ROUND_UP_0_26, ROUND_UP_0_33, RoundUpRule

__all__ = ["DEFAULT_REVISION", "REVISIONS", "RoundUpRule", "RuntimeRevision", "check_all2all", "get_revision"]


@dataclass(frozen=True)
class RuntimeRevision:
    """Everything about one runtime release that changes the bytes or the backend choice."""

    name: str
    runtime: str
    versions: str
    formats: frozenset[str]
    #: triton_kernels generation vendored by this runtime ("3.5.1" or "3.6.0").
    triton_kernels: str
    #: FlashInfer release pinned by this runtime (its permute indices / 128x4 swizzle).
    flashinfer: str
    #: Selection style: "oracle-0.33" (priority + kernel predicates, --moe-backend names) or
    #: "env-0.20" (the same priority list, plus VLLM_USE_FLASHINFER_MOE_MXFP4_* style overrides).
    selection: str
    mxfp4_round_up: tuple[RoundUpRule, ...] = field(default=(), repr=False)
    #: SM90 Triton path pads the scale groups to a multiple of 4 (vLLM 0.33 patch #47303).
    sm90_triton_scale_pad4: bool = False
    #: Largest TP size at which gfx950 uses the CDNA4 scale swizzle (None: every TP size).
    cdna4_scale_max_tp: int | None = None
    #: Bytes a kernel may read past the end of the SM90 Hopper-scale buffer (0 if padded).
    hopper_scale_overread: int = 0
    #: FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) layout: "sm90-mixed-gemm" (FlashInfer 0.7 weight +
    #: scale interleave), "sm90-scale-interleave" (vLLM's older `_interleave_mxfp4_cutlass_sm90`) or
    #: "sm90-interleave-0.6" (FlashInfer 0.6.11.post2-0.6.16.post3: their fp4 weight interleave plus
    #: that scale fold). docs/layouts.md, "CUTLASS".
    cutlass_sm90_layout: str = "sm90-mixed-gemm"
    #: TRITON on the SM12x family takes SM10x's opt flags (`is_persistent`, `epilogue_subtile=1`).
    triton_sm12x_opt_flags: bool = False
    #: NVFP4: the experts fold the activation scales into the weight global scales in place
    #: (`w13_weight_scale_2 *= a13`, TRTLLM's `g1_scale_c = g1_alphas * (1/a2)`). False: the layer
    #: keeps the checkpoint's global scales and the kernels read `g*_alphas = a * w` (and TRTLLM
    #: `g1_scale_c = a13 * w13_scale_2 / a2`). See docs/layouts.md, "NVFP4 scales".
    nvfp4_fold_global_scales: bool = True
    #: NVFP4 FLASHINFER_TRTLLM and FLASHINFER_CUTEDSL pad (hidden K, intermediate N) up to these
    #: multiples; None: nothing is padded and shapes whose rows are not a multiple of 128 are refused.
    nvfp4_fi_padding: tuple[int, int] | None = (256, 64)
    #: NVFP4 FLASHINFER_CUTEDSL: "interleaved" (its own preparation: [w3; w1] in 64-row blocks) or
    #: "fi-or-cutlass" (the masked kernel, prepared like FLASHINFER_CUTLASS without the reorder; the
    #: bytes 0.33 calls FLASHINFER_CUTEDSL_BATCHED).
    nvfp4_cutedsl_prepare: str = "interleaved"
    #: NVFP4 MARLIN: "rescaled" (N padded to 64/128, a power-of-two scale factor, subnormal block
    #: scales zeroed, fp32 global scales) or "plain" (no padding or factor, subnormals kept, global
    #: scales `bf16(w) * 2^119` in bfloat16).
    nvfp4_marlin_scales: str = "rescaled"
    #: MXFP4: the byte the runtime's scale parameters hold where they are padded past the checkpoint's
    #: (the canonical tensors' scale padding, formats/mxfp4/canonical.py). vLLM creates them with
    #: zeros; SGLang with 0x7F, E8M0 1.0 (target/sglang_revisions.py).
    mxfp4_scale_pad_fill: int = 0
    #: MXFP4 MARLIN: the w13 row order the runtime repacks. "interleaved" (vLLM: GPT-OSS's g0,u0,g1,u1,...
    #: kept) or "halves" (SGLang 0.5.23's `deinterleave_moe_mxfp4_w13_for_marlin` first makes them
    #: [gate; up], weights, scales and bias alike; layouts/marlin.py, docs/sglang.md "MARLIN").
    mxfp4_marlin_w13_rows: str = "interleaved"
    #: MXFP4 FLASHINFER_CUTLASS (both): "canonical" (vLLM: the round-up rule's sizes, padded before the
    #: moves) or "after-load-128" (SGLang 0.5.23's `_process_weights_for_sm{90,120}_cutlass` pad after
    #: loading: each [up; gate] half of w13 and w2's intermediate columns to a multiple of 128 with zeros,
    #: scales included; layouts/cutlass.py `sglang_cutlass_tensors`, docs/sglang.md "FLASHINFER_CUTLASS").
    mxfp4_cutlass_pad: str = "canonical"
    #: Backends whose bytes under this row are not proven yet, each with the reason: selection may
    #: pick them (and reports them), but `convert` refuses to lay them out (layouts/registry.py), so
    #: no artifact holds bytes no reference produced. Empty for every row whose layouts all have
    #: goldens from the row's reference release.
    unproven_layouts: tuple[tuple[str, str], ...] = ()
    #: vLLM's `All2AllBackend` names in this release (vllm/config/parallel.py); vLLM refuses any
    #: other `--all2all-backend` at start-up, so `--all2all` is checked against this row's list.
    all2all_backends: tuple[str, ...] = ()
    #: Format -> the vLLM releases this row covers for it, oldest first except that the first is
    #: the reference release (the one the mirrors, layouts and goldens come from). A release is
    #: listed only where its selection and weight preparation for that format were shown identical
    #: to the reference release's (the evidence is the comment at each row). Outside the hash: a
    #: dict is not hashable, and two rows never differ by their coverage alone.
    releases: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    notes: str = ""

    def round_up(self, backend: Backend, platform: str, hidden: int, intermediate: int) -> tuple[int, int]:
        """(Hp, Ip): the padded hidden and per-partition intermediate sizes for `backend`."""
        for rule in self.mxfp4_round_up:
            if rule.matches(backend, platform):
                ip = _ru(intermediate, rule.intermediate_align)
                hp = hidden if rule.hidden_align is None else _ru(hidden, rule.hidden_align)
                return hp, ip
        raise AssertionError("the last round-up rule matches everything")  # pragma: no cover

    def describe(self) -> dict:
        return {
            "name": self.name,
            "runtime": self.runtime,
            "versions": self.versions,
            "triton_kernels": self.triton_kernels,
            "flashinfer": self.flashinfer,
        }


def _ru(value: int, align: int) -> int:
    return -(-value // align) * align


# vLLM `All2AllBackend` (vllm/config/parallel.py) of each release where the list changed. A row that
# covers several releases takes the names every one of them accepts (vLLM refuses the others).
_A2A_0_15 = (
    "naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "mori", "allgather_reducescatter",
    "flashinfer_all2allv",
)  # fmt: skip
_A2A_0_18 = (
    "naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "mori", "nixl_ep", "allgather_reducescatter",
    "flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided",
)  # fmt: skip
_A2A_0_24 = (
    "naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "deepep_v2", "mori_high_throughput",
    "mori_low_latency", "nixl_ep", "allgather_reducescatter", "flashinfer_all2allv", "flashinfer_nvlink_two_sided",
    "flashinfer_nvlink_one_sided",
)  # fmt: skip
_A2A_0_23 = tuple(name for name in _A2A_0_24 if name != "deepep_v2")  # mori split, no deepep_v2 yet
_A2A_0_31 = (*_A2A_0_24[:7], "moonep", *_A2A_0_24[7:])
_A2A_0_32 = (*_A2A_0_31, "passthrough")

# The reference rows: each one release's mirrors, layouts and goldens (tools/golden).
_V033 = RuntimeRevision(
    name="vllm-0.33",
    runtime="vllm",
    versions="0.33.0",
    formats=frozenset({"mxfp4", "nvfp4"}),
    triton_kernels="3.5.1",
    flashinfer="0.7.2.post1",
    selection="oracle-0.33",
    mxfp4_round_up=ROUND_UP_0_33,
    sm90_triton_scale_pad4=True,
    cdna4_scale_max_tp=2,
    hopper_scale_overread=0,
    triton_sm12x_opt_flags=True,
    nvfp4_fold_global_scales=True,
    nvfp4_fi_padding=(256, 64),
    nvfp4_cutedsl_prepare="interleaved",
    nvfp4_marlin_scales="rescaled",
    all2all_backends=_A2A_0_32,  # 0.33.0's list is 0.32.0's
    # MXFP4: 0.33.0 only (0.32.0 adds no TrtLlmMxfp4LoRAExperts, gfx1250 swizzle or AITER_TRITON
    # MXFP4 backend: its selection record differs, row vllm-0.32). NVFP4: 0.32.0's selection record
    # (tests/golden/selection/vllm-0.32.0-nvfp4.json) and tensor record are this row's, entry for entry.
    releases={"mxfp4": ("0.33.0",), "nvfp4": ("0.33.0", "0.32.0")},
)
_V026 = RuntimeRevision(
    name="vllm-0.26",
    runtime="vllm",
    versions="0.26.0",
    formats=frozenset({"mxfp4"}),
    # vLLM 0.26.0 vendors the triton_kernels 3.5.1 files of 0.33.0 (same digest in
    # tools/vllm_releases/records/) and pins flashinfer-python==0.6.14.
    triton_kernels="3.5.1",
    flashinfer="0.6.14",
    selection="oracle-0.26",
    mxfp4_round_up=ROUND_UP_0_26,
    # 0.26.0 `_swizzle_mxfp4` pads the SM90 scale groups to a multiple of 4 (the change arrived in
    # 0.26.0) and gates the CDNA4 swizzle by `should_use_cdna4_mx_scale_swizzle` (gfx950, TP <= 2).
    sm90_triton_scale_pad4=True,
    cdna4_scale_max_tp=2,
    hopper_scale_overread=0,
    # 0.26.0 calls FlashInfer's `interleave_moe_{weights,scales}_for_sm90_mixed_gemm`; its pin 0.6.14
    # folds the scales as vLLM 0.20's `_interleave_mxfp4_cutlass_sm90` did (AST-equal), not as 0.7.x,
    # and interleaves the fp4 weights with the 0.6.11.post2-0.6.16.post3 CUDA kernel (docs/layouts.md,
    # "CUTLASS", C2c). The tensor record of 0.26.0 (its own converter, FlashInfer 0.6.14's kernels
    # transcribed and GPU-checked) equals this row's TRTLLM BF16/MXFP8 and CUTLASS BF16/MXFP8 bytes,
    # TRTLLM padding I to 256 as ROUND_UP_0_26 does (docs/releases.md, "Tensor records").
    cutlass_sm90_layout="sm90-interleave-0.6",
    # 0.26.0 `_swizzle_mxfp4` gives SM10x opt flags to family 10 only (its TRITON classes refuse SM12x).
    triton_sm12x_opt_flags=False,
    all2all_backends=_A2A_0_24,
    releases={"mxfp4": ("0.26.0",)},
)
_V020 = RuntimeRevision(
    name="vllm-0.20",
    runtime="vllm",
    versions="0.20.0-0.20.2",
    formats=frozenset({"mxfp4"}),
    triton_kernels="3.6.0",
    flashinfer="0.6.8.post1",
    selection="env-0.20",
    mxfp4_round_up=ROUND_UP_0_20,
    sm90_triton_scale_pad4=False,
    cdna4_scale_max_tp=None,
    hopper_scale_overread=64,
    cutlass_sm90_layout="sm90-scale-interleave",
    triton_sm12x_opt_flags=False,
    all2all_backends=_A2A_0_18,
    # Reference: vLLM 0.20.0 (tools/golden); 0.20.1 and 0.20.2: same selection and tensor records.
    releases={"mxfp4": ("0.20.0", "0.20.1", "0.20.2")},
)
_V015 = RuntimeRevision(
    # vLLM ~0.15 (oracle/nvfp4.py between 0.14.1 and 0.15.0): see docs/layouts.md.
    name="vllm-0.15",
    runtime="vllm",
    versions="~0.15.0",
    formats=frozenset({"nvfp4"}),
    triton_kernels="n/a",
    flashinfer="n/a",
    selection="env-0.15",
    nvfp4_fold_global_scales=False,
    nvfp4_fi_padding=None,
    nvfp4_cutedsl_prepare="fi-or-cutlass",
    nvfp4_marlin_scales="plain",
    all2all_backends=_A2A_0_15,
    # 0.15.0: its selection record (its own oracle, run) and its tensor record (its own weight
    # processing, every NVFP4 backend) are this row's (selection/vllm/nvfp4_0_15.py says what changed
    # from the pre-release tree the row mirrored before).
    releases={"nvfp4": ("0.15.0",)},
)


def _nvfp4_unproven(releases: str, *backends: str) -> tuple[tuple[str, str], ...]:
    """NVFP4 backends whose bytes under the row differ from what vLLM `releases` lay out."""
    return tuple(
        (b, f"vLLM {releases} lays it out otherwise (tests/golden/tensors/expected_rows.json)") for b in backends
    )


def _copy(base: RuntimeRevision, name: str, versions: str, selection: str, **changes) -> RuntimeRevision:
    """A row for releases whose bytes are `base`'s (their tensor records say so) and whose selection
    is `selection` (their selection records say so): data, no code of its own."""
    return replace(base, name=name, versions=versions, selection=selection, **changes)


#: Rows by name. A release joins a row only where the row reproduces both of its records
#: (tests/golden/selection/ and tests/golden/tensors/, held by tests/test_selection_records.py and
#: tests/test_tensor_records.py); a backend whose bytes differ is in the row's `unproven_layouts`.
REVISIONS: dict[str, RuntimeRevision] = {
    r.name: r
    for r in (
        _V033,
        # MXFP4 0.32.0 / 0.31.0 / 0.30.0: vllm-0.33 bytes for every backend, each its own selection.
        # 0.32 gives TRITON the SM12x opt flags as 0.33 does; 0.31 and 0.30 give them to family 10 only.
        _copy(_V033, "vllm-0.32", "0.32.0", "oracle-0.32", formats=frozenset({"mxfp4"}), flashinfer="0.7.0.post1",
              releases={"mxfp4": ("0.32.0",)}),
        _copy(_V033, "vllm-0.31", "0.31.0", "oracle-0.31", formats=frozenset({"mxfp4"}), flashinfer="0.7.0.post1",
              triton_sm12x_opt_flags=False, all2all_backends=_A2A_0_31, releases={"mxfp4": ("0.31.0",)}),
        _copy(_V033, "vllm-0.30", "0.30.0", "oracle-0.30", formats=frozenset({"mxfp4"}), flashinfer="0.6.18.post1",
              triton_sm12x_opt_flags=False, all2all_backends=_A2A_0_24, releases={"mxfp4": ("0.30.0",)}),
        # MXFP4 0.29.0 and NVFP4 0.29.0-0.31.0 (the "oracle-0.29" style of both formats): vllm-0.33
        # bytes but NVFP4 FLASHINFER_CUTEDSL. The FlashInfer pin is 0.29.0's (0.30.0: 0.6.18.post1,
        # 0.31.0: 0.7.0.post1; no NVFP4 layout records it). `all2all_backends`: 0.29.0's, which
        # 0.30.0 and 0.31.0 only extend.
        _copy(_V033, "vllm-0.29", "0.29.0", "oracle-0.29", flashinfer="0.6.18", triton_sm12x_opt_flags=False,
              all2all_backends=_A2A_0_24,
              unproven_layouts=_nvfp4_unproven("0.29.0-0.31.0", "FLASHINFER_CUTEDSL"),
              releases={"mxfp4": ("0.29.0",), "nvfp4": ("0.29.0", "0.30.0", "0.31.0")}),
        # MXFP4 and NVFP4 0.27.0-0.28.0 ("oracle-0.27"): vllm-0.33 bytes (ROUND_UP_0_33 gives their
        # rounding for every backend mxconvert writes) but MXFP4 CUTLASS BF16 (FlashInfer 0.6.16.post3's
        # SM90 interleave, "sm90-interleave-0.6") and NVFP4 TRTLLM, CUTEDSL.
        _copy(_V033, "vllm-0.27", "0.27.0-0.28.0", "oracle-0.27", flashinfer="0.6.16.post3",
              triton_sm12x_opt_flags=False, cutlass_sm90_layout="sm90-interleave-0.6", all2all_backends=_A2A_0_24,
              unproven_layouts=_nvfp4_unproven("0.27.0-0.28.0", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"),
              releases={"mxfp4": ("0.27.0", "0.27.1", "0.28.0"), "nvfp4": ("0.27.0", "0.27.1", "0.28.0")}),
        _V026,
        # MXFP4 0.22.0-0.25.1: the triton_kernels 3.5.1 of 0.26.0 without its SM90 scale pad (0.26.0
        # added it; `hopper_scale_overread` then is vllm-0.20's), ROUND_UP_0_22;
        # the CDNA4 scale swizzle is gated by TP <= 2 from 0.24.0. Bytes: tests/golden/tensors/.
        _copy(_V026, "vllm-0.25", "0.25.0-0.25.1", "oracle-0.26", flashinfer="0.6.13", sm90_triton_scale_pad4=False,
              hopper_scale_overread=64, mxfp4_round_up=ROUND_UP_0_22,
              releases={"mxfp4": ("0.25.0", "0.25.1")}),
        # MXFP4 0.24.0 and NVFP4 0.24.0 ("oracle-0.24" in both formats; NVFP4: vllm-0.33 bytes but
        # TRTLLM and CUTEDSL).
        _copy(_V026, "vllm-0.24", "0.24.0", "oracle-0.24", formats=frozenset({"mxfp4", "nvfp4"}), flashinfer="0.6.12",
              sm90_triton_scale_pad4=False, hopper_scale_overread=64, mxfp4_round_up=ROUND_UP_0_22,
              unproven_layouts=_nvfp4_unproven("0.24.0", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"),
              releases={"mxfp4": ("0.24.0",), "nvfp4": ("0.24.0",)}),
        _copy(_V026, "vllm-0.23", "0.23.0", "oracle-0.23", flashinfer="0.6.12", sm90_triton_scale_pad4=False,
              hopper_scale_overread=64, cdna4_scale_max_tp=None, mxfp4_round_up=ROUND_UP_0_22,
              all2all_backends=_A2A_0_23,
              releases={"mxfp4": ("0.23.0",)}),
        _copy(_V026, "vllm-0.22", "0.22.0-0.22.1", "oracle-0.22", flashinfer="0.6.11.post2",
              sm90_triton_scale_pad4=False, hopper_scale_overread=64, cdna4_scale_max_tp=None,
              mxfp4_round_up=ROUND_UP_0_22, all2all_backends=_A2A_0_18,
              releases={"mxfp4": ("0.22.0", "0.22.1")}),
        # MXFP4 0.21.0: vllm-0.20 bytes for every backend (its round-up differs only by a DEEPGEMM
        # rule) with its own oracle (selection reads only the style).
        _copy(_V020, "vllm-0.21", "0.21.0", "oracle-0.21", releases={"mxfp4": ("0.21.0",)}),
        _V020,
        # MXFP4 0.19.x: vllm-0.20 bytes for every backend, env-0.19 selection, FlashInfer 0.6.6.
        _copy(_V020, "vllm-0.19", "0.19.0-0.19.1", "env-0.19", flashinfer="0.6.6",
              releases={"mxfp4": ("0.19.0", "0.19.1")}),
        # NVFP4 0.20.0-0.26.0: vllm-0.33 bytes but TRTLLM (the release refuses a shape mxconvert writes, or
        # lays it out otherwise), CUTEDSL and, up to 0.23.0, MARLIN. NVFP4 only: a row's
        # `unproven_layouts` names backends by value, and MXFP4 has a MARLIN too.
        _copy(_V033, "vllm-0.25-nvfp4", "0.25.0-0.26.0", "oracle-0.25", formats=frozenset({"nvfp4"}),
              flashinfer="0.6.13", all2all_backends=_A2A_0_24,
              unproven_layouts=_nvfp4_unproven("0.25.0-0.26.0", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL"),
              releases={"nvfp4": ("0.25.0", "0.25.1", "0.26.0")}),
        _copy(_V033, "vllm-0.22-nvfp4", "0.22.0-0.23.0", "oracle-0.22", formats=frozenset({"nvfp4"}),
              flashinfer="0.6.11.post2", all2all_backends=tuple(n for n in _A2A_0_18 if n in _A2A_0_23),
              unproven_layouts=_nvfp4_unproven("0.22.0-0.23.0", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "MARLIN"),
              releases={"nvfp4": ("0.22.0", "0.22.1", "0.23.0")}),
        _copy(_V033, "vllm-0.21-nvfp4", "0.21.0", "oracle-0.21", formats=frozenset({"nvfp4"}),
              flashinfer="0.6.8.post1", all2all_backends=_A2A_0_18,
              unproven_layouts=_nvfp4_unproven("0.21.0", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "MARLIN"),
              releases={"nvfp4": ("0.21.0",)}),
        _copy(_V033, "vllm-0.20-nvfp4", "0.20.0-0.20.2", "oracle-0.20", formats=frozenset({"nvfp4"}),
              flashinfer="0.6.8.post1", all2all_backends=_A2A_0_18,
              unproven_layouts=_nvfp4_unproven("0.20.0-0.20.2", "FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "MARLIN"),
              releases={"nvfp4": ("0.20.0", "0.20.1", "0.20.2")}),
        # NVFP4 0.18.x and 0.19.x: vllm-0.15 bytes with the global-scale fold (0.18.0 moved it into the
        # experts), every backend for 0.18.x, all but MARLIN for 0.19.x.
        _copy(_V015, "vllm-0.19-nvfp4", "0.19.0-0.19.1", "env-0.19", nvfp4_fold_global_scales=True,
              all2all_backends=_A2A_0_18, unproven_layouts=_nvfp4_unproven("0.19.0-0.19.1", "MARLIN"),
              releases={"nvfp4": ("0.19.0", "0.19.1")}),
        _copy(_V015, "vllm-0.18", "0.18.0-0.18.1", "env-0.18", nvfp4_fold_global_scales=True,
              all2all_backends=_A2A_0_18, releases={"nvfp4": ("0.18.0", "0.18.1")}),
        # NVFP4 0.15.1 / 0.16.0 / 0.17.x: vllm-0.15 bytes for every backend, each its env style.
        _copy(_V015, "vllm-0.17", "0.17.0-0.17.1", "env-0.17", releases={"nvfp4": ("0.17.0", "0.17.1")}),
        _copy(_V015, "vllm-0.16", "0.16.0", "env-0.16", releases={"nvfp4": ("0.16.0",)}),
        _copy(_V015, "vllm-0.15.1", "0.15.1", "env-0.15.1", releases={"nvfp4": ("0.15.1",)}),
        _V015,
    )
}  # fmt: skip

DEFAULT_REVISION = "vllm-0.33"


def check_all2all(name: str | None, revision: RuntimeRevision) -> str | None:
    """`--all2all` normalised (lower case, `-` as `_`), or refused when vLLM of `revision` has no
    such backend (the accepted names are the revision row's `all2all_backends`)."""
    if name is None:
        return None
    key = name.strip().lower().replace("-", "_")
    if key not in revision.all2all_backends:
        raise InputError(
            f"--all2all {name!r}: not an all2all backend of vLLM {revision.versions} (runtime revision "
            f"{revision.name}); valid: {', '.join(revision.all2all_backends)}"
        )
    return key


def get_revision(name: str | None, fmt: str = "mxfp4") -> RuntimeRevision:
    """Look a revision up by name (`vllm-0.33`, `0.33`, `vllm-0.33.0` ...) and check it knows `fmt`.

    Args:
        name (`str`, *optional*):
            The revision's name or an alias (`"vllm-0.33"`, `"0.33"`, `"vllm-0.20.0"`); None is the
            default revision (`vllm-0.33`).
        fmt (`str`, *optional*, defaults to `"mxfp4"`):
            The weight format the revision must define layouts for (`"mxfp4"` or `"nvfp4"`).

    Returns:
        `RuntimeRevision`: the release's row (runtime, versions, triton_kernels and FlashInfer
        releases, selection style, and every field that changes the bytes or the backend choice).

    Raises:
        `InputError`: an unknown revision (the message lists the known ones), or one that defines
            no layouts for `fmt` (the message lists those that do).

    Example:

    ```python
    import mxconvert

    revision = mxconvert.get_revision("vllm-0.20")
    print(revision.versions, revision.triton_kernels)
    ```
    """
    key = (name or DEFAULT_REVISION).strip().lower()
    if not key.startswith("vllm-"):
        key = "vllm-" + key
    # `vllm-X.Y.0` names the row `vllm-X.Y` (the aliases `vllm-0.33.0`, `vllm-0.20.0` ... always did)
    if key.endswith(".0") and key not in REVISIONS and key[: -len(".0")] in REVISIONS:
        key = key[: -len(".0")]
    if key not in REVISIONS:
        raise InputError(f"unknown runtime revision {name!r}: known revisions are {', '.join(sorted(REVISIONS))}")
    revision = REVISIONS[key]
    if fmt not in revision.formats:
        able = sorted(r.name for r in REVISIONS.values() if fmt in r.formats)
        raise InputError(
            f"runtime revision {revision.name} defines no {fmt.upper()} layouts; revisions that do: {', '.join(able)}"
        )
    return revision
