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

from dataclasses import dataclass, field

from mxconvert.core.errors import InputError
from mxconvert.target.backends import CUTLASS_BACKENDS, MARLIN_BACKENDS, TRTLLM_BACKENDS, Backend
from mxconvert.target.backends import Mxfp4Backend as B


@dataclass(frozen=True)
class RoundUpRule:
    """One row of `mxfp4_round_up_hidden_size_and_intermediate_size`: first match wins.

    `backends=None` matches any backend; `platforms=None` any platform. `hidden_align=None`
    leaves the hidden size unchanged.
    """

    backends: frozenset[B] | None
    platforms: frozenset[str] | None
    intermediate_align: int
    hidden_align: int | None

    def matches(self, backend: Backend, platform: str) -> bool:
        return (self.backends is None or backend in self.backends) and (
            self.platforms is None or platform in self.platforms
        )


def _rule(backends, platforms, i_align: int, h_align: int | None) -> RoundUpRule:
    return RoundUpRule(
        frozenset(backends) if backends is not None else None,
        frozenset(platforms) if platforms is not None else None,
        i_align,
        h_align,
    )


_ANY = None

# vLLM 0.33.0 `mxfp4_round_up_hidden_size_and_intermediate_size` (GPT-OSS passes activation=None).
_ROUND_UP_0_33 = (
    _rule({B.EMULATION}, _ANY, 32, 32),
    _rule({B.CUTLASS_MXFP4_MXFP4}, _ANY, 128, 128),
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, _ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, _ANY, 128, 256),
    _rule(CUTLASS_BACKENDS, _ANY, 128, 128),
    _rule({B.AITER_MXFP4_MXFP4}, {"rocm"}, 128, 256),
    _rule(_ANY, {"rocm"}, 256, 256),
    _rule({B.CPU}, _ANY, 32, 32),
    _rule(_ANY, _ANY, 64, None),
)

_FI_0_6_14_SCALES = (
    "FlashInfer 0.6.14's block_scale_interleave (C++) changed before 0.7.2.post1 and its 128x4 output "
    "has not been shown equal to the goldens'"
)

# vLLM 0.26.0 `mxfp4_round_up_hidden_size_and_intermediate_size` (its DEEPGEMM_MXFP4 rule, 128/128,
# is left out: DEEPGEMM is no GPT-OSS backend). Differs from 0.33.0 in TRTLLM (I -> 256, not 128)
# and in having no CUTLASS_MXFP4_MXFP4 or AITER_MXFP4_MXFP4 rule.
_ROUND_UP_0_26 = (
    _rule({B.EMULATION}, _ANY, 32, 32),
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, _ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, _ANY, 256, 256),
    _rule(CUTLASS_BACKENDS, _ANY, 128, 128),
    _rule(_ANY, {"rocm"}, 256, 256),
    _rule({B.CPU}, _ANY, 32, 32),
    _rule(_ANY, _ANY, 64, None),
)

# vLLM 0.19-0.20 `mxfp4_round_up_hidden_size_and_intermediate_size`.
_ROUND_UP_0_20 = (
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, _ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, _ANY, 256, 256),
    _rule(CUTLASS_BACKENDS, _ANY, 128, 128),
    _rule(_ANY, {"rocm"}, 256, 256),
    _rule(_ANY, _ANY, 64, None),
)


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
    #: scale interleave) or "sm90-scale-interleave" (vLLM's older `_interleave_mxfp4_cutlass_sm90`).
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


REVISIONS: dict[str, RuntimeRevision] = {
    r.name: r
    for r in (
        RuntimeRevision(
            name="vllm-0.33",
            runtime="vllm",
            versions="0.33.0",
            formats=frozenset({"mxfp4", "nvfp4"}),
            triton_kernels="3.5.1",
            flashinfer="0.7.2.post1",
            selection="oracle-0.33",
            mxfp4_round_up=_ROUND_UP_0_33,
            sm90_triton_scale_pad4=True,
            cdna4_scale_max_tp=2,
            hopper_scale_overread=0,
            triton_sm12x_opt_flags=True,
            nvfp4_fold_global_scales=True,
            nvfp4_fi_padding=(256, 64),
            nvfp4_cutedsl_prepare="interleaved",
            nvfp4_marlin_scales="rescaled",
            # vLLM 0.33.0 vllm/config/parallel.py `All2AllBackend`
            all2all_backends=(
                "naive",
                "pplx",
                "deepep_high_throughput",
                "deepep_low_latency",
                "deepep_v2",
                "mori_high_throughput",
                "mori_low_latency",
                "moonep",
                "nixl_ep",
                "allgather_reducescatter",
                "flashinfer_all2allv",
                "flashinfer_nvlink_two_sided",
                "flashinfer_nvlink_one_sided",
                "passthrough",
            ),
            # 0.33.0 only. 0.32.0 is left out although FlashInfer 0.7.0.post1 (its pin) and
            # 0.7.2.post1 hold the same code for every function the layouts mirror: the Python of
            # shuffle_matrix_a / shuffle_matrix_sf_a, _maybe_get_cached_w3_w1_permute_indices,
            # get_w2_permute_indices_with_cache, reorder_rows_for_gated_act_gemm,
            # get_shuffle_matrix_{a,sf_a}_row_indices, convert_sf_to_mma_layout and
            # interleave_moe_{weights,scales}_for_sm90_mixed_gemm is AST-identical,
            # block_scale_interleave differs only by the new `out=` argument vLLM does not pass, and
            # the C++ behind them (thop/fp4Op.cpp, quantization_utils.cuh, the
            # block_scale_interleave kernel of cpp/kernels/quantization.cu, moe_gemm_mixed_utils.cu
            # and the interleave binding) is unchanged. vLLM's own code differs, though: for MXFP4,
            # 0.33.0 adds TrtLlmMxfp4LoRAExperts to an explicit flashinfer_trtllm request with LoRA
            # (`_requested_kernel_cls`), the gfx1250 scale swizzle in `_swizzle_mxfp4` and
            # AITER_TRITON_MXFP4_MXFP4; for NVFP4 its TRTLLM monolithic class drops the Simulated
            # routing method. So 0.32.0's selection is not the same as this row's.
            releases={"mxfp4": ("0.33.0",), "nvfp4": ("0.33.0",)},
        ),
        RuntimeRevision(
            name="vllm-0.26",
            runtime="vllm",
            versions="0.26.0",
            formats=frozenset({"mxfp4"}),
            # vLLM 0.26.0 vendors the triton_kernels 3.5.1 files of 0.33.0 (same digest in
            # tools/vllm_releases/records/) and pins flashinfer-python==0.6.14.
            triton_kernels="3.5.1",
            flashinfer="0.6.14",
            selection="oracle-0.26",
            mxfp4_round_up=_ROUND_UP_0_26,
            # 0.26.0 `_swizzle_mxfp4` pads the SM90 scale groups to a multiple of 4 (the change
            # arrived in 0.26.0) and gates the CDNA4 swizzle by `should_use_cdna4_mx_scale_swizzle`
            # (gfx950 and TP <= 2, from 0.24.0).
            sm90_triton_scale_pad4=True,
            cdna4_scale_max_tp=2,
            hopper_scale_overread=0,
            # 0.26.0 calls FlashInfer's `interleave_moe_{weights,scales}_for_sm90_mixed_gemm`, but
            # its pin 0.6.14 folds the scales as vLLM 0.20's `_interleave_mxfp4_cutlass_sm90` did
            # (AST-equal), not as 0.7.x, and its CUDA weight interleave has no recorded bytes: no
            # layout value describes both, and the backend is refused below (`unproven_layouts`).
            cutlass_sm90_layout="sm90-scale-interleave",
            # What has no reference bytes at 0.26.0 yet (docs/releases.md, "vllm-0.26"): FlashInfer
            # 0.6.14's block-scale interleave (C++, changed before 0.7.2.post1) behind TRTLLM and
            # CUTLASS MXFP8, and its SM90 weight interleave (a CUDA kernel) behind CUTLASS BF16.
            unproven_layouts=(
                (B.FLASHINFER_TRTLLM_MXFP4_BF16.value, _FI_0_6_14_SCALES),
                (B.FLASHINFER_TRTLLM_MXFP4_MXFP8.value, _FI_0_6_14_SCALES),
                (B.FLASHINFER_CUTLASS_MXFP4_MXFP8.value, _FI_0_6_14_SCALES),
                (
                    B.FLASHINFER_CUTLASS_MXFP4_BF16.value,
                    "FlashInfer 0.6.14's interleave_moe_weights_for_sm90_mixed_gemm (a CUDA kernel) has not "
                    "been recorded on a GPU",
                ),
            ),
            # 0.26.0 `_swizzle_mxfp4` gives SM10x opt flags to family 10 only (and its TRITON
            # classes refuse SM12x).
            triton_sm12x_opt_flags=False,
            # vLLM 0.26.0 vllm/config/parallel.py `All2AllBackend`
            all2all_backends=(
                "naive",
                "pplx",
                "deepep_high_throughput",
                "deepep_low_latency",
                "deepep_v2",
                "mori_high_throughput",
                "mori_low_latency",
                "nixl_ep",
                "allgather_reducescatter",
                "flashinfer_all2allv",
                "flashinfer_nvlink_two_sided",
                "flashinfer_nvlink_one_sided",
            ),
            # Reference: vLLM 0.26.0. Selection: tests/golden/selection/vllm-0.26.0-mxfp4.json,
            # made by running 0.26.0's own oracle (tools/vllm_releases/record_selection.py).
            # Bytes: docs/releases.md, "vllm-0.26". 0.25.x and 0.27.x are other groups in
            # tools/vllm_releases/groups.json (0.25: no SM90 scale pad, FlashInfer 0.6.13; 0.27:
            # TRTLLM rounds I to 128, FlashInfer 0.6.16.post3).
            releases={"mxfp4": ()},
        ),
        RuntimeRevision(
            name="vllm-0.20",
            runtime="vllm",
            versions="0.20.0-0.20.2",
            formats=frozenset({"mxfp4"}),
            triton_kernels="3.6.0",
            flashinfer="0.6.8.post1",
            selection="env-0.20",
            mxfp4_round_up=_ROUND_UP_0_20,
            sm90_triton_scale_pad4=False,
            cdna4_scale_max_tp=None,
            hopper_scale_overread=64,
            cutlass_sm90_layout="sm90-scale-interleave",
            triton_sm12x_opt_flags=False,
            # vLLM 0.20.0 vllm/config/parallel.py `All2AllBackend` (0.19.0 has the same list)
            all2all_backends=(
                "naive",
                "pplx",
                "deepep_high_throughput",
                "deepep_low_latency",
                "mori",
                "nixl_ep",
                "allgather_reducescatter",
                "flashinfer_all2allv",
                "flashinfer_nvlink_two_sided",
                "flashinfer_nvlink_one_sided",
            ),
            # Reference: vLLM 0.20.0 (tools/golden). 0.20.1 and 0.20.2 change no selection or
            # weight-preparation code of GPT-OSS MXFP4 (0.20.1 moves the TRTLLM-MXFP8 activation
            # quantisation into the quant config: runtime only) and pin the same FlashInfer
            # (0.6.8.post1). 0.19.x is not covered: its auto list still holds TRITON_UNFUSED, its
            # ROCm backend is CK, its Marlin scheme check differs and it pins FlashInfer 0.6.6.
            releases={"mxfp4": ("0.20.0", "0.20.1", "0.20.2")},
        ),
        RuntimeRevision(
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
            # vLLM 0.15.0 vllm/config/parallel.py `All2AllBackend`
            all2all_backends=(
                "naive",
                "pplx",
                "deepep_high_throughput",
                "deepep_low_latency",
                "mori",
                "allgather_reducescatter",
                "flashinfer_all2allv",
            ),
            # Selection: the 0.15.0 wheel's own oracle, as recorded in
            # tests/golden/selection/vllm-0.15.0-nvfp4.json (selection/vllm/nvfp4_0_15.py says what
            # changed from the pre-release tree this row mirrored before; 0.15.0 also selects
            # VLLM_CUTLASS, on capability >= 10.0 without FlashInfer). No release yet: the weight
            # preparation of 0.15.0 is not compared with the row's goldens (docs/releases.md).
            releases={"nvfp4": ()},
        ),
    )
}

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
    aliases = {
        "vllm-0.33.0": "vllm-0.33",
        "vllm-0.26.0": "vllm-0.26",
        "vllm-0.20.0": "vllm-0.20",
        "vllm-0.15.0": "vllm-0.15",
    }
    key = aliases.get(key, key)
    if key not in REVISIONS:
        raise InputError(f"unknown runtime revision {name!r}: known revisions are {', '.join(sorted(REVISIONS))}")
    revision = REVISIONS[key]
    if fmt not in revision.formats:
        able = sorted(r.name for r in REVISIONS.values() if fmt in r.formats)
        raise InputError(
            f"runtime revision {revision.name} defines no {fmt.upper()} layouts; revisions that do: {', '.join(able)}"
        )
    return revision
