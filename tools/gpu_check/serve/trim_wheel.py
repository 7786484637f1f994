#!/usr/bin/env python3
"""Trim vLLM 0.26.0's wheel to what the serving check runs, as one zip (then split to travel).

    python trim_wheel.py WHEEL OUT.zip

Kept: every Python file and data file of the `vllm` package, its compiled ops
`_C_stable_libtorch.abi3.so` (layernorm, rotary embedding, activation, KV-cache and sampling ops)
and `_moe_C_stable_libtorch.abi3.so` (MoE routing, Marlin MoE GEMM), FlashAttention-3's
`_vllm_fa3_C.abi3.so` (vLLM 0.26.0 imports `vllm.vllm_flash_attn` while loading any model and that
package refuses to import without FA2 or FA3), and the small helper libraries.
Dropped, with why (the check runs Triton attention on an H100, TP=1, no LoRA, no API server):
"""

from __future__ import annotations

import sys
import zipfile

#: Member-name prefixes dropped from the wheel, and why (written into the check's results).
DROPPED = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention-2 kernels (the check selects TRITON_ATTN)",
    "vllm/_flashmla": "FlashMLA (multi-head latent attention: DeepSeek models only)",
    "vllm/_qutlass_C": "QuTLASS (Blackwell FP4 linear layers)",
    "vllm/third_party/deep_gemm/": "DeepGEMM (FP8 block-scaled GEMMs, headers and builds for other Pythons)",
    "vllm/third_party/fmha_sm100/": "SM100 attention sources (Blackwell only)",
    "vllm/vllm-rs": "the Rust front-end binary (the API server; the check uses the offline LLM class)",
    "vllm/_rust_tool_parser": "tool-call parser (chat API only)",
    "vllm/entrypoints/serve/instrumentator/static/": "Swagger UI assets of the API server",
}

if __doc__ is not None:
    __doc__ += "".join(f"  * {k}: {v}\n" for k, v in DROPPED.items())


def main() -> int:
    wheel, out = sys.argv[1], sys.argv[2]
    kept = dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            if any(info.filename.startswith(p) for p in DROPPED):
                dropped += info.file_size
                continue
            kept += info.file_size
            dst.writestr(info, src.read(info.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    print(f"kept {kept / 1e6:.1f} MB, dropped {dropped / 1e6:.1f} MB (uncompressed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
