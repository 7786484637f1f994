#!/usr/bin/env python3
"""Golden data for mxconvert's NVFP4 MoE layouts, made by CALLING vLLM's own conversion code.

Run it with the reference environment's python (NOT the repo's .venv):

    .refenv2/bin/python tools/golden/make_nvfp4_goldens.py              # writes tests/golden/nvfp4/
    .refenv2/bin/python tools/golden/make_nvfp4_goldens.py --check-only # self-checks only

How to (re)build .refenv2 in the repository root (CPU only, Python 3.11; every step is below):

    python3 -m venv .refenv2
    printf 'torch==2.13.0\\ntriton==3.9.0\\n' > /tmp/c.txt         # keep every later install off CUDA torch
    .refenv2/bin/pip install -c /tmp/c.txt torch==2.13.0 numpy safetensors
    .refenv2/bin/pip install --no-deps flashinfer-python==0.7.2.post1 apache-tvm-ffi requests \\
        nvidia-ml-py packaging tqdm urllib3 idna certifi charset_normalizer
    pip download --no-deps vllm==0.33.0 -d /tmp/whl2 && .refenv2/bin/pip install --no-deps /tmp/whl2/vllm-0.33.0-*.whl
    .refenv2/bin/pip install -c /tmp/c.txt psutil pyzmq regex cbor2 aiohttp pillow pybase64 cachetools \\
        msgspec cloudpickle uvloop py-cpuinfo prometheus-client partial-json-parser einops pydantic \\
        "transformers>=5.16.1,<5.21.0" openai "fastapi<0.137.0,>=0.133.0"
    .refenv2/bin/pip install --no-deps xgrammar llguidance openai-harmony
    # flashinfer.cute_dsl.utils (convert_sf_to_mma_layout, the CuteDSL MMA view) imports cutlass:
    .refenv2/bin/pip install --no-deps nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 \
        nvidia-cutlass-dsl-libs-core==4.8.0 nvidia-cutlass-dsl-libs-cu12==4.8.0 "cuda-bindings<13" cuda-pathfinder
    # vLLM 0.15.0 (the `vllm-0.15` revision), its pinned flashinfer 0.6.1 and gguf, side by side in
    # .refenv2/v015 (used only by a worker subprocess with PYTHONPATH=.refenv2/v015):
    pip download --no-deps vllm==0.15.0 -d /tmp/whl2_015
    unzip -q /tmp/whl2_015/vllm-0.15.0-*.whl 'vllm/*' -x '*.so' -d .refenv2/v015
    .refenv2/bin/pip install --no-deps --target .refenv2/v015 flashinfer-python==0.6.1 gguf

What runs (nothing of mxconvert is used; no reference code is copied here):

  * vllm-0.33 (vLLM 0.33.0 + flashinfer 0.7.2.post1), in this process. Per case, the steps of
    ModelOptNvFp4FusedMoE.process_weights_after_loading after the canonical tensors are built
    (docs/checkpoints.md, "NVFP4 canonical tensors"), each a real vLLM call:
      oracle.nvfp4.convert_to_nvfp4_moe_kernel_format(backend, layer, ..., is_act_and_mul,
          use_a16, trtllm_hidden_alignment=flashinfer_utils.trtllm_nvfp4_hidden_alignment(False, gated))
        (-> flashinfer_fp4_moe.prepare_nvfp4_moe_layer_for_fi_or_cutlass /
            prepare_nvfp4_moe_layer_for_flashinfer_cutedsl / prepare_static_weights_for_trtllm_fp4_moe,
            reorder_w1w3_to_w3w1, reorder_w13_to_w31_for_flashinfer_cutedsl, interleave_linear_and_gate,
            flashinfer_utils.align_fp4_moe_hidden_dim_for_fi / align_fp4_moe_weights_for_fi,
            quant_utils.amax_for_moe_activation_quant, nvfp4_utils.swizzle_blockscale,
            flashinfer.fused_moe.core._maybe_get_cached_w3_w1_permute_indices /
            get_w2_permute_indices_with_cache, marlin_utils_fp4.prepare_nvfp4_moe_layer_for_marlin,
            _nvfp4_compute_scale_factor, nvfp4_marlin_process_scales,
            nvfp4_marlin_process_global_scale, marlin_utils.marlin_permute_scales)
      model_executor.utils.replace_parameter(layer, name, t) for the eight tensors
      oracle.nvfp4.make_nvfp4_moe_quant_config(...)          (CuteDSL: nvfp4_swizzled_scale_to_cutedsl_mma_view)
      <experts class>.process_weights_after_loading(self, layer), class from
          oracle.nvfp4.backend_to_kernel_cls(backend)[0]    (the global-scale fold; TRTLLM: g1_scale_c)
  * vllm-0.15 (vLLM 0.15.0 + its pinned flashinfer 0.6.1), in a worker subprocess: the same
    sequence with 0.15.0's functions (convert_to_nvfp4_moe_kernel_format, replace_parameter,
    make_nvfp4_moe_quant_config; 0.15 has no experts-side fold). Nothing is transcribed: every
    call is the 0.15.0 wheel's own vllm/model_executor/layers/fused_moe/oracle/nvfp4.py and helpers.

Stand-ins (said so in every case's metadata, key "reference"):
  * layer: StandInRoutedExperts (an nn.Module holding the eight canonical tensors as Parameters, plus
    the attributes the conversion reads: activation, moe_config.{hidden_dim, hidden_dim_unpadded,
    intermediate_size_per_partition, is_act_and_mul, moe_parallel_config.enable_eplb=False},
    num_experts, hidden_size, intermediate_size_per_partition, params_dtype=bfloat16).
  * experts `self` for process_weights_after_loading: a SimpleNamespace with quant_config, moe_config,
    is_situ=False, no swiglu clamp/alpha/beta (TRTLLM: plus the real _compute_g1_scale_c bound to it).
  * torch.Tensor.cuda is patched to identity while the reference runs (vLLM's swizzle_blockscale ends
    with `.cuda()`; no other data-moving call is affected).
  * flashinfer.nvfp4_block_scale_interleave (CUDA-only JIT) -> the same revision's pure-torch
    swizzle_blockscale, flattened (same 128x4 layout, docs/layouts.md "Shared moves"; cross-checked
    below against flashinfer's own pure-torch copies and the closed form).
  * vllm._custom_ops.gptq_marlin_repack (compiled) -> vLLM's test reference
    marlin_utils_test.marlin_weights(q_w, size_k, size_n, 4, get_weight_perm(4)) on the unpacked
    GPTQ view (vLLM's test_gptq_marlin_repack holds the kernel equal to it).
  * vllm-0.15 only: marlin_utils.marlin_make_workspace_new (queries the CUDA device; the workspace is
    not a weight) -> zeros.

Self-checks (closed forms of docs/layouts.md vs the reference, then every case vs the closed-form
pipeline) run before
anything is written; a disagreement aborts unless it is listed in KNOWN_SPEC_DISAGREEMENTS.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]
REFENV = Path(os.environ.get("MXCONVERT_REFENV2", REPO / ".refenv2"))
V015_PATH = REFENV / "v015"
OUT_DIR = REPO / "tests" / "golden" / "nvfp4"
sys.path.insert(0, str(REPO / "tests" / "golden"))
from nvfp4_inputs import NAMES, make_nvfp4_canonical  # noqa: E402

GENERATOR = "tools/golden/make_nvfp4_goldens.py"
E4M3 = torch.float8_e4m3fn
U8 = torch.uint8


def ru(a: int, b: int) -> int:
    return (a + b - 1) // b * b


# ============================================================================================
# cases
# ============================================================================================
BACKENDS = {  # short name -> vLLM NvFp4MoeBackend member
    "trtllm": "FLASHINFER_TRTLLM",
    "ficutlass": "FLASHINFER_CUTLASS",
    "vcutlass": "VLLM_CUTLASS",
    "cutedsl": "FLASHINFER_CUTEDSL",
    "cutedslb": "FLASHINFER_CUTEDSL_BATCHED",
    "marlin": "MARLIN",
}
REV_BACKENDS = {
    "vllm-0.33": ["trtllm", "ficutlass", "vcutlass", "cutedsl", "cutedslb", "marlin"],
    # 0.15 has no CUTEDSL_BATCHED; every other backend's bytes or scales differ from 0.33
    # (docs/layouts.md, "Revision fields that change bytes")
    "vllm-0.15": ["trtllm", "ficutlass", "vcutlass", "cutedsl", "marlin"],
}
REV_TAG = {"vllm-0.33": "v033", "vllm-0.15": "v015"}

# name: (E, K, N, gated, w4a16, seed, revisions, backends (None = all of the revision))
SMALL_SHAPES = {
    "e2_k256_n64": (2, 256, 64, True, False, 25664, None, None),  # aligned everywhere
    "e2_k256_n96": (2, 256, 96, True, False, 25696, None, None),  # N pads to 128 / raises
    "e2_k320_n64": (2, 320, 64, True, False, 32064, None, None),  # K pads 320 -> 512 (TRTLLM/CuteDSL)
    # non-gated (RELU2_NO_MUL); CUTEDSL_BATCHED is left out: it does not support no-act-and-mul
    # (vLLM 0.33.0 FlashInferCuteDSLBatchedExperts; docs/selection.md)
    "e2_k256_n64_ng": (
        2,
        256,
        64,
        False,
        False,
        25665,
        ("vllm-0.33",),
        ("trtllm", "ficutlass", "vcutlass", "cutedsl", "marlin"),
    ),
    "e2_k256_n64_a16": (2, 256, 64, True, True, 25666, None, ("marlin",)),  # W4A16 checkpoint
}
LARGE_SHAPES = {
    "e1_k2048_n768": (1, 2048, 768, True, False, 2048768, None, None),  # a Qwen3-30B-A3B-class layer (K=2048, N=768)
}


def all_cases(large: bool):
    shapes = LARGE_SHAPES if large else SMALL_SHAPES
    for sname, (E, K, N, gated, w4a16, seed, revs, bks) in shapes.items():
        for rev in ("vllm-0.33", "vllm-0.15"):
            if revs is not None and rev not in revs:
                continue
            for short in REV_BACKENDS[rev]:
                if bks is not None and short not in bks:
                    continue
                yield {
                    "case": f"{short}_{REV_TAG[rev]}_{sname}",
                    "short": short,
                    "backend": BACKENDS[short],
                    "revision": rev,
                    "shape_name": sname,
                    "E": E,
                    "K": K,
                    "N": N,
                    "gated": gated,
                    "w4a16": w4a16,
                    "seed": seed,
                }


# ============================================================================================
# worker side: runs INSIDE the reference environment of one revision
# ============================================================================================
def _activation(rev: str, gated: bool):
    if rev == "vllm-0.15":
        return None  # 0.15's conversion reads only is_act_and_mul
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return MoEActivation.SILU if gated else MoEActivation.RELU2_NO_MUL


class StandInRoutedExperts(torch.nn.Module):
    """Minimal stand-in for vLLM's RoutedExperts: the eight canonical tensors as Parameters plus
    exactly the attributes the conversion reads."""

    def __init__(self, canon, E, K, N, gated, activation):
        super().__init__()
        for k in NAMES:
            if k in canon:
                self.register_parameter(k, torch.nn.Parameter(canon[k].clone(), requires_grad=False))
        self.activation = activation
        self.moe_config = SimpleNamespace(
            hidden_dim=K,
            hidden_dim_unpadded=None,
            intermediate_size_per_partition=N,
            is_act_and_mul=gated,
            activation=activation,
            moe_parallel_config=SimpleNamespace(enable_eplb=False),
        )
        self.num_experts = E  # Marlin reads these four
        self.hidden_size = K
        self.intermediate_size_per_partition = N
        self.params_dtype = torch.bfloat16


def _swizzle_fn(rev: str):
    if rev == "vllm-0.15":
        from vllm.model_executor.layers.quantization.utils.quant_utils import swizzle_blockscale
    else:
        from vllm.model_executor.layers.quantization.utils.nvfp4_utils import swizzle_blockscale
    return swizzle_blockscale


def _unpack_gptq_view(G: torch.Tensor, size_k: int) -> torch.Tensor:
    """GPTQ int32 view [k/8, n] -> nibbles q_w [k, n] (nibble j of row r is element k = 8r + j)."""
    g = G.to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(8) * 4).view(1, 8, 1)
    q = (g.unsqueeze(1) >> shifts) & 0xF
    return q.reshape(size_k, G.shape[1]).to(torch.int32)


@contextlib.contextmanager
def reference_patches(rev: str):
    """The run-time stand-ins listed in the module docstring (restored afterwards)."""
    import flashinfer
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mut

    swz = _swizzle_fn(rev)
    saved = []

    def setp(obj, name, val):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, val)

    def cuda_identity(self, *a, **k):
        return self

    def interleave_standin(unswizzled_sf):
        assert unswizzled_sf.dtype in (U8, torch.bfloat16) and unswizzled_sf.dim() == 2
        return swz(unswizzled_sf.view(E4M3)).view(U8).reshape(-1)

    perm4 = mut.get_weight_perm(4)

    def repack_standin(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False, perm=None):
        assert num_bits == 4 and not is_a_8bit and (perm is None or perm.numel() == 0)
        assert b_q_weight.dtype == torch.int32 and tuple(b_q_weight.shape) == (size_k // 8, size_n)
        assert size_k % 16 == 0 and size_n % 64 == 0, "gptq_marlin_repack tile constraints"
        q_w = _unpack_gptq_view(b_q_weight, size_k)
        return mut.marlin_weights(q_w, size_k, size_n, 4, perm4)

    setp(torch.Tensor, "cuda", cuda_identity)
    setp(flashinfer, "nvfp4_block_scale_interleave", interleave_standin)
    setp(ops, "gptq_marlin_repack", repack_standin)
    if rev == "vllm-0.15":
        from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as m4

        setp(m4, "marlin_make_workspace_new", lambda device, max_blocks_per_sm=1: torch.zeros(1, dtype=torch.int))
    try:
        yield
    finally:
        for obj, name, val in reversed(saved):
            setattr(obj, name, val)


def _run_v033(c, layer):
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
    from vllm.model_executor.layers.quantization.utils.flashinfer_utils import trtllm_nvfp4_hidden_alignment
    from vllm.model_executor.utils import replace_parameter

    B = oracle.NvFp4MoeBackend[c["backend"]]
    gated, w4a16 = c["gated"], c["w4a16"]
    outs = oracle.convert_to_nvfp4_moe_kernel_format(
        nvfp4_backend=B,
        layer=layer,
        w13=layer.w13_weight,
        w13_scale=layer.w13_weight_scale,
        w13_scale_2=layer.w13_weight_scale_2,
        a13_scale=getattr(layer, "w13_input_scale", None),
        w2=layer.w2_weight,
        w2_scale=layer.w2_weight_scale,
        w2_scale_2=layer.w2_weight_scale_2,
        a2_scale=getattr(layer, "w2_input_scale", None),
        is_act_and_mul=gated,
        use_a16=w4a16,
        trtllm_hidden_alignment=trtllm_nvfp4_hidden_alignment(per_token_activation=False, is_act_and_mul=gated),
    )
    for name, t in zip(NAMES, outs):
        replace_parameter(layer, name, t)
    qc = oracle.make_nvfp4_moe_quant_config(
        backend=B,
        w13_scale=layer.w13_weight_scale,
        w2_scale=layer.w2_weight_scale,
        w13_scale_2=layer.w13_weight_scale_2,
        w2_scale_2=layer.w2_weight_scale_2,
        a13_scale=layer.w13_input_scale,
        a2_scale=layer.w2_input_scale,
        swiglu_limit=None,
        swiglu_alpha=None,
        swiglu_beta=None,
        layer=layer,
        use_a16=w4a16,
    )
    cls = oracle.backend_to_kernel_cls(B)[0]
    self_ = SimpleNamespace(
        quant_config=qc,
        moe_config=layer.moe_config,
        is_situ=False,
        _gemm1_clamp_limit_unfolded=None,
        _gemm1_beta_unfolded=None,
        gemm1_alpha=None,
        gemm1_beta=None,
        gemm1_clamp_limit=None,
    )
    if hasattr(cls, "_compute_g1_scale_c"):
        self_._compute_g1_scale_c = types.MethodType(cls._compute_g1_scale_c, self_)
    cls.process_weights_after_loading(self_, layer)
    extra = {}
    for k in ("a1_gscale", "a2_gscale", "g1_alphas", "g2_alphas"):
        v = getattr(qc, k)
        if v is not None:
            extra[k] = v
    if hasattr(layer, "g1_scale_c"):
        extra["g1_scale_c"] = layer.g1_scale_c
    mma = {}
    if c["backend"] == "FLASHINFER_CUTEDSL":
        mma = {"w13_weight_scale": qc.w1_scale, "w2_weight_scale": qc.w2_scale}
    fns = [
        f"vllm.model_executor.layers.fused_moe.oracle.nvfp4.convert_to_nvfp4_moe_kernel_format"
        f"(NvFp4MoeBackend.{c['backend']}, is_act_and_mul={gated}, use_a16={w4a16}, "
        "trtllm_hidden_alignment=trtllm_nvfp4_hidden_alignment(False, is_act_and_mul))",
        "vllm.model_executor.utils.replace_parameter (x8)",
        "vllm.model_executor.layers.fused_moe.oracle.nvfp4.make_nvfp4_moe_quant_config",
        f"{cls.__module__}.{cls.__qualname__}.process_weights_after_loading (stand-in self)",
    ]
    return extra, mma, fns


def _run_v015(c, layer):
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
    from vllm.model_executor.utils import replace_parameter

    B = oracle.NvFp4MoeBackend[c["backend"]]
    outs = oracle.convert_to_nvfp4_moe_kernel_format(
        nvfp4_backend=B,
        layer=layer,
        w13=layer.w13_weight,
        w13_scale=layer.w13_weight_scale,
        w13_scale_2=layer.w13_weight_scale_2,
        a13_scale=getattr(layer, "w13_input_scale", None),
        w2=layer.w2_weight,
        w2_scale=layer.w2_weight_scale,
        w2_scale_2=layer.w2_weight_scale_2,
        a2_scale=getattr(layer, "w2_input_scale", None),
        is_act_and_mul=c["gated"],
    )
    for name, t in zip(NAMES, outs):
        replace_parameter(layer, name, t)
    qc = oracle.make_nvfp4_moe_quant_config(
        backend=B,
        w13_scale=layer.w13_weight_scale,
        w2_scale=layer.w2_weight_scale,
        w13_scale_2=layer.w13_weight_scale_2,
        w2_scale_2=layer.w2_weight_scale_2,
        a13_scale=layer.w13_input_scale,
        a2_scale=layer.w2_input_scale,
    )
    extra = {}
    if qc is not None:
        for k in ("a1_gscale", "a2_gscale", "g1_alphas", "g2_alphas"):
            v = getattr(qc, k)
            if v is not None:
                extra[k] = v
    else:  # TRTLLM 0.15: plain attributes set by prepare_nvfp4_moe_layer_for_fi_or_cutlass
        for k in ("a1_gscale", "g1_alphas", "g2_alphas", "g1_scale_c"):
            extra[k] = getattr(layer, k)
    fns = [
        f"vllm.model_executor.layers.fused_moe.oracle.nvfp4.convert_to_nvfp4_moe_kernel_format"
        f"(NvFp4MoeBackend.{c['backend']}, is_act_and_mul={c['gated']})  [vLLM 0.15.0]",
        "vllm.model_executor.utils.replace_parameter (x8)  [vLLM 0.15.0]",
        "vllm.model_executor.layers.fused_moe.oracle.nvfp4.make_nvfp4_moe_quant_config  [vLLM 0.15.0]",
    ]
    return extra, {}, fns


def memory_order(t: torch.Tensor):
    """(dense buffer in memory order, perm) with buffer = t.permute(perm).contiguous()."""
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    p = t.permute(perm)
    return torch.empty(p.shape, dtype=p.dtype).copy_(p), perm  # truly dense, even for stride-0 dims


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def view_info(t: torch.Tensor) -> dict:
    _, perm = memory_order(t)
    return {
        "dtype": dtype_name(t.dtype),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "memory_perm": perm,
        "view_is_dense": bool(t.permute(perm).is_contiguous()),
    }


def run_case(rev: str, c: dict):
    """-> (tensors {kernel.<n> / kernel.extra.<n>: dense buffer}, info dict)."""
    import flashinfer
    import vllm

    canon = make_nvfp4_canonical(c["E"], c["K"], c["N"], c["seed"], gated=c["gated"], w4a16=c["w4a16"])
    layer = StandInRoutedExperts(canon, c["E"], c["K"], c["N"], c["gated"], _activation(rev, c["gated"]))
    info = {
        "vllm_version": vllm.__version__,
        "flashinfer_version": flashinfer.__version__,
        "vllm_file": str(Path(vllm.__file__).parent),
    }
    try:
        with reference_patches(rev):
            extra, mma, fns = (_run_v033 if rev == "vllm-0.33" else _run_v015)(c, layer)
    except Exception as e:  # noqa: BLE001  -- an expected_error case
        fr = traceback.extract_tb(e.__traceback__)[-1]
        fn = fr.filename
        for root in (str(Path(vllm.__file__).parents[1]), str(Path(flashinfer.__file__).parents[1])):
            if fn.startswith(root + os.sep):
                fn = fn[len(root) + 1 :]
        info["expected_error"] = {
            "type": type(e).__name__,
            "message": str(e),
            "raised_at": f"{fn}:{fr.lineno} {fr.name}: {fr.line}",
        }
        return {}, info
    tensors, views, absent = {}, {}, []
    ptrs = {}
    for k in NAMES:
        p = getattr(layer, k, None)
        if p is None or p.numel() == 0:  # None (0.33) or an empty Parameter(None) (0.15 replace_parameter)
            absent.append(k if p is None else f"{k} (empty Parameter)")
            continue
        t = p.data
        buf, _ = memory_order(t)
        tensors[f"kernel.{k}"] = buf.clone()
        views[k] = view_info(t)
        ptrs[k] = (t.untyped_storage().data_ptr(), t.storage_offset())
    for k, v in extra.items():
        t = v.data if isinstance(v, torch.nn.Parameter) else v
        buf, _ = memory_order(t)
        tensors[f"kernel.extra.{k}"] = buf.clone()
        views[f"extra.{k}"] = view_info(t)
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        al = [n for n, pk in ptrs.items() if pk == key and list(getattr(layer, n).shape) == list(t.shape)]
        if al:
            views[f"extra.{k}"]["aliases"] = al[0]
    for k, mv in mma.items():
        base = getattr(layer, k).data
        assert mv.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        views[k]["mma_view"] = {
            "function": "flashinfer.cute_dsl.utils.convert_sf_to_mma_layout via vllm "
            "nvfp4_swizzled_scale_to_cutedsl_mma_view (make_nvfp4_moe_quant_config)",
            "shape": list(mv.shape),
            "stride": list(mv.stride()),
            "storage_offset": mv.storage_offset() - base.storage_offset(),
            "aliases": k,
        }
    mc = layer.moe_config
    info.update(
        {
            "views": views,
            "absent": absent,
            "functions": fns,
            "moe_config_after": {
                "hidden_dim": mc.hidden_dim,
                "hidden_dim_unpadded": mc.hidden_dim_unpadded,
                "intermediate_size_per_partition": mc.intermediate_size_per_partition,
            },
        }
    )
    return tensors, info


def worker_main(rev: str, cases_json: Path, out_dir: Path):
    from safetensors.torch import save_file

    cases = json.loads(cases_json.read_text())
    for c in cases:
        tensors, info = run_case(rev, c)
        if tensors:
            save_file(tensors, str(out_dir / f"{c['case']}.safetensors"))
        (out_dir / f"{c['case']}.json").write_text(json.dumps(info))


def run_revision(rev: str, cases: list[dict]):
    """Run `cases` in the environment of `rev` (0.33 in-process, 0.15 in a subprocess)."""
    if rev == "vllm-0.33":
        return [run_case(rev, c) for c in cases]
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        (td / "cases.json").write_text(json.dumps(cases))
        env = dict(os.environ, PYTHONPATH=str(V015_PATH))
        r = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                rev,
                "--worker-cases",
                str(td / "cases.json"),
                "--worker-out",
                str(td),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
            raise SystemExit(f"{rev} worker failed")
        res = []
        for c in cases:
            info = json.loads((td / f"{c['case']}.json").read_text())
            p = td / f"{c['case']}.safetensors"
            res.append((load_file(str(p)) if p.exists() else {}, info))
        return res


# ============================================================================================
# closed forms (docs/layouts.md) -- used only to CHECK the reference outputs
# ============================================================================================
class Disagreement(AssertionError):
    pass


# Closed-form statements that the reference contradicts (filled in after investigation; reported).
KNOWN_SPEC_DISAGREEMENTS: dict[str, str] = {}


def expect(cond, msg):
    if not cond:
        raise Disagreement(msg)


def as_u8(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    if t.dim() and t.stride(-1) != 1:  # a size-1 stride-0 dim counts as contiguous
        t = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    return t.view(U8) if t.dtype != U8 else t


def same(a: torch.Tensor, b: torch.Tensor, what: str):
    expect(a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}")
    expect(list(a.shape) == list(b.shape), f"{what}: shape {list(a.shape)} != {list(b.shape)}")
    expect(torch.equal(as_u8(a).reshape(-1), as_u8(b).reshape(-1)), f"{what}: bytes differ")


def cf_swizzle(S: torch.Tensor) -> torch.Tensor:
    """128x4 swizzle scatter (docs/layouts.md "Shared moves"): [B, M, Kc] (any 1-byte dtype) -> [B, Mp, Kp],
    zero padding."""
    if S.dim() == 2:
        return cf_swizzle(S.unsqueeze(0))[0]
    B, M, Kc = S.shape
    Mp, Kp = ru(M, 128), ru(Kc, 4)
    out = torch.zeros(B * Mp * Kp, dtype=U8)
    b = torch.arange(B)[:, None, None]
    m = torch.arange(M)[None, :, None]
    k = torch.arange(Kc)[None, None, :]
    off = b * Mp * Kp + (m // 128) * (Kp // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4)
    out[off.reshape(-1)] = as_u8(S).reshape(-1)
    return out.view(S.dtype).reshape(B, Mp, Kp)


def cf_unswizzle(O: torch.Tensor, M: int, Kc: int) -> torch.Tensor:
    """128x4 swizzle inverse (FlashInfer test convert_swizzled_to_linear), one batch."""
    Mp, Kp = O.shape
    mt, kt = Mp // 128, Kp // 4
    return O.reshape(mt, kt, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(mt * 128, kt * 4)[:M, :Kc]


def cf_perm1(M: int) -> torch.Tensor:
    r = torch.arange(M)
    return 32 * (r // 32) + 4 * ((r % 32) % 8) + (r % 32) // 8


def cf_trtllm_rows(M: int, gated: bool) -> torch.Tensor:
    """TRT-LLM composite row shuffle (docs/layouts.md "TRTLLM"): OUT[r] = IN_w3w1[src(r)]."""
    p = cf_perm1(M)
    return p // 2 + (p % 2) * (M // 2) if gated else p


def cf_interleave_rows(M: int) -> torch.Tensor:
    """interleave_linear_and_gate (docs/layouts.md "CuteDSL"): OUT[:, r] = IN[:, h*(M/2) + 64*b + q]."""
    r = torch.arange(M)
    b, h, q = r // 128, (r % 128) // 64, r % 64
    return h * (M // 2) + 64 * b + q


def cf_mma_view(Mp: int, Kp: int, E: int):
    """CuteDSL MMA view (docs/layouts.md "CuteDSL"): view(E, Mp/128, Kp/4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
    of a contiguous buffer."""
    mt, kt = Mp // 128, Kp // 4
    shape, st = (E, mt, kt, 32, 4, 4), (mt * kt * 512, kt * 512, 512, 16, 4, 1)
    p = (3, 4, 1, 5, 2, 0)
    return [shape[i] for i in p], [st[i] for i in p]


def cf_marlin_repack(B: torch.Tensor) -> torch.Tensor:
    """Marlin GPTQ view + gptq_marlin_repack closed form (docs/layouts.md "MARLIN") for one expert:
    packed B [n_out, k_in/2] u8 -> R [k_in/16, 2 n_out] int32."""
    n_out, kb = B.shape
    k_in = 2 * kb
    q = torch.stack([B & 0xF, B >> 4], -1).reshape(n_out, k_in).to(torch.int64)  # q[n, k]
    kt = torch.arange(k_in // 16).view(-1, 1, 1, 1)
    nt = torch.arange(n_out // 64).view(1, -1, 1, 1)
    t = torch.arange(32).view(1, 1, -1, 1)
    w = torch.arange(4).view(1, 1, 1, -1)
    dk, dn = (0, 8, 0, 8, 1, 9, 1, 9), (0, 0, 8, 8, 0, 0, 8, 8)
    acc = torch.zeros(k_in // 16, n_out // 64, 32, 4, dtype=torch.int64)
    for i in range(8):
        n = 64 * nt + 16 * w + t // 4 + dn[i]
        k = 16 * kt + 2 * (t % 4) + dk[i]
        acc |= q[n, k] << (4 * i)
    R = torch.zeros(k_in // 16, 2 * n_out, dtype=torch.int64)
    col = 128 * nt + 4 * t + w
    R[kt.expand_as(acc).reshape(-1), col.expand_as(acc).reshape(-1)] = acc.reshape(-1)
    R = torch.where(R >= 2**31, R - 2**32, R)
    return R.to(torch.int32)


def cf_marlin_scale_index(n_rows: int, n_out: int) -> torch.Tensor:
    """Composite Marlin scale index (docs/layouts.md "NVFP4 scales"): out[f] = T[idx[f]] with T = scale[e].T
    flattened ([k_in/16, n_out])."""
    f = torch.arange(n_rows * n_out)
    f1 = 4 * (f // 4) + torch.tensor([0, 2, 1, 3])[f % 4]
    q = f1 % 64
    return 64 * (f1 // 64) + 8 * (q % 8) + q // 8


def _e4m3_value(code: torch.Tensor) -> torch.Tensor:
    return code.view(E4M3).to(torch.float64)


def cf_marlin_bytes(codes: torch.Tensor, s: int, zero_below_2: bool) -> torch.Tensor:
    """Marlin scale byte map (docs/layouts.md "NVFP4 scales").
    y = x * 2^(7+s): 0 if y < 2 (0.33) else ((floor(log2 y) + 15) << 3) | mant3(y).
    vllm-0.15 (`plain`): s = 0 and no zeroing (subnormals kept)."""
    x = _e4m3_value(codes)
    y = x * 2.0 ** (7 + s)
    pos = y > 0
    e = torch.floor(torch.log2(torch.where(pos, y, torch.ones_like(y))))
    mant = torch.round((y / torch.exp2(e) - 1) * 8)
    byte = ((e + 15).to(torch.int64) << 3) | mant.to(torch.int64)
    keep = (y >= 2) if zero_below_2 else pos
    return torch.where(keep, byte, torch.zeros_like(byte)).to(U8)


def cf_marlin_sf(scales_bf16: torch.Tensor) -> float:
    """Marlin rescale factor sf (`_nvfp4_compute_scale_factor`, docs/layouts.md "NVFP4 scales"), bf16 activations."""
    x = scales_bf16.float() * 128
    nz = x[x > 0]
    if nz.numel() and float(nz.max()) < 448 * 128:
        return float(torch.floor(torch.log2(torch.tensor(57344.0) / nz.max())).exp2())
    return 1.0


def spec_pipeline(c: dict, canon: dict) -> dict:
    """The per-backend pipeline of docs/layouts.md (both revisions) from the canonical inputs.
    Returns {"error": <reason>} or {"kernel": {...}, "extra": {...}}."""
    rev, bk, gated = c["revision"], c["backend"], c["gated"]
    E, K, N = c["E"], c["K"], c["N"]
    W13, S13 = canon["w13_weight"].clone(), canon["w13_weight_scale"].clone()
    W2, S2 = canon["w2_weight"].clone(), canon["w2_weight_scale"].clone()
    ws13, ws2 = canon["w13_weight_scale_2"].clone(), canon["w2_weight_scale_2"].clone()
    a13, a2 = canon.get("w13_input_scale"), canon.get("w2_input_scale")
    v033 = rev == "vllm-0.33"

    def swap(x):  # swap_halves (reorder_w1w3_to_w3w1)
        h = x.shape[1] // 2
        return torch.cat([x[:, h:], x[:, :h]], 1)

    def pad_hidden(W13, S13, W2, S2, align):  # align_fp4_moe_hidden_dim_for_fi
        Kp = ru(K, align)
        if Kp == K:
            return W13, S13, W2, S2, K
        z = lambda t, shape: torch.zeros(shape, dtype=t.dtype)  # noqa: E731
        w13, s13 = z(W13, (E, W13.shape[1], Kp // 2)), z(S13, (E, S13.shape[1], Kp // 16))
        w2, s2 = z(W2, (E, Kp, W2.shape[2])), z(S2, (E, Kp, S2.shape[2]))
        w13[:, :, : K // 2], s13[:, :, : K // 16], w2[:, :K], s2[:, :K] = W13, S13, W2, S2
        return w13, s13, w2, s2, Kp

    def pad_inter(W13, S13, W2, S2, align, gated_layout):  # align_fp4_moe_weights_for_fi
        Np = ru(N, align)
        if Np == N:
            return W13, S13, W2, S2, N
        Kh = W2.shape[1]
        S = 2 if gated_layout else 1
        w13 = torch.zeros(E, S * Np, W13.shape[2], dtype=W13.dtype)
        s13 = torch.zeros(E, S * Np, S13.shape[2], dtype=S13.dtype)
        for h in range(S):
            w13[:, h * Np : h * Np + N] = W13[:, h * N : (h + 1) * N]
            s13[:, h * Np : h * Np + N] = S13[:, h * N : (h + 1) * N]
        w2 = torch.zeros(E, Kh, Np // 2, dtype=W2.dtype)
        s2 = torch.zeros(E, Kh, Np // 16, dtype=S2.dtype)
        w2[:, :, : N // 2], s2[:, :, : N // 16] = W2, S2
        return w13, s13, w2, s2, Np

    glob = bk in ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED")
    out, extra = {}, {}
    if bk != "MARLIN":  # amax_for_moe_activation_quant (docs/layouts.md "NVFP4 scales")
        if glob:
            a13r = a13.max().float().repeat(E) if v033 else a13.max().float().expand(E)
            a2r = a2.max().float().repeat(E) if v033 else a2.max().float().expand(E)
        else:
            a13r, a2r = a13.max(dim=1).values.float(), a2
    if bk == "FLASHINFER_TRTLLM":
        if gated:
            W13, S13 = swap(W13), swap(S13)
        if v033:
            W13, S13, W2, S2, Kp = pad_hidden(W13, S13, W2, S2, 256)
            W13, S13, W2, S2, Np = pad_inter(W13, S13, W2, S2, 64 if gated else 128, gated)
        M, Kh = W13.shape[1], W2.shape[1]
        if M % 128 or Kh % 128:
            return {"error": f"TRTLLM shuffle needs rows % 128 == 0 (w13 rows {M}, w2 rows {Kh})"}
        p13, p2 = cf_trtllm_rows(M, gated), cf_trtllm_rows(Kh, False)
        out["w13_weight"] = W13[:, p13]
        out["w13_weight_scale"] = torch.stack([cf_swizzle(S13[e][p13]) for e in range(E)])
        out["w2_weight"] = W2[:, p2]
        out["w2_weight_scale"] = torch.stack([cf_swizzle(S2[e][p2]) for e in range(E)])
    elif bk in ("FLASHINFER_CUTLASS", "VLLM_CUTLASS", "FLASHINFER_CUTEDSL_BATCHED") or (
        bk == "FLASHINFER_CUTEDSL" and not v033
    ):
        if gated and bk == "FLASHINFER_CUTLASS":
            W13, S13 = swap(W13), swap(S13)
        S13 = cf_swizzle(S13)
        pad = S13.shape[1] - W13.shape[1]
        if pad > 0:
            if gated:
                return {"error": "fi_or_cutlass: intermediate padding with is_act_and_mul -> NotImplementedError"}
            W13 = torch.cat([W13, torch.zeros(E, pad, W13.shape[2], dtype=U8)], 1)
            W2 = torch.cat([W2, torch.zeros(E, W2.shape[1], pad // 2, dtype=U8)], 2)
            S2 = torch.cat([S2, torch.zeros(E, S2.shape[1], pad // 16, dtype=E4M3)], 2)
        out.update(w13_weight=W13, w13_weight_scale=S13, w2_weight=W2, w2_weight_scale=cf_swizzle(S2))
    elif bk == "FLASHINFER_CUTEDSL":  # 0.33 prepare_nvfp4_moe_layer_for_flashinfer_cutedsl
        if gated:
            W13, S13 = swap(W13), swap(S13)
        W13, S13, W2, S2, Np = pad_inter(W13, S13, W2, S2, 64 if gated else 128, gated)
        W13, S13, W2, S2, Kp = pad_hidden(W13, S13, W2, S2, 256)
        if gated:
            rows = cf_interleave_rows(W13.shape[1])
            W13, S13 = W13[:, rows], S13[:, rows]
        out.update(w13_weight=W13, w13_weight_scale=cf_swizzle(S13), w2_weight=W2, w2_weight_scale=cf_swizzle(S2))
    elif bk == "MARLIN":  # prepare_nvfp4_moe_layer_for_marlin: `rescaled` (0.33), `plain` (0.15)
        S = 2 if gated else 1
        Np = (ru(N, 64) if K % 128 == 0 else ru(N, 128)) if v033 else N
        if Np != N:
            W13, S13, W2, S2, _ = pad_inter(W13, S13, W2, S2, Np, gated)
        for n_out, k_in in ((S * Np, K), (K, Np)):
            if k_in % 16 or n_out % 64:
                return {"error": "gptq_marlin_repack needs size_k % 16 == 0 and size_n % 64 == 0"}
        out["w13_weight"] = torch.stack([cf_marlin_repack(W13[e]) for e in range(E)])
        out["w2_weight"] = torch.stack([cf_marlin_repack(W2[e]) for e in range(E)])
        for nm, Sx, g in (("w13", S13, ws13), ("w2", S2, ws2)):
            sb = Sx.to(torch.bfloat16)
            s_f = cf_marlin_sf(sb) if v033 else 1.0
            s = int(round(torch.log2(torch.tensor(s_f)).item()))
            T = Sx.transpose(1, 2).contiguous()  # [E, k_in/16, n_out]
            idx = cf_marlin_scale_index(T.shape[1], T.shape[2])
            codes = as_u8(T).reshape(E, -1)[:, idx]
            out[f"{nm}_weight_scale"] = cf_marlin_bytes(codes, s, v033).view(E4M3).reshape(T.shape)
            if v033:
                out[f"{nm}_weight_scale_2"] = g * 2.0**119 / s_f
            else:
                out[f"{nm}_weight_scale_2"] = g.to(torch.bfloat16) * 2.0**119
        extra["g1_alphas"], extra["g2_alphas"] = out["w13_weight_scale_2"], out["w2_weight_scale_2"]
        return {"kernel": out, "extra": extra}
    # W4A4 global scales: folded (0.33) or not (0.15), docs/layouts.md "NVFP4 scales"
    out["w13_input_scale"], out["w2_input_scale"] = a13r, a2r
    if v033:
        g1, g2 = ws13 * a13r, ws2 * a2r  # fold: w * a
        out["w13_weight_scale_2"], out["w2_weight_scale_2"] = g1, g2
        extra.update(a1_gscale=1.0 / a13r, a2_gscale=1.0 / a2r, g1_alphas=g1, g2_alphas=g2)
        if bk == "FLASHINFER_TRTLLM":
            extra["g1_scale_c"] = g1 * (1.0 / a2r) if gated else 1.0 / a2r
    else:
        out["w13_weight_scale_2"], out["w2_weight_scale_2"] = ws13, ws2
        g1, g2 = a13r * ws13, a2r * ws2  # quant config: a * w
        extra.update(a1_gscale=1.0 / a13r, g1_alphas=g1, g2_alphas=g2)
        if bk == "FLASHINFER_TRTLLM":
            extra["g1_scale_c"] = a13r * ws13 / a2r
        else:
            extra["a2_gscale"] = 1.0 / a2r
    return {"kernel": out, "extra": extra}


def check_case_against_spec(c: dict, canon: dict, tensors: dict, info: dict, log=print):
    sp = spec_pipeline(c, canon)
    err = info.get("expected_error")
    if "error" in sp or err:
        expect(
            ("error" in sp) and bool(err),
            f"{c['case']}: closed form says {sp.get('error', 'ok')!r}, reference says {err!r}",
        )
        return
    got = {k[len("kernel.") :] for k in tensors if k.startswith("kernel.") and not k.startswith("kernel.extra.")}
    expect(got == set(sp["kernel"]), f"{c['case']}: kernel tensors {sorted(got)} vs closed form {sorted(sp['kernel'])}")
    for k, v in sp["kernel"].items():
        same(tensors[f"kernel.{k}"], v.contiguous(), f"{c['case']}: kernel.{k} vs closed form")
    for k, v in sp["extra"].items():
        same(tensors[f"kernel.extra.{k}"], v.contiguous(), f"{c['case']}: kernel.extra.{k} vs closed form")
    expect(
        set(k[len("kernel.extra.") :] for k in tensors if k.startswith("kernel.extra.")) == set(sp["extra"]),
        f"{c['case']}: extra set {sorted(tensors)} vs closed form {sorted(sp['extra'])}",
    )
    if c["backend"] == "FLASHINFER_CUTEDSL" and c["revision"] == "vllm-0.33":
        for nm in ("w13_weight_scale", "w2_weight_scale"):
            E, Mp, Kp = info["views"][nm]["shape"]
            shape, stride = cf_mma_view(Mp, Kp, E)
            mv = info["views"][nm]["mma_view"]
            expect(
                mv["shape"] == shape and mv["stride"] == stride,
                f"{c['case']}: {nm} MMA view {mv['shape']}/{mv['stride']} vs closed form {shape}/{stride}",
            )


# ============================================================================================
# self-checks: closed forms vs the reference functions, on a few shapes
# ============================================================================================
def selfcheck(log=print):
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4
    from flashinfer.experimental.b12x.testing.reference.helpers import swizzle_block_scale_reference
    from flashinfer.fused_moe.core import _maybe_get_cached_w3_w1_permute_indices, get_w2_permute_indices_with_cache
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as m4
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mut
    from vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe import interleave_linear_and_gate
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_scales
    from vllm.model_executor.layers.quantization.utils.quant_utils import gptq_pack

    g = torch.Generator().manual_seed(1234)
    swz = _swizzle_fn("vllm-0.33")

    # 128x4 swizzle (one shape per check, plus the padded ones)
    for B, M, Kc in ((2, 128, 8), (1, 200, 6), (3, 256, 48), (2, 1536, 128), (1, 96, 5)):
        S = torch.randint(0, 256, (B, M, Kc), dtype=U8, generator=g).view(E4M3)
        with reference_patches("vllm-0.33"):
            ref = swz(S)
        same(ref, cf_swizzle(S), f"128x4 swizzle B,M,Kc={B},{M},{Kc}")
        if B == 1:
            same(_swizzle_sf_128x4(as_u8(S[0])), as_u8(ref).reshape(-1), "flashinfer _swizzle_sf_128x4")
            same(
                swizzle_block_scale_reference(as_u8(S[0])).reshape(-1),
                as_u8(ref).reshape(-1),
                "flashinfer swizzle_block_scale_reference",
            )
        for b in range(B):
            same(cf_unswizzle(ref[b], M, Kc), S[b], "128x4 swizzle inverse")
    log("ok  128x4 swizzle: vllm swizzle_blockscale == closed-form scatter == flashinfer pure-torch copies; inverse ok")

    # composite TRT-LLM row permutation
    for M in (128, 256, 1536, 2048):
        x = torch.zeros(M, 8, dtype=U8)
        for gated in (True, False):
            ref = _maybe_get_cached_w3_w1_permute_indices({}, x, 128, is_gated_act_gemm=gated)
            expect(torch.equal(ref, cf_trtllm_rows(M, gated)), f"TRTLLM composite perm M={M} gated={gated}")
            ref_sf = _maybe_get_cached_w3_w1_permute_indices({}, x, 128, num_elts_per_sf=16, is_gated_act_gemm=gated)
            expect(torch.equal(ref_sf, ref), f"TRTLLM sf perm == weight perm M={M}")
        expect(torch.equal(get_w2_permute_indices_with_cache({}, x, 128), cf_perm1(M)), f"TRTLLM w2 perm M={M}")
    log("ok  TRTLLM composite perm0[perm1] and w2 perm1 closed forms == flashinfer 0.7.2.post1")

    # interleave_linear_and_gate
    for M, C in ((128, 8), (256, 16), (1536, 4)):
        x = torch.randint(0, 256, (2, M, C), dtype=U8, generator=g)
        expect(
            torch.equal(interleave_linear_and_gate(x, group_size=64, dim=1), x[:, cf_interleave_rows(M)]),
            f"interleave_linear_and_gate M={M}",
        )
    log("ok  interleave_linear_and_gate closed form")

    # CuteDSL MMA view
    from vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe import (
        nvfp4_swizzled_scale_to_cutedsl_mma_view,
    )

    for E, Mp, Kp in ((2, 128, 16), (8, 1536, 128), (1, 2048, 48)):
        s = torch.zeros(E, Mp, Kp, dtype=E4M3)
        v = nvfp4_swizzled_scale_to_cutedsl_mma_view(s)
        shape, stride = cf_mma_view(Mp, Kp, E)
        expect(list(v.shape) == shape and list(v.stride()) == stride, f"CuteDSL MMA view {E},{Mp},{Kp}")
    log("ok  CuteDSL MMA view shape/stride closed form")

    # Marlin repack closed form vs marlin_weights, and the GPTQ-view unpack round trip
    perm4 = mut.get_weight_perm(4)
    for n_out, k_in in ((64, 64), (192, 128), (128, 32), (256, 96)):
        B = torch.randint(0, 256, (n_out, k_in // 2), dtype=U8, generator=g)
        G = B.view(torch.int32).T.contiguous()
        q_w = _unpack_gptq_view(G, k_in)
        expect(torch.equal(gptq_pack(q_w, 4, k_in, n_out), G), "GPTQ view unpack/gptq_pack round trip")
        ref = mut.marlin_weights(q_w, k_in, n_out, 4, perm4)
        expect(torch.equal(ref, cf_marlin_repack(B)), f"Marlin repack closed form n,k={n_out},{k_in}")
    log("ok  Marlin repack closed form == marlin_weights(get_weight_perm(4)); GPTQ view round trip")

    # Marlin composite scale index (one shape) + scale byte map for every positive code
    for n_out, k_in in ((128, 256), (256, 96)):
        T = torch.arange(n_out * k_in // 16, dtype=torch.float32).reshape(k_in // 16, n_out)
        ref = marlin_permute_scales(s=T, size_k=k_in, size_n=n_out, group_size=16)
        ref = ref.view(-1, 4)[:, [0, 2, 1, 3]].reshape(-1)
        expect(
            torch.equal(ref.long(), cf_marlin_scale_index(k_in // 16, n_out)),
            f"Marlin composite scale index n,k={n_out},{k_in}",
        )
    codes = torch.arange(1, 127, dtype=U8)
    for s in (0, 1, 3):
        ok = _e4m3_value(codes) * 2**s <= 448
        x = codes[ok].view(1, -1)
        x = torch.cat([x, torch.zeros(1, (-x.shape[1]) % 4, dtype=U8)], 1).view(E4M3)
        ref, _ = m4.nvfp4_marlin_process_scales(x.to(torch.bfloat16), scale_factor=float(2**s), a_dtype=torch.bfloat16)
        # undo the [0,2,1,3] column shuffle of the reference to compare per value
        ref = as_u8(ref).view(-1, 4)[:, [0, 2, 1, 3]].reshape(-1)
        expect(torch.equal(ref, cf_marlin_bytes(as_u8(x).reshape(-1), s, True)), f"Marlin scale byte map s={s}")
    log("ok  composite Marlin scale index; scale byte map for every positive e4m3 code, s in {0,1,3}")

    # canonical inputs deterministic
    a = make_nvfp4_canonical(2, 256, 64, 7)
    b = make_nvfp4_canonical(2, 256, 64, 7)
    expect(all(torch.equal(as_u8(a[k]), as_u8(b[k])) for k in NAMES), "make_nvfp4_canonical not deterministic")
    sc = as_u8(a["w13_weight_scale"])
    expect(
        int((sc == 0).sum()) == 0 and int((sc >= 0x7F).sum()) == 0 and int((sc < 8).sum()) > 0,
        "canonical scales: positive, finite, some subnormal",
    )
    log("ok  make_nvfp4_canonical deterministic; scales positive, finite, subnormals present")


# ============================================================================================
# writing
# ============================================================================================
def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(as_u8(t).reshape(-1).numpy().tobytes()).hexdigest()


DEFINITIONS = {
    "vllm-0.33": {
        "w13_input_scale": "a13 as held by the layer after conversion: global-SF backends "
        "(TRTLLM, FI_CUTLASS, CUTEDSL, CUTEDSL_BATCHED) amax over all experts and "
        "both halves, .repeat(E) -> [E] f32; VLLM_CUTLASS a13.max(dim=1) -> [E]",
        "w2_input_scale": "a2 likewise (global: amax .repeat(E); VLLM_CUTLASS unchanged [E])",
        "w13_weight_scale_2": "W4A4: folded in place by <experts>.process_weights_after_loading: "
        "w13_scale_2(gate) * w13_input_scale (one f32 multiply, order w*a) == "
        "g1_alphas. MARLIN: w13_scale_2 * 2^119 / sf13 (f32)",
        "w2_weight_scale_2": "W4A4: w2_scale_2 * w2_input_scale (folded) == g2_alphas. "
        "MARLIN: w2_scale_2 * 2^119 / sf2",
        "extra.a1_gscale": "quant config a1_gscale = 1.0 / w13_input_scale (computed before the fold)",
        "extra.a2_gscale": "quant config a2_gscale = 1.0 / w2_input_scale",
        "extra.g1_alphas": "quant config g1_alphas: the same storage as w13_weight_scale_2 (after the fold)",
        "extra.g2_alphas": "quant config g2_alphas: the same storage as w2_weight_scale_2",
        "extra.g1_scale_c": "TRTLLM only, layer param registered by process_weights_after_loading: "
        "g1_alphas * a2_gscale (gated); a2_gscale.clone() (non-gated)",
    },
    "vllm-0.15": {
        "w13_input_scale": "global-SF backends (TRTLLM, FI_CUTLASS, CUTEDSL): a13.max().float()"
        ".expand(E) (a stride-0 view: see views); VLLM_CUTLASS a13.max(dim=1)",
        "w2_input_scale": "a2.max().float().expand(E) (global) / unchanged (VLLM_CUTLASS)",
        "w13_weight_scale_2": "NOT folded: gate's w13_scale_2 [E] f32 unchanged. MARLIN: "
        "bf16(w13_scale_2) * 2^119 computed and stored in bfloat16",
        "w2_weight_scale_2": "NOT folded (W4A4). MARLIN: bf16(w2_scale_2) * 2^119 in bfloat16",
        "extra.a1_gscale": "1.0 / a13 (quant config; TRTLLM: layer.a1_gscale attribute)",
        "extra.a2_gscale": "1.0 / a2 (quant config; absent for TRTLLM)",
        "extra.g1_alphas": "a13 * w13_scale_2 (order a*w; quant config, TRTLLM: layer.g1_alphas)",
        "extra.g2_alphas": "a2 * w2_scale_2 (TRTLLM: layer.g2_alphas)",
        "extra.g1_scale_c": "TRTLLM only: layer.g1_scale_c = a13 * w13_scale_2 / a2 (true division)",
    },
}


def case_meta(c: dict, info: dict, ref_env: dict) -> dict:
    rev = c["revision"]
    stand_ins = [
        "layer: StandInRoutedExperts (nn.Module with the canonical tensors as Parameters; activation="
        + ("SILU" if c["gated"] else "RELU2_NO_MUL")
        + ", moe_config namespace, enable_eplb=False, "
        "params_dtype=bfloat16)",
        "torch.Tensor.cuda patched to identity (swizzle_blockscale ends with .cuda())",
        "flashinfer.nvfp4_block_scale_interleave (CUDA-only) -> flatten(vllm swizzle_blockscale(x))",
        "vllm._custom_ops.gptq_marlin_repack (compiled) -> marlin_utils_test.marlin_weights("
        "unpacked GPTQ view, size_k, size_n, 4, get_weight_perm(4))",
    ]
    if rev == "vllm-0.33":
        stand_ins.append(
            "experts self for process_weights_after_loading: SimpleNamespace(quant_config, "
            "moe_config, is_situ=False, no swiglu limit/alpha/beta)"
        )
    else:
        stand_ins.append("marlin_utils_fp4.marlin_make_workspace_new -> zeros (queries CUDA; not a weight)")
    # The "checkpoint", "orchestration" and "note" strings below are recorded verbatim in the committed
    # golden metadata (hashes.json and every shard header), so they stay as they were written; "§2.5"
    # there means "once the canonical tensors are built" (docs/checkpoints.md, "NVFP4 canonical tensors").
    meta = {
        "case": c["case"],
        "backend": c["backend"],
        "revision": rev,
        "shape_name": c["shape_name"],
        "E": c["E"],
        "K": c["K"],
        "N": c["N"],
        "gated": c["gated"],
        "is_act_and_mul": c["gated"],
        "activation": "SILU" if c["gated"] else "RELU2_NO_MUL",
        "w4a16": c["w4a16"],
        "params_dtype": "bfloat16",
        "seed": c["seed"],
        "tp": 1,
        "ep": 1,
        "checkpoint": "ModelOpt or compressed-tensors, after §2.5 (identical from here on)",
        "canonical_inputs": "tests/golden/nvfp4_inputs.py::make_nvfp4_canonical(E, K, N, seed, "
        "gated=gated, w4a16=w4a16)",
        "expected_error": info.get("expected_error"),
        "absent": info.get("absent", []),
        "moe_config_after": info.get("moe_config_after"),
        "definitions": DEFINITIONS[rev],
        "reference": {
            "mode": "real vLLM functions"
            + (" (vLLM 0.15.0 wheel, run in a worker subprocess)" if rev == "vllm-0.15" else ""),
            "vllm": info["vllm_version"],
            "flashinfer": info["flashinfer_version"],
            "functions": info.get("functions", []),
            "stand_ins": stand_ins,
            "orchestration": "the post-§2.5 part of ModelOptNvFp4FusedMoE.process_weights_after_loading "
            "re-enacted as the sequence of real calls listed in `functions`",
        },
        "views": info.get("views", {}),
        "generator": {"script": GENERATOR, **ref_env},
    }
    if rev == "vllm-0.15":
        meta["reference"]["note"] = (
            "vLLM 0.15.0 ~ the oracle page vllm_oracle_pages/002_* (its dispatcher and quant config "
            "are textually the page's; 0.15.0 additionally passes is_act_and_mul to "
            "prepare_nvfp4_moe_layer_for_marlin). 0.15 loaded ModelOpt w13 input_scale as one scalar "
            "for both halves; the canonical post-loading a13 halves differ here, which only feeds the max."
        )
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--check-only", action="store_true", help="run self-checks only")
    ap.add_argument("--no-large", action="store_true", help="skip the hash-only large cases")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-cases", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import vllm

        assert str(Path(vllm.__file__)).startswith(str(V015_PATH)) == (args.worker == "vllm-0.15"), (
            f"worker {args.worker} imported the wrong vllm: {vllm.__file__}"
        )
        return worker_main(args.worker, args.worker_cases, args.worker_out)

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import numpy
    import safetensors

    print(f"torch {torch.__version__}; refenv {REFENV}")
    selfcheck()
    ref_env = {"torch": torch.__version__, "numpy": numpy.__version__, "safetensors": safetensors.__version__}
    small = list(all_cases(large=False))
    large = [] if args.no_large else list(all_cases(large=True))
    results = {}
    for rev in ("vllm-0.33", "vllm-0.15"):
        for cases in (small, large):
            sel = [c for c in cases if c["revision"] == rev]
            for c, r in zip(sel, run_revision(rev, sel)):
                results[c["case"]] = r
    # determinism: recompute a few
    twice = [
        c
        for c in small
        if c["case"]
        in (
            "trtllm_v033_e2_k320_n64",
            "cutedsl_v033_e2_k256_n96",
            "marlin_v033_e2_k320_n64",
            "marlin_v015_e2_k256_n64",
            "trtllm_v015_e2_k256_n64",
        )
    ]
    for rev in ("vllm-0.33", "vllm-0.15"):
        sel = [c for c in twice if c["revision"] == rev]
        for c, (t2, _) in zip(sel, run_revision(rev, sel)):
            t1 = results[c["case"]][0]
            expect(
                sorted(t1) == sorted(t2) and all(torch.equal(as_u8(t1[k]), as_u8(t2[k])) for k in t1),
                f"{c['case']}: recomputation differs",
            )
    print(f"ok  recomputed {len(twice)} cases bit-identically")

    # every case vs the closed-form pipeline
    n_ok = 0
    for c in small + large:
        tensors, info = results[c["case"]]
        canon = make_nvfp4_canonical(c["E"], c["K"], c["N"], c["seed"], gated=c["gated"], w4a16=c["w4a16"])
        try:
            check_case_against_spec(c, canon, tensors, info)
            n_ok += 1
        except Disagreement as e:
            if c["case"] not in KNOWN_SPEC_DISAGREEMENTS:
                raise
            print(f"KNOWN DISAGREEMENT {c['case']}: {e}")
    print(f"ok  {n_ok}/{len(small) + len(large)} cases equal the closed-form pipeline (docs/layouts.md)")
    if args.check_only:
        return

    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.safetensors"):
        old.unlink()
    for c in small:
        tensors, info = results[c["case"]]
        canon = make_nvfp4_canonical(c["E"], c["K"], c["N"], c["seed"], gated=c["gated"], w4a16=c["w4a16"])
        out = {f"canonical.{k}": v.contiguous() for k, v in canon.items()}
        out.update(tensors)
        meta = case_meta(c, info, ref_env)
        path = args.out / f"{c['case']}.safetensors"
        save_file(out, str(path), metadata={"case": json.dumps(meta, sort_keys=True)})
        print(
            f"wrote {path.relative_to(REPO)} ({path.stat().st_size} B)"
            + (f"  expected_error {info['expected_error']['type']}" if info.get("expected_error") else "")
        )
    hashes = []
    for c in large:
        tensors, info = results[c["case"]]
        canon = make_nvfp4_canonical(c["E"], c["K"], c["N"], c["seed"], gated=c["gated"], w4a16=c["w4a16"])
        meta = case_meta(c, info, ref_env)
        meta["canonical_sha256"] = {k: sha256(v) for k, v in canon.items()}
        meta["outputs"] = {
            k: {"sha256": sha256(v), "dtype": dtype_name(v.dtype), "shape": list(v.shape)}
            for k, v in sorted(tensors.items())
        }
        for k, v in tensors.items():  # per-expert scalars: also the raw bytes, to show what differs
            if as_u8(v).numel() <= 64:
                meta["outputs"][k]["hex"] = as_u8(v).reshape(-1).numpy().tobytes().hex()
        hashes.append(meta)
        print(f"hashed {c['case']}")
    (args.out / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(small)} stored cases, {len(hashes)} hash-only cases, {total} bytes in {args.out}")


if __name__ == "__main__":
    main()
