// Minimal tvm-ffi entry point for the golden-data generator (tools/golden/), NOT part of mxconvert.
//
// It calls FlashInfer's own kernel launcher
//   tensorrt_llm::kernels::cutlass_kernels::interleave_fp4_weights_for_sm90_mixed_gemm
// from flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/
// moe_gemm_mixed_utils.cu, which is compiled UNMODIFIED from the flashinfer-python 0.7.2.post1 wheel
// next to this file (see tools/golden/device_flashinfer.py). The body mirrors what flashinfer's
// own binding `interleave_moe_weights_for_sm90_mixed_gemm(weight, out, quant_type=1)` in
// fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu does: the same shape checks,
// then one launch per expert on the current stream with rows = n and cols = k = 2 * (k/2 bytes).
//
// Why not the Python API itself: flashinfer.fused_moe.prepare.interleave_moe_weights_for_sm90_mixed_gemm
// loads the whole `fused_moe_90` JIT module (the full CUTLASS fused-MoE runner: 220 generated
// CUTLASS instantiation files plus ~25 others), which cannot be built within one 10-minute device call.
#include "tvm_ffi_utils.h"
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.h"

void interleave_fp4_moe_weights(TensorView weight, TensorView weight_interleaved) {
  CHECK_INPUT_TYPE(weight, dl_uint8);
  CHECK_INPUT_TYPE(weight_interleaved, dl_uint8);
  CHECK_CONTIGUOUS(weight);
  CHECK_CONTIGUOUS(weight_interleaved);
  CHECK_DIM(3, weight);
  CHECK_DIM(3, weight_interleaved);
  TVM_FFI_ICHECK_EQ(weight.size(0), weight_interleaved.size(0));
  TVM_FFI_ICHECK_EQ(weight.size(1), weight_interleaved.size(1));
  TVM_FFI_ICHECK_EQ(weight.size(2), weight_interleaved.size(2));
  int64_t const num_experts = weight.size(0);
  int64_t const n = weight.size(1);
  int64_t const k = weight.size(2) * 2;
  TVM_FFI_ICHECK_EQ(n % 16, 0) << "n must be divisible by 16";
  TVM_FFI_ICHECK_EQ(k % 64, 0) << "logical K must be divisible by 64";
  int64_t const per_expert_bytes = n * (k / 2);
  auto stream = get_stream(weight.device());
  auto* src = static_cast<uint8_t*>(weight.data_ptr());
  auto* dst = static_cast<uint8_t*>(weight_interleaved.data_ptr());
  for (int64_t e = 0; e < num_experts; ++e) {
    tensorrt_llm::kernels::cutlass_kernels::interleave_fp4_weights_for_sm90_mixed_gemm(
        src + e * per_expert_bytes, dst + e * per_expert_bytes, static_cast<int>(n),
        static_cast<int>(k), stream);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(interleave_fp4_moe_weights, interleave_fp4_moe_weights);
