"""How the SGLang loader names a live MXFP4 layer's backend (runtimes/sglang/checks.py `method_backend`), in
the order of SGLang 0.5.23's `Mxfp4MoEMethod.process_weights_after_loading` (layers/quantization/mxfp4.py):
Marlin, DeepGEMM / MegaMoE, the FlashInfer kernels, then the module-level `_use_aiter` (SGLANG_USE_AITER on
ROCm), then triton_kernels. Before, `_use_aiter` was not read, and an AITER layer was named SGLang's own
fallback, so the loader refused every AITER_MXFP4_BF16 artifact."""

from __future__ import annotations

from mxconvert.runtimes.sglang.checks import method_backend

OFF = dict(
    use_flashinfer=False,
    fi_kernel=None,
    use_marlin=False,
    use_deep_gemm=False,
    use_mega_moe=False,
    use_triton_kernels=False,
)


def test_an_aiter_process_names_the_layer_aiter_mxfp4_bf16():
    assert method_backend(**OFF, use_aiter=True) == "AITER_MXFP4_BF16"


def test_aiter_comes_before_triton_kernels_as_in_sglangs_post_processing():
    assert method_backend(**{**OFF, "use_triton_kernels": True}, use_aiter=True) == "AITER_MXFP4_BF16"
    assert method_backend(**{**OFF, "use_triton_kernels": True}) == "TRITON"


def test_marlin_and_flashinfer_come_before_aiter():
    assert method_backend(**{**OFF, "use_marlin": True}, use_aiter=True) == "MARLIN"
    assert method_backend(**{**OFF, "fi_kernel": "cutlass_sm90"}, use_aiter=True) == "FLASHINFER_CUTLASS_MXFP4_BF16"


def test_without_aiter_or_a_kernel_it_is_sglangs_fallback():
    assert method_backend(**OFF).startswith("SGLang's own fallback")
