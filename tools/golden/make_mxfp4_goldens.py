#!/usr/bin/env python3
"""Golden data for mxconvert's MXFP4 layouts, made by CALLING the reference libraries.

Run it with the reference environment's python (NOT the repo's .venv):

    .refenv/bin/python tools/golden/make_mxfp4_goldens.py            # writes tests/golden/mxfp4/
    .refenv/bin/python tools/golden/make_mxfp4_goldens.py --check-only   # self-checks only

How to (re)build .refenv in the repository root (CPU only, Python 3.11; every step is below):

    python3 -m venv .refenv
    .refenv/bin/pip install torch==2.13.0          # pinned: an unpinned torch pulls a CUDA build
    .refenv/bin/pip install numpy safetensors
    .refenv/bin/pip install --no-deps flashinfer-python==0.7.2.post1 apache-tvm-ffi requests nvidia-ml-py
    .refenv/bin/pip install --no-deps triton==3.9.0
    .refenv/bin/pip install packaging tqdm urllib3 idna certifi   # what `import flashinfer` still asks for
    pip download --no-deps vllm==0.33.0 -d /tmp/whl33             # vendors triton_kernels v3.5.1
    pip download --no-deps vllm==0.20.0 -d /tmp/whl20             # vendors triton_kernels v3.6.0
    for v in 33:tk_3_5_1 20:tk_3_6_0; do w=${v%%:*}; d=${v##*:}; mkdir -p /tmp/x$w .refenv/$d
      unzip -q -o /tmp/whl$w/vllm-*.whl 'vllm/third_party/triton_kernels/*' -d /tmp/x$w
      cp -r /tmp/x$w/vllm/third_party/triton_kernels .refenv/$d/; done

For the MARLIN / FLASHINFER_CUTLASS / AITER_MXFP4_BF16 cases (tools/golden/mxfp4_vllm_backends.py):

    .refenv/bin/pip install --no-deps /tmp/whl33/vllm-*.whl          # vLLM 0.33.0, no deps
    .refenv/bin/pip install --no-deps psutil pyzmq regex transformers huggingface_hub httpx2 httpcore2 \
        pyyaml truststore h11 pydantic pydantic_core typing_inspection annotated_types cbor2 tokenizers \
        sentencepiece aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist \
        openai_harmony openai sniffio anyio pillow pybase64 cachetools msgspec cloudpickle uvloop \
        py-cpuinfo prometheus_client xgrammar fastapi starlette annotated_doc opentelemetry-api \
        opentelemetry-sdk opentelemetry-semantic-conventions partial_json_parser llguidance einops
        # (what `import ...marlin_utils_test, ...marlin_utils_fp4, ...oracle.mxfp4` asks for; never torch)
    mkdir -p .refenv/vllm020 && unzip -p /tmp/whl20/vllm-*.whl \
        vllm/model_executor/layers/fused_moe/oracle/mxfp4.py > .refenv/vllm020/oracle_mxfp4.py
    pip download --no-deps --pre amd-aiter==0.1.7.post2.dev18 -d /tmp/aiter
    mkdir -p .refenv/aiter_0_1_7_post2_dev18 && unzip -o /tmp/aiter/amd_aiter-*.whl 'aiter/ops/shuffle.py' \
        -d .refenv/aiter_0_1_7_post2_dev18
    # FlashInfer's CUDA-only calls (FLASHINFER_CUTLASS cases) need one GPU run, see tests/golden/README.md:
    .refenv/bin/python tools/golden/make_mxfp4_goldens.py --prepare-device .whl   # inputs for the GPU
    #   ... run tools/golden/device_flashinfer.py on the GPU, put its outputs + .whl/fi_inputs.safetensors
    #   into .refenv/device_results/ ...

Both triton_kernels copies are used in one process: each is imported as the top-level package
`triton_kernels` with its folder first on sys.path, and its modules are swapped in and out of
sys.modules around every use (class TK).

What is called (nothing is re-implemented for the golden outputs themselves):
  * TRITON: triton_kernels.tensor.wrap_torch_tensor / convert_layout with the layout classes
    StridedLayout, HopperMXValueLayout(mx_axis=1), HopperMXScaleLayout(mx_axis=1, num_warps=8),
    BlackwellMXValueLayout, BlackwellMXScaleLayout, CDNA4MXScaleLayout, built directly (no
    capability-querying selector). vLLM's `_swizzle_mxfp4` wrapper decisions are re-enacted
    (0.33.0: Ks padded to a multiple of 4 on SM90 before the transpose, CDNA4 scales on gfx950 only
    at TP <= 2; 0.19/0.20: no pad, CDNA4 on every gfx950; SM90 with torch < 2.8.1: Strided/Strided).
  * FLASHINFER_TRTLLM: vLLM's converter steps (f32 biases, swap_every_two_rows, per-expert row
    shuffle with flashinfer.fused_moe.core.get_w2_permute_indices_with_cache(cache, x, 128
    [, num_elts_per_sf=16]), 128x4 block-scale interleave, stack/reshape/view(float8_e4m3fn)).
    flashinfer's nvfp4_block_scale_interleave is CUDA-only (JIT); it is replaced by the pure-torch
    128x4 swizzle shipped INSIDE flashinfer 0.7.2.post1:
    flashinfer.diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4 (cross-checked below against
    flashinfer.experimental.b12x.testing.reference.helpers.swizzle_block_scale_reference and
    the closed form of docs/layouts.md, "Shared moves").

  * MARLIN, FLASHINFER_CUTLASS_MXFP4_BF16/_MXFP8, AITER_MXFP4_BF16: vLLM's own converter
    convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (0.33.0 installed; 0.20.0 loaded from its wheel
    file), with only the GPU/ROCm-only calls replaced (see mxfp4_vllm_backends.py): gptq_marlin_repack
    -> vLLM's test reference marlin_utils_test.marlin_weights; FlashInfer's CUDA-only functions ->
    their outputs from a real GPU run (device_flashinfer.py); aiter.ops.shuffle -> the module file
    from the amd-aiter wheel.

The self-checks (closed forms of docs/layouts.md vs the reference outputs, determinism) run before any
file is written; any disagreement aborts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
REFENV = Path(os.environ.get("MXCONVERT_REFENV", REPO / ".refenv"))
OUT_DIR = REPO / "tests" / "golden" / "mxfp4"
sys.path.insert(0, str(REPO / "tests" / "golden"))
from canonical_inputs import NAMES, make_canonical  # noqa: E402

GENERATOR = "tools/golden/make_mxfp4_goldens.py"


def ru(a: int, b: int) -> int:
    return (a + b - 1) // b * b


# --------------------------------------------------------------------------------------------
# triton_kernels: two vendored copies in one process
# --------------------------------------------------------------------------------------------
class TK:
    """One vendored copy of triton_kernels, importable as `triton_kernels` inside `active()`."""

    def __init__(self, folder: Path, version: str, source: str):
        self.folder, self.version, self.source = str(folder), version, source
        self._mods: dict = {}
        with self.active():
            self.tensor = importlib.import_module("triton_kernels.tensor")
            self.layout = importlib.import_module("triton_kernels.tensor_details.layout")
            assert Path(self.tensor.__file__).is_relative_to(folder), self.tensor.__file__

    @staticmethod
    def _ours(k: str) -> bool:
        return k == "triton_kernels" or k.startswith("triton_kernels.")

    @contextlib.contextmanager
    def active(self):
        saved = {k: sys.modules.pop(k) for k in list(sys.modules) if self._ours(k)}
        sys.modules.update(self._mods)
        sys.path.insert(0, self.folder)
        try:
            yield self
        finally:
            sys.path.remove(self.folder)
            self._mods = {k: sys.modules.pop(k) for k in list(sys.modules) if self._ours(k)}
            sys.modules.update(saved)


_TK: dict[str, TK] = {}


def tk(version: str) -> TK:
    if version not in _TK:
        folder = {"3.5.1": "tk_3_5_1", "3.6.0": "tk_3_6_0"}[version]
        source = {
            "3.5.1": "vllm-0.33.0 wheel: vllm/third_party/triton_kernels (triton tag v3.5.1)",
            "3.6.0": "vllm-0.20.0 wheel: vllm/third_party/triton_kernels (triton tag v3.6.0)",
        }[version]
        _TK[version] = TK(REFENV / folder, version, source)
    return _TK[version]


# --------------------------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------------------------
TRITON_TK = {"vllm-0.33": "3.5.1", "vllm-0.20": "3.6.0"}


def cuda(cap, torch_new=True, tp=1):
    return {"platform": "cuda", "capability": list(cap), "torch_geq_2_8_1": torch_new, "tp": tp}


def rocm(gfx, tp=1):
    return {"platform": "rocm", "gfx": gfx, "tp": tp}


# (variant key, revision, target)
TRITON_VARIANTS = [
    ("sm90", "vllm-0.33", cuda((9, 0))),
    ("sm90-oldtorch", "vllm-0.33", cuda((9, 0), torch_new=False)),
    ("sm100", "vllm-0.33", cuda((10, 0))),
    ("gfx950-tp1", "vllm-0.33", rocm("gfx950", 1)),
    ("gfx950-tp4", "vllm-0.33", rocm("gfx950", 4)),
    ("gfx942", "vllm-0.33", rocm("gfx942", 1)),
    ("sm90", "vllm-0.20", cuda((9, 0))),
    ("sm90-oldtorch", "vllm-0.20", cuda((9, 0), torch_new=False)),
    ("sm100", "vllm-0.20", cuda((10, 0))),
    ("gfx950", "vllm-0.20", rocm("gfx950", 1)),
    ("gfx942", "vllm-0.20", rocm("gfx942", 1)),
]
TRTLLM_VARIANTS = [
    ("sm100", "vllm-0.33", cuda((10, 0))),
    ("sm100", "vllm-0.20", cuda((10, 0))),
]
_S3 = ("e2_h160_i160", "e1_h96_i96", "e1_h256_i256")
# Backends made by calling vLLM's own converter (tools/golden/mxfp4_vllm_backends.py):
# (backend, case prefix, variant key, revision, target, small shapes). 0.20 duplicates whose bytes
# equal the 0.33 case (same code) get only the padded small shape (size budget).
VLLM_VARIANTS = [
    ("FLASHINFER_CUTLASS_MXFP4_BF16", "cutlass-bf16", "sm90", "vllm-0.33", cuda((9, 0)), _S3),
    ("FLASHINFER_CUTLASS_MXFP4_BF16", "cutlass-bf16", "sm90", "vllm-0.20", cuda((9, 0)), _S3),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "cutlass-mxfp8", "sm100", "vllm-0.33", cuda((10, 0)), _S3),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "cutlass-mxfp8", "sm100", "vllm-0.20", cuda((10, 0)), _S3[:1]),
    ("MARLIN", "marlin", "sm80", "vllm-0.33", dict(cuda((8, 0)), marlin_input_dtype=None), _S3),
    ("MARLIN", "marlin", "sm89-fp8", "vllm-0.33", dict(cuda((8, 9)), marlin_input_dtype="fp8"), _S3),
    ("MARLIN", "marlin", "sm80", "vllm-0.20", dict(cuda((8, 0)), marlin_input_dtype=None), _S3[:1]),
    ("MARLIN", "marlin", "sm89-fp8", "vllm-0.20", dict(cuda((8, 9)), marlin_input_dtype="fp8"), _S3[:1]),
    (
        "AITER_MXFP4_BF16",
        "aiter",
        "gfx950",
        "vllm-0.33",
        dict(rocm("gfx950"), rocm_use_aiter=True),
        ("e2_h160_i160", "e1_h256_i256"),
    ),  # ROCm pads 96 and 160 alike to 256
    ("AITER_MXFP4_BF16", "aiter", "gfx950", "vllm-0.20", dict(rocm("gfx950"), rocm_use_aiter=True), ("e2_h160_i160",)),
]
VLLM_BACKENDS = {v[0] for v in VLLM_VARIANTS}


def padded_sizes(backend: str, revision: str, target: dict, H: int, I: int) -> tuple[int, int]:
    """(Hp, Ip): vLLM's mxfp4_round_up_hidden_size_and_intermediate_size for GPT-OSS (activation=None),
    0.33.0 and 0.19/0.20 tables (docs/checkpoints.md, "GPT-OSS MXFP4 canonical tensors")."""
    if backend == "TRITON":
        if target["platform"] == "rocm":
            return ru(H, 256), ru(I, 256)
        return H, ru(I, 64)
    if backend == "FLASHINFER_TRTLLM_MXFP4_BF16":
        return ru(H, 256), ru(I, 128 if revision == "vllm-0.33" else 256)
    if backend in ("FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"):
        return ru(H, 128), ru(I, 128)  # both revisions
    if backend == "MARLIN":
        return ru(H, 256), ru(I, 128)  # CUDA; both revisions
    if backend == "AITER_MXFP4_BF16":
        return ru(H, 256), ru(I, 256)  # ROCm, activation=None; both revisions
    raise ValueError(backend)


# --------------------------------------------------------------------------------------------
# TRITON: vLLM `_swizzle_mxfp4` decisions + triton_kernels calls
# --------------------------------------------------------------------------------------------
def triton_decisions(revision: str, target: dict, num_warps: int = 8):
    """Return (value cls name, value kwargs, scale cls name, scale kwargs, pad_ks4, opt_flags)
    exactly as vLLM's _swizzle_mxfp4 of `revision` would pick them on `target`."""
    plat = target["platform"]
    cap = tuple(target.get("capability", ()))
    if plat == "cuda" and cap == (9, 0) and not target["torch_geq_2_8_1"]:
        v, vk, s, sk = "StridedLayout", {}, "StridedLayout", {}
    elif plat == "rocm":
        v, vk = "StridedLayout", {}
        gfx950 = target["gfx"] == "gfx950"
        use_cdna4 = gfx950 and (target["tp"] <= 2 if revision == "vllm-0.33" else True)
        # v3.5.1 and v3.6.0 have no GFX950MXScaleLayout: vLLM's ImportError fallback -> CDNA4
        s, sk = ("CDNA4MXScaleLayout", {}) if use_cdna4 else ("StridedLayout", {})
    else:  # make_default_matmul_mxfp4_w[_scale]_layout(mx_axis=1[, num_warps]) on this capability
        if cap >= (10, 0):
            v, vk, s, sk = "BlackwellMXValueLayout", {}, "BlackwellMXScaleLayout", {}
        elif cap >= (9, 0):
            v, vk = "HopperMXValueLayout", {"mx_axis": 1}
            s, sk = "HopperMXScaleLayout", {"mx_axis": 1, "num_warps": num_warps}
        else:
            v, vk, s, sk = "StridedLayout", {}, "StridedLayout", {}
    pad_ks4 = revision == "vllm-0.33" and plat == "cuda" and cap == (9, 0)
    opt = {}
    if plat == "cuda":
        if cap == (9, 0):
            opt = {"split_k": 1}
        elif cap[0] == 10 or (revision == "vllm-0.33" and cap[0] == 12):
            opt = {"is_persistent": True, "epilogue_subtile": 1}
    return v, vk, s, sk, pad_ks4, opt


def triton_swizzle(t: TK, W: torch.Tensor, S: torch.Tensor, dec):
    """One `_swizzle_mxfp4(W, S)` call. Returns (value Tensor, scale Tensor, info)."""
    v, vk, s, sk, pad_ks4, _ = dec
    if pad_ks4 and S.numel() > 0:
        S = F.pad(S, (0, -S.shape[-1] % 4))
    Wt = W.transpose(-2, -1)
    St = S.transpose(-2, -1)
    with t.active():
        T, L = t.tensor, t.layout
        wv = T.wrap_torch_tensor(Wt, dtype=T.FP4)
        ws = T.wrap_torch_tensor(St)
        v_init, s_init = list(wv.storage.data.shape), list(ws.storage.data.shape)
        qv = T.convert_layout(wv, getattr(L, v), **vk)
        qs = T.convert_layout(ws, getattr(L, s), **sk)
    info = {
        "value": {
            "layout": v,
            "layout_kwargs": vk,
            "layout_name": qv.storage.layout.name,
            "layout_init_shape": v_init,
            "logical_dtype": "FP4",
            "logical_shape": [int(x) for x in qv.shape],
        },
        "scale": {
            "layout": s,
            "layout_kwargs": sk,
            "layout_name": qs.storage.layout.name,
            "layout_init_shape": s_init,
            "logical_dtype": "uint8",
            "logical_shape": [int(x) for x in qs.shape],
        },
    }
    if v == "HopperMXValueLayout":
        info["value"]["layout_kwargs"] = dict(vk, mma_version=qv.storage.layout.mma_version)
    return qv.storage.data, qs.storage.data, info


def run_triton(canon: dict, revision: str, target: dict):
    t = tk(TRITON_TK[revision])
    dec = triton_decisions(revision, target)
    w13, s13, i13 = triton_swizzle(t, canon["w13_weight"], canon["w13_weight_scale"], dec)
    w2, s2, i2 = triton_swizzle(t, canon["w2_weight"], canon["w2_weight_scale"], dec)
    outs = {
        "w13_weight": w13,
        "w13_weight_scale": s13,
        "w13_bias": canon["w13_bias"].to(torch.float32),
        "w2_weight": w2,
        "w2_weight_scale": s2,
        "w2_bias": canon["w2_bias"].to(torch.float32),
    }
    extra = {
        "w13_weight": i13["value"],
        "w13_weight_scale": i13["scale"],
        "w2_weight": i2["value"],
        "w2_weight_scale": i2["scale"],
    }
    meta = {
        "layouts": {k: extra[k]["layout"] for k in extra} | {"w13_bias": None, "w2_bias": None},
        "num_warps": 8,
        "scale_ks_padded_to_4": dec[4],
        "opt_flags_constraints": dec[5],
        "reference": {
            "library": "triton_kernels",
            "version": t.version,
            "source": t.source,
            "functions": [
                "triton_kernels.tensor.wrap_torch_tensor",
                "triton_kernels.tensor.convert_layout",
                f"triton_kernels.tensor_details.layout.{dec[0]}",
                f"triton_kernels.tensor_details.layout.{dec[2]}",
            ],
            "wrapper": (
                "vllm 0.33.0 mxfp4_utils._swizzle_mxfp4 (decisions re-enacted)"
                if revision == "vllm-0.33"
                else "vllm 0.19.0/0.20.0 mxfp4_utils._swizzle_mxfp4 (decisions re-enacted)"
            ),
            "bias": "tensor.to(torch.float32)",
        },
    }
    return outs, extra, meta


# --------------------------------------------------------------------------------------------
# FLASHINFER_TRTLLM: vLLM converter steps with flashinfer functions
# --------------------------------------------------------------------------------------------
def _fi():
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4
    from flashinfer.fused_moe.core import get_w2_permute_indices_with_cache

    return get_w2_permute_indices_with_cache, _swizzle_sf_128x4


def _swap_every_two_rows(x: torch.Tensor, axis: int) -> torch.Tensor:
    # vLLM converter's local helper (a reshape / flip / reshape), same semantics
    shape = list(x.shape)
    axis = axis % len(shape)
    new = shape[:axis] + [shape[axis] // 2, 2] + shape[axis + 1 :]
    return x.reshape(new).flip(axis + 1).reshape(shape)


def run_trtllm(canon: dict, revision: str, target: dict):
    get_perm, swz128x4 = _fi()
    import flashinfer

    w13 = canon["w13_weight"]
    w2 = canon["w2_weight"]
    s13 = canon["w13_weight_scale"]
    s2 = canon["w2_weight_scale"]
    b13 = canon["w13_bias"].to(torch.float32)
    b2 = canon["w2_bias"].to(torch.float32)
    E = w13.shape[0]
    I = w13.shape[1] // 2  # noqa: E741  (padded sizes, as the converter reads them)
    H = w13.shape[2] * 2
    s13 = _swap_every_two_rows(s13, -2)
    w13 = _swap_every_two_rows(w13, -2)
    b13 = _swap_every_two_rows(b13, -1)
    cache: dict = {}
    g1w, g1s, g1b, g2w, g2s, g2b = [], [], [], [], [], []
    tile = 128
    for i in range(E):
        p = get_perm(cache, w13[i].view(torch.uint8), tile)
        g1w.append(w13[i].view(torch.uint8)[p].contiguous())
        p = get_perm(cache, s13[i].view(torch.uint8), tile, num_elts_per_sf=16)
        g1s.append(swz128x4(s13[i].view(torch.uint8)[p].contiguous()))
        p = get_perm(cache, b13[i].clone().reshape(-1, 1), tile)
        g1b.append(b13[i].clone().reshape(-1, 1)[p].contiguous())
        p = get_perm(cache, w2[i].view(torch.uint8), tile)
        g2w.append(w2[i].view(torch.uint8)[p].contiguous())
        p = get_perm(cache, s2[i].view(torch.uint8), tile, num_elts_per_sf=16)
        g2s.append(swz128x4(s2[i].view(torch.uint8)[p].contiguous()))
        p = get_perm(cache, b2[i].clone().reshape(-1, 1), tile)
        g2b.append(b2[i].clone().reshape(-1, 1)[p].contiguous())
    outs = {
        "w13_weight": torch.stack(g1w),
        "w13_weight_scale": torch.stack(g1s).reshape(E, 2 * I, H // 32).view(torch.float8_e4m3fn),
        "w13_bias": torch.stack(g1b).reshape(E, -1),
        "w2_weight": torch.stack(g2w),
        "w2_weight_scale": torch.stack(g2s).reshape(E, H, I // 32).view(torch.float8_e4m3fn),
        "w2_bias": torch.stack(g2b).reshape(E, -1),
    }
    meta = {
        "layouts": {k: None for k in NAMES},
        "num_warps": None,
        "epilogue_tile_m": tile,
        "same_weights_as": ["FLASHINFER_TRTLLM_MXFP4_MXFP8"],
        "reference": {
            "library": "flashinfer-python",
            "version": flashinfer.__version__,
            "functions": [
                "flashinfer.fused_moe.core.get_w2_permute_indices_with_cache(cache, x, 128) "
                "(weights, biases) / (..., num_elts_per_sf=16) (scales)",
                "flashinfer.diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4 (pure-torch 128x4 "
                "block-scale interleave shipped in flashinfer; stands in for the CUDA-only "
                "flashinfer.fp4_quantization.nvfp4_block_scale_interleave)",
            ],
            "wrapper": (
                "vllm convert_gpt_oss_weight_to_mxfp4_moe_kernel_format, TRTLLM branch "
                "(0.33.0 and 0.20.0 are textually identical), steps re-enacted"
            ),
            # Recorded verbatim in the committed golden metadata: "reference_env.md" was the reference
            # environment's install notes, which are not part of this repository.
            "note": (
                "vLLM 0.20.0 pinned flashinfer 0.6.8.post1; 0.7.2.post1 is used for both "
                "revisions (same permutation and 128x4 swizzle per reference_env.md)"
            ),
        },
    }
    return outs, {}, meta


# --------------------------------------------------------------------------------------------
# MARLIN, FLASHINFER_CUTLASS_*, AITER_MXFP4_BF16: vLLM's own converter (mxfp4_vllm_backends.py)
# --------------------------------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mxfp4_vllm_backends as MB  # noqa: E402

DEVICE_DIR = Path(os.environ.get("MXCONVERT_DEVICE_RESULTS", REFENV / "device_results"))
DEVICE_MANIFEST = Path(__file__).resolve().parent / "device_results.json"
_STATE: dict = {"refs": None, "cuda": None, "device": None}


def refs() -> MB.Refs:
    if _STATE["refs"] is None:
        _STATE["refs"] = MB.Refs(REFENV)
    return _STATE["refs"]


def load_device_results(folder: Path) -> tuple[dict, dict]:
    """The GPU outputs (fi_out_*.safetensors), their inputs (as 'in.<key>') and fi_report.json."""
    from safetensors.torch import load_file

    results: dict = {}
    for f in sorted(folder.glob("fi_out_*.safetensors")):
        results.update(load_file(str(f)))
    results.update({"in." + k: v for k, v in load_file(str(folder / "fi_inputs.safetensors")).items()})
    report = json.loads((folder / "fi_report.json").read_text())
    return results, report


def device_info(report: dict) -> dict:
    return {
        k: report.get(k) for k in ("gpu", "capability", "torch", "torch_cuda", "flashinfer", "flashinfer_git_commit")
    } | {
        "nvcc": next((ln.strip() for ln in (report.get("nvcc") or "").splitlines() if "release" in ln), None),
        "jit": [{"step": s["step"], "ok": s["ok"], "seconds": s["seconds"]} for s in report["steps"]],
        "script": "tools/golden/device_flashinfer.py",
    }


SM90_WEIGHT_REF = (
    "FlashInfer 0.7.2.post1 kernel interleave_fp4_weights_for_sm90_mixed_gemm_kernel (wheel's "
    "data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu, "
    "compiled unmodified by FlashInfer's JIT with its sm90a flags, run on a GPU); entry point "
    "tools/golden/fi_sm90_interleave_binding.cu = the per-expert loop of flashinfer's "
    "interleave_moe_weights_for_sm90_mixed_gemm binding (quant_type fp4). The public Python API "
    "needs the whole fused_moe_90 JIT module (220 generated CUTLASS files), not buildable in one "
    "10-minute device call."
)
BSI_REF = (
    "flashinfer.block_scale_interleave 0.7.2.post1 (public API; its JIT module fp4_quantization_90 "
    "built by FlashInfer on the GPU machine and run there)"
)


def run_vllm(canon: dict, backend: str, rev: str, tgt: dict):
    outs, info = MB.run_vllm_converter(refs(), _STATE["cuda"], backend, rev, tgt, canon)
    r = refs()
    vinfo = (
        {
            "version": "0.33.0",
            "commit": "g4ba787ec9",
            "source": "vllm-0.33.0 PyPI wheel, installed --no-deps in .refenv",
        }
        if rev == "vllm-0.33"
        else {
            "version": "0.20.0",
            "commit": "gb8160878f",
            "source": (
                "vllm-0.20.0 PyPI wheel: vllm/model_executor/layers/fused_moe/oracle/mxfp4.py "
                "loaded as a file; its helper imports resolve against vllm 0.33.0 (Marlin/AITER "
                "helpers identical in 0.20.0 apart from the repack-loop refactor)"
            ),
        }
    )
    ref = {
        "converter": {
            "function": "vllm.model_executor.layers.fused_moe.oracle.mxfp4."
            "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format",
            "backend_enum": info["enum"],
            "layer": "params_dtype=torch.bfloat16",
            **vinfo,
        },
        "substituted": {},
    }
    meta: dict = {"layouts": {k: None for k in NAMES}, "num_warps": None, "stored_dtypes_are_kernel_dtypes": True}
    if backend.startswith("FLASHINFER_CUTLASS"):
        ref["library"] = "flashinfer-python"
        ref["version"] = "0.7.2.post1"
        # Recorded verbatim in the golden metadata (see the TRTLLM "note" above).
        ref["note_version"] = (
            "vLLM 0.20.0 pinned flashinfer 0.6.8.post1; 0.7.2.post1 is used for both "
            "revisions (block_scale_interleave: same 128x4 bytes per reference_env.md)"
        )
        if backend.endswith("MXFP8"):
            ref["substituted"]["flashinfer.block_scale_interleave"] = BSI_REF
            meta["same_layout_as"] = "C3 (both revisions identical code)"
        elif rev == "vllm-0.33":
            ref["substituted"]["flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm"] = SM90_WEIGHT_REF
            ref["cpu"] = ["flashinfer.fused_moe.interleave_moe_scales_for_sm90_mixed_gemm (group_size=32)"]
        else:
            ref["cpu"] = [
                "vLLM 0.20.0's nested _interleave_mxfp4_cutlass_sm90 (runs inside the 0.20 "
                "converter); weights not interleaved"
            ]
        if _STATE["device"] and ref["substituted"]:
            ref["gpu_run"] = device_info(_STATE["device"])
    elif backend == "MARLIN":
        a8 = tgt.get("marlin_input_dtype") == "fp8"
        meta["marlin_input_dtype"] = "float8_e4m3fn" if a8 else None
        meta["is_a_8bit"] = a8
        ref["substituted"]["vllm._custom_ops.gptq_marlin_repack"] = (
            "vllm.model_executor.layers.quantization.utils.marlin_utils_test.marlin_weights(q_w, size_k, "
            "size_n, 4, get_weight_perm(4, is_a_8bit), is_a_8bit) on the unpacked GPTQ nibbles (vLLM's "
            "test reference, held equal to the CUDA op by vLLM's tests); vllm 0.33.0"
        )
        ref["substituted"]["get_marlin_input_dtype"] = (
            "torch.float8_e4m3fn (VLLM_MARLIN_INPUT_DTYPE=fp8 on SM89/SM12x)" if a8 else "None (16-bit activations)"
        )
        ref["cpu"] = ["marlin_permute_scales", "mxfp4_marlin_process_scales", "marlin_permute_bias"]
    elif backend == "AITER_MXFP4_BF16":
        meta["revision_backend_name"] = "AITER" if rev == "vllm-0.20" else "AITER_MXFP4_BF16"
        meta["is_shuffled"] = info["is_shuffled"]
        ref["aiter"] = r.aiter_info()
        ref["substituted"]["aiter.ops.shuffle"] = "module file from the amd-aiter wheel (see aiter)"
        ref["cpu"] = [
            "rocm_aiter_ops.shuffle_weight_a16w4(w, 16, gate_up)",
            "rocm_aiter_ops.shuffle_scale_a16w4(s.view(-1, Ks), E, gate_up)",
        ]
    meta["reference"] = ref
    meta["storage"] = (
        "every kernel.* tensor is stored in the dtype the kernel holds (safetensors 0.8.0 "
        "stores torch.float4_e2m1fn_x2 and torch.float8_e8m0fnu natively); nothing relabelled"
    )
    extra = {k: {"kernel_dtype": str(outs[k].dtype).replace("torch.", "")} for k in NAMES}
    return outs, extra, meta


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------
SMALL_SHAPES = {  # name: (E, H, I)
    "e2_h160_i160": (2, 160, 160),  # padding everywhere; Ks=5 (odd, not a multiple of 4)
    "e1_h96_i96": (1, 96, 96),  # tiny odd-ish: Ks=3; CUDA Ip 96->128
    "e1_h256_i256": (1, 256, 256),  # aligned for every layout (no padding anywhere)
}
LARGE_SHAPES = {
    "e1_h2880_i2880": (1, 2880, 2880, 1),  # gpt-oss, TP=1
    "e1_h2880_i736": (1, 2880, 736, 4),  # gpt-oss, TP=4 rank 0 (I_r = 736)
}
SEED = {"e2_h160_i160": 1601, "e1_h96_i96": 961, "e1_h256_i256": 2561, "e1_h2880_i2880": 28801, "e1_h2880_i736": 7361}


def all_cases(large: bool):
    """Yield (case name, backend, revision, target, shape name, E, H, I)."""

    def variants():
        for key, rev, tgt in TRITON_VARIANTS:
            yield "TRITON", "triton", key, rev, tgt
        for key, rev, tgt in TRTLLM_VARIANTS:
            yield "FLASHINFER_TRTLLM_MXFP4_BF16", "trtllm", key, rev, tgt

    if not large:
        for sname, (E, H, I) in SMALL_SHAPES.items():
            for backend, short, key, rev, tgt in variants():
                if sname == "e1_h96_i96" and tgt["platform"] == "rocm":
                    continue  # ROCm pads 96 and 160 alike to 256: e2_h160_i160 covers it (size budget)
                name = f"{short}_{rev.replace('vllm-0.', 'v0')}_{key}_{sname}"
                yield name, backend, rev, dict(tgt), sname, E, H, I
    else:
        for sname, (E, H, I, tp) in LARGE_SHAPES.items():
            for backend, short, key, rev, tgt in variants():
                # the TP gate: only the variant matching this shape's TP is meaningful
                if (
                    tgt["platform"] == "rocm"
                    and tgt["gfx"] == "gfx950"
                    and rev == "vllm-0.33"
                    and (tp <= 2) != (tgt["tp"] <= 2)
                ):
                    continue
                tgt = dict(tgt, tp=tp)
                key2 = key.split("-tp")[0] + (f"-tp{tp}" if "-tp" in key else "")
                name = f"{short}_{rev.replace('vllm-0.', 'v0')}_{key2}_{sname}"
                yield name, backend, rev, tgt, sname, E, H, I
    yield from vllm_cases(large)


def vllm_cases(large: bool):
    """The MARLIN / FLASHINFER_CUTLASS / AITER cases (made by calling vLLM's converters)."""
    if not large:
        for sname, (E, H, I) in SMALL_SHAPES.items():
            for backend, short, key, rev, tgt, shapes in VLLM_VARIANTS:
                if sname in shapes:
                    name = f"{short}_{rev.replace('vllm-0.', 'v0')}_{key}_{sname}"
                    yield name, backend, rev, dict(tgt), sname, E, H, I
    else:
        for sname, (E, H, I, tp) in LARGE_SHAPES.items():
            for backend, short, key, rev, tgt, _ in VLLM_VARIANTS:
                name = f"{short}_{rev.replace('vllm-0.', 'v0')}_{key}_{sname}"
                yield name, backend, rev, dict(tgt, tp=tp), sname, E, H, I


def memory_order(t: torch.Tensor):
    """(dense buffer in memory order, perm) with buffer = t.permute(perm).contiguous()."""
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    p = t.permute(perm)
    return p.contiguous(), perm


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def sha256(t: torch.Tensor) -> str:
    t = t.contiguous().reshape(-1)
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def build_case(name, backend, rev, tgt, sname, E, H, I):
    Hp, Ip = padded_sizes(backend, rev, tgt, H, I)
    canon = make_canonical(E, H, I, Hp, Ip, SEED[sname])
    if backend == "TRITON":
        outs, extra, meta = run_triton(canon, rev, tgt)
    elif backend in VLLM_BACKENDS:
        outs, extra, meta = run_vllm(canon, backend, rev, tgt)
    else:
        outs, extra, meta = run_trtllm(canon, rev, tgt)
    views, buffers = {}, {}
    for k in NAMES:
        t = outs[k]
        buf, perm = memory_order(t)
        v = {
            "dtype": dtype_name(t.dtype),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "memory_perm": perm,
            "view_is_dense": bool(t.permute(perm).is_contiguous()),
        }
        v.update(extra.get(k, {}))
        views[k] = v
        buffers[k] = buf.clone()  # never share memory with the inputs (Strided is a pure view)
    meta = {
        "case": name,
        "backend": backend,
        "revision": rev,
        "target": tgt,
        "E": E,
        "H": H,
        "I": I,
        "Hp": Hp,
        "Ip": Ip,
        "seed": SEED[sname],
        "shape_name": sname,
        "canonical_inputs": "tests/golden/canonical_inputs.py::make_canonical(E, H, I, Hp, Ip, seed)",
        **meta,
        "views": views,
        "generator": {
            "script": GENERATOR,
            "torch": torch.__version__,
            "triton": importlib.import_module("triton").__version__,
        },
    }
    return canon, buffers, meta


def hash_entry(canon, buffers, meta):
    return {
        **meta,
        "canonical_sha256": {k: sha256(canon[k]) for k in NAMES},
        "outputs": {
            k: {"sha256": sha256(b), "dtype": dtype_name(b.dtype), "shape": list(b.shape), "views": meta["views"][k]}
            for k, b in buffers.items()
        },
    }


# --------------------------------------------------------------------------------------------
# self-checks: closed forms (docs/layouts.md) vs the reference
# --------------------------------------------------------------------------------------------
class Disagreement(AssertionError):
    pass


def expect(cond, msg):
    if not cond:
        raise Disagreement(msg)


def same(a: torch.Tensor, b: torch.Tensor, what: str):
    expect(a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}")
    expect(list(a.shape) == list(b.shape), f"{what}: shape {list(a.shape)} != {list(b.shape)}")
    expect(list(a.stride()) == list(b.stride()), f"{what}: stride {a.stride()} != {b.stride()}")
    ua = a.contiguous().view(torch.uint8) if a.dtype != torch.uint8 else a
    ub = b.contiguous().view(torch.uint8) if b.dtype != torch.uint8 else b
    expect(torch.equal(ua, ub), f"{what}: values differ")


def cf_perm(M):
    n = torch.arange(M)
    return 32 * (n // 32) + 4 * (n % 8) + (n % 32) // 8


def cf_swz128x4(S):
    """128x4 block-scale swizzle (docs/layouts.md "Shared moves"):
    out[((m//128)*(Kp//4) + k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + k%4]."""
    M, K = S.shape
    Mp, Kp = ru(M, 128), ru(K, 4)
    out = torch.zeros(Mp * Kp, dtype=S.dtype)
    m = torch.arange(M)[:, None]
    k = torch.arange(K)[None, :]
    off = ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    out[off.reshape(-1)] = S.reshape(-1)
    return out


def cf_pack(O: torch.Tensor) -> torch.Tensor:
    """Hopper fp4 packing (docs/layouts.md "Hopper fp4 packing") over consecutive 4-byte groups of the
    last dim (uint8 in, uint8 out)."""
    g = O.reshape(*O.shape[:-1], -1, 4).to(torch.int64)
    b0, b1, b2, b3 = g.unbind(-1)
    C = lambda x: ((x & 8) << 12) | ((x & 7) << 6)  # noqa: E731
    Fb = lambda x: ((x & 8) << 11) | ((x & 6) << 9) | ((x & 1) << 13)  # noqa: E731
    lane = lambda f, b: f(b & 0xF) | (f(b >> 4) << 16)  # noqa: E731
    M32 = 0xFFFFFFFF
    w = (lane(C, b0) | ((lane(C, b1) & M32) >> 3) | ((lane(C, b2) & M32) >> 6) | lane(Fb, b3)) & M32
    out = torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8)
    return out.reshape(O.shape)


def cf_triton(W, S, lay_v, lay_s, tkver, pad_ks4):
    """Closed forms of the triton_kernels v3.5.1 / v3.6.0 layouts (docs/layouts.md "TRITON") for one _swizzle_mxfp4."""
    E, N, Kb = W.shape
    if pad_ks4:
        S = F.pad(S, (0, -S.shape[-1] % 4))
    Ks = S.shape[-1]
    # values
    if lay_v == "StridedLayout":
        v = W.transpose(-2, -1)
    elif lay_v == "BlackwellMXValueLayout":
        v = F.pad(W, (0, ru(Kb, 128) - Kb)).mT
    elif lay_v == "HopperMXValueLayout":
        pn, pk = (16, 32) if tkver == "3.5.1" else (64, 64)
        Np, Kbp = ru(N, pn), ru(Kb, pk)
        D = torch.zeros(E, Np, Kbp, dtype=torch.uint8)
        D[:, :N, :Kb] = W
        m = torch.arange(Np)[:, None]
        kb = torch.arange(Kbp)[None, :]
        a, w0, t0, s0 = m // 16, (m % 16) // 8, (m % 8) // 2, m % 2
        b, k1, w1, t1 = kb // 32, (kb % 32) // 8, (kb % 8) // 4, kb % 4
        row = (4 * a + t0).expand(Np, Kbp)
        col = 128 * b + 64 * s0 + 16 * t1 + 4 * k1 + 2 * w1 + w0
        O = torch.zeros(E, Np // 4, 4 * Kbp, dtype=torch.uint8)
        O[:, row.reshape(-1), col.reshape(-1)] = D.reshape(E, -1)
        v = cf_pack(O).mT
    else:
        raise ValueError(lay_v)
    # scales
    if lay_s == "StridedLayout":
        s = S.transpose(-2, -1)
    elif lay_s == "HopperMXScaleLayout":
        Np, Ksp = ru(N, 256), ru(Ks, 2)
        A = torch.zeros(E, Np, Ksp, dtype=torch.uint8)
        A[:, :N, :Ks] = S
        n = torch.arange(Np)[:, None]
        k = torch.arange(Ksp)[None, :]
        n2, a, wp, b, c = n // 256, (n % 256) // 128, (n % 128) // 16, (n % 16) // 8, n % 8
        k2, d = k // 2, k % 2
        row = (8 * n2 + wp).expand(Np, Ksp)
        col = 64 * k2 + 32 * a + 4 * c + 2 * d + b
        O = torch.zeros(E, Np // 32, 32 * Ksp, dtype=torch.uint8)
        O[:, row.reshape(-1), col.reshape(-1)] = A.reshape(E, -1)
        s = O.mT
    elif lay_s == "BlackwellMXScaleLayout":
        Np, Kp = ru(N, 128), ru(Ks, 8)
        out = torch.zeros(E * Np * Kp, dtype=torch.uint8)
        e = torch.arange(E)[:, None, None]
        n = torch.arange(N)[None, :, None]
        k = torch.arange(Ks)[None, None, :]
        off = ((e * (Np // 128) + n // 128) * (Kp // 4) + k // 4) * 512 + (n % 32) * 16 + ((n % 128) // 32) * 4 + k % 4
        out[off.reshape(-1)] = S.reshape(-1)
        s = out.reshape(1, E * Np // 128, Kp // 4, 2, 256)
    elif lay_s == "CDNA4MXScaleLayout":
        expect(N % 32 == 0 and Ks % 8 == 0, "CDNA4 needs N%32==0, Ks%8==0")
        n = torch.arange(N)[:, None]
        k = torch.arange(Ks)[None, :]
        row = (n // 32).expand(N, Ks)
        col = 256 * (k // 8) + 64 * (k % 4) + 4 * (n % 16) + 2 * ((k % 8) // 4) + (n % 32) // 16
        O = torch.zeros(E, N // 32, 32 * Ks, dtype=torch.uint8)
        O[:, row.reshape(-1), col.reshape(-1)] = S.reshape(E, -1)
        s = O.transpose(-1, -2)
    else:
        raise ValueError(lay_s)
    return v, s


def cf_trtllm(canon):
    sw = lambda x, d: x.unflatten(d, (-1, 2)).flip(d + 1).flatten(d, d + 1)  # noqa: E731
    W13, S13, B13 = sw(canon["w13_weight"], 1), sw(canon["w13_weight_scale"], 1), sw(canon["w13_bias"].float(), 1)
    W2, S2, B2 = canon["w2_weight"], canon["w2_weight_scale"], canon["w2_bias"].float()
    p13, p2 = cf_perm(W13.shape[1]), cf_perm(W2.shape[1])
    E = W13.shape[0]
    swz = lambda S, p: torch.stack([cf_swz128x4(S[e][p]) for e in range(E)]).reshape(S.shape)  # noqa: E731
    return {
        "w13_weight": W13[:, p13].contiguous(),
        "w13_weight_scale": swz(S13, p13).view(torch.float8_e4m3fn),
        "w13_bias": B13[:, p13].contiguous(),
        "w2_weight": W2[:, p2].contiguous(),
        "w2_weight_scale": swz(S2, p2).view(torch.float8_e4m3fn),
        "w2_bias": B2[:, p2].contiguous(),
    }


def selfcheck(log=print):
    from flashinfer.experimental.b12x.testing.reference.helpers import swizzle_block_scale_reference
    from flashinfer.utils import get_shuffle_matrix_a_row_indices, get_shuffle_matrix_sf_a_row_indices

    get_perm, swz = _fi()
    g = torch.Generator().manual_seed(0)

    # 1. TRTLLM row permutation
    for M in (128, 256, 5888, 6144):
        x = torch.zeros(M, 3, dtype=torch.uint8)
        ref = get_perm({}, x, 128)
        expect(torch.equal(ref, cf_perm(M)), f"perm closed form != flashinfer for M={M}")
        expect(torch.equal(get_shuffle_matrix_a_row_indices(x, 128), ref), "perm variants differ")
        expect(torch.equal(get_shuffle_matrix_sf_a_row_indices(x, 128, 16), ref), "sf perm differs")
        expect(torch.equal(get_perm({}, x, 128, num_elts_per_sf=16), ref), "sf perm (cached) differs")
    log("ok  TRTLLM perm[n] = 32*(n//32) + 4*(n%8) + (n%32)//8 == get_w2_permute_indices_with_cache")

    # 2. 128x4 block-scale swizzle: closed form vs two pure-torch copies inside flashinfer
    for M, K in ((128, 4), (200, 7), (256, 92), (5888, 96), (3072, 92)):
        S = torch.randint(0, 256, (M, K), dtype=torch.uint8, generator=g)
        a = swz(S)
        expect(torch.equal(a, cf_swz128x4(S)), f"128x4 formula != _swizzle_sf_128x4 for {M}x{K}")
        expect(
            torch.equal(a, swizzle_block_scale_reference(S).reshape(-1)),
            f"_swizzle_sf_128x4 != swizzle_block_scale_reference for {M}x{K}",
        )
    log("ok  128x4 swizzle formula == flashinfer _swizzle_sf_128x4 == swizzle_block_scale_reference")

    # 3. triton_kernels layouts: closed forms vs reference, both versions, padded + aligned shapes
    for tkver in ("3.5.1", "3.6.0"):
        t = tk(tkver)
        for E, N, Kb, Ks in ((2, 320, 80, 5), (1, 256, 128, 8), (3, 72, 80, 5), (1, 5760, 1440, 90)):
            Wt = torch.randint(0, 256, (E, N, Kb), dtype=torch.uint8, generator=g)
            St = torch.randint(0, 256, (E, N, Ks), dtype=torch.uint8, generator=g)
            combos = [
                ("HopperMXValueLayout", "HopperMXScaleLayout", True),
                ("HopperMXValueLayout", "HopperMXScaleLayout", False),
                ("BlackwellMXValueLayout", "BlackwellMXScaleLayout", False),
                ("StridedLayout", "StridedLayout", False),
            ]
            if N % 32 == 0 and Ks % 8 == 0:
                combos.append(("StridedLayout", "CDNA4MXScaleLayout", False))
            for lv, ls, pad in combos:
                vk = {"mx_axis": 1} if lv.startswith("Hopper") else {}
                sk = {"mx_axis": 1, "num_warps": 8} if ls.startswith("Hopper") else {}
                v, s, _ = triton_swizzle(t, Wt, St, (lv, vk, ls, sk, pad, {}))
                cv, cs = cf_triton(Wt, St, lv, ls, tkver, pad)
                same(v, cv, f"tk {tkver} {lv} E,N,Kb={E},{N},{Kb}")
                same(s, cs, f"tk {tkver} {ls} E,N,Ks={E},{N},{Ks} pad4={pad}")
        log(
            f"ok  triton_kernels {tkver}: Hopper value (pre-pack map + PACK), Hopper scale, "
            "Blackwell value/scale, CDNA4, Strided == closed forms"
        )

    # 4. v3.6.0 Hopper value = v3.5.1 result as leading sub-block (v3.6.0 only pads further first:
    #    N to 64 and Kb to 64 bytes, then the same map; docs/layouts.md "TRITON")
    E, N, Kb = 1, 5760, 1440
    Wt = torch.randint(0, 256, (E, N, Kb), dtype=torch.uint8, generator=g)
    St = torch.randint(0, 256, (E, N, 90), dtype=torch.uint8, generator=g)
    dec = ("HopperMXValueLayout", {"mx_axis": 1}, "HopperMXScaleLayout", {"mx_axis": 1, "num_warps": 8})
    v5, s5, _ = triton_swizzle(tk("3.5.1"), Wt, St, dec + (True, {}))
    v6, s6, _ = triton_swizzle(tk("3.6.0"), Wt, St, dec + (False, {}))
    sub = v6[:, : 4 * ru(Kb, 32), : ru(N, 16) // 4]
    expect(torch.equal(sub, v5), "D1: 3.6.0 Hopper value leading block != 3.5.1")
    rest = v6.clone()
    rest[:, : 4 * ru(Kb, 32), : ru(N, 16) // 4] = 0
    expect(int(rest.count_nonzero()) == 0, "D1: 3.6.0 Hopper value extra bytes not zero")
    expect(torch.equal(s5[:, : s6.shape[1]], s6), "D2: 0.20 scale != first rows of 0.33 scale")
    expect(int(s5[:, s6.shape[1] :].count_nonzero()) == 0, "D2: 0.33 extra scale rows not zero")
    log("ok  D1/D2 sub-block identities (3.6.0 vs 3.5.1 Hopper value; 0.20 vs 0.33 Hopper scale)")

    # 5. canonical inputs deterministic; padded tails zero
    c1 = make_canonical(2, 160, 160, 256, 256, 5)
    c2 = make_canonical(2, 160, 160, 256, 256, 5)
    expect(
        all(
            torch.equal(
                c1[k].view(torch.uint8) if c1[k].dtype != torch.uint8 else c1[k],
                c2[k].view(torch.uint8) if c2[k].dtype != torch.uint8 else c2[k],
            )
            for k in NAMES
        ),
        "make_canonical not deterministic",
    )
    expect(
        int(c1["w13_weight"][:, 320:].count_nonzero()) == 0 and int(c1["w13_weight"][:, :, 80:].count_nonzero()) == 0,
        "w13 padding not zero",
    )
    log("ok  make_canonical deterministic, padded tails zero")


def check_case_closed_form(canon, buffers, meta):
    """Every small case: the stored output equals the closed form (views rebuilt from buffers)."""
    if meta["backend"] == "TRITON":
        tkver = TRITON_TK[meta["revision"]]
        pad4 = meta["scale_ks_padded_to_4"]
        for wn, sn in (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale")):
            cv, cs = cf_triton(canon[wn], canon[sn], meta["layouts"][wn], meta["layouts"][sn], tkver, pad4)
            for name, c in ((wn, cv), (sn, cs)):
                b, _ = memory_order(c)
                same(buffers[name], b, f"{meta['case']}:{name} closed form")
        for bn in ("w13_bias", "w2_bias"):
            same(buffers[bn], canon[bn].float(), f"{meta['case']}:{bn}")
    elif meta["backend"] in VLLM_BACKENDS:
        be, rev = meta["backend"], meta["revision"]
        if be.startswith("FLASHINFER_CUTLASS"):
            cf = MB.cf_cutlass(canon, be, rev, cf_pack, cf_swz128x4)
        elif be == "MARLIN":
            cf = MB.cf_marlin(canon, meta["is_a_8bit"])
        else:
            cf = MB.cf_aiter(canon)
        for k in NAMES:
            same(buffers[k], memory_order(cf[k])[0], f"{meta['case']}:{k} closed form")
    else:
        cf = cf_trtllm(canon)
        for k in NAMES:
            same(buffers[k], cf[k], f"{meta['case']}:{k} closed form")


# --------------------------------------------------------------------------------------------
# self-checks for the vLLM-converter backends, and the GPU results
# --------------------------------------------------------------------------------------------
def selfcheck_vllm(log=print):
    g = torch.Generator().manual_seed(7)
    # 1. the Marlin repack stand-in (vLLM's test reference) == the gptq_marlin_repack closed form
    #    (docs/layouts.md "MARLIN")
    for N, K in ((64, 32), (128, 64), (192, 96), (512, 256), (256, 160)):
        for a8 in (False, True):
            if a8 and K % 32:
                continue
            W = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
            q = W.view(torch.int32).T.contiguous()
            ref = MB.marlin_repack_reference(q, K, N, 4, is_a_8bit=a8)
            same(ref, MB.cf_marlin_weight(W, a8), f"marlin repack reference vs M1 N={N} K={K} a8={a8}")
    log("ok  vLLM marlin_utils_test.marlin_weights(get_weight_perm) == repack closed form (16-bit, fp8)")
    # 2. FlashInfer's CPU scale fold == the C2a scale map (docs/layouts.md "CUTLASS")
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    for E, rows, Ks in ((2, 512, 8), (1, 5888, 92), (3, 128, 4)):
        S = torch.randint(0, 256, (E, rows, Ks), dtype=torch.uint8, generator=g)
        same(interleave_moe_scales_for_sm90_mixed_gemm(S), MB.cf_sm90_scales(S), f"sm90 scale fold {rows}x{Ks}")
    log("ok  flashinfer interleave_moe_scales_for_sm90_mixed_gemm == C2a scale map")
    # 3. AITER shuffles from the wheel == the weight/scale flat-offset formulas of docs/layouts.md "AITER"
    #    (random shapes, both gate_up)
    sh = refs().aiter_shuffle
    for E, Ip, Hp in ((2, 256, 256), (1, 512, 768), (3, 256, 512)):
        c = {
            "w13_weight": torch.randint(0, 256, (E, 2 * Ip, Hp // 2), dtype=torch.uint8, generator=g),
            "w13_weight_scale": torch.randint(0, 256, (E, 2 * Ip, Hp // 32), dtype=torch.uint8, generator=g),
            "w13_bias": torch.randn(E, 2 * Ip, generator=g).to(torch.bfloat16),
            "w2_weight": torch.randint(0, 256, (E, Hp, Ip // 2), dtype=torch.uint8, generator=g),
            "w2_weight_scale": torch.randint(0, 256, (E, Hp, Ip // 32), dtype=torch.uint8, generator=g),
            "w2_bias": torch.randn(E, Hp, generator=g).to(torch.bfloat16),
        }
        cf = MB.cf_aiter(c)
        W13d = c["w13_weight"].view(E, Ip, 2, -1).permute(0, 2, 1, 3).reshape(E, 2 * Ip, -1)
        S13d = c["w13_weight_scale"].view(E, Ip, 2, -1).permute(0, 2, 1, 3).reshape(E, 2 * Ip, -1)
        same(sh.shuffle_weight_a16w4(W13d.view(torch.float4_e2m1fn_x2), 16, True), cf["w13_weight"], "aiter K3 gate_up")
        same(
            sh.shuffle_weight_a16w4(c["w2_weight"].view(torch.float4_e2m1fn_x2), 16, False), cf["w2_weight"], "aiter K3"
        )
        same(
            sh.shuffle_scale_a16w4(S13d.reshape(-1, S13d.shape[-1]), E, True),
            cf["w13_weight_scale"],
            "aiter K4 gate_up",
        )
        same(
            sh.shuffle_scale_a16w4(c["w2_weight_scale"].reshape(-1, Ip // 32), E, False),
            cf["w2_weight_scale"],
            "aiter K4",
        )
    log("ok  aiter 0.1.7.post2.dev18 shuffle_weight_a16w4 / shuffle_scale_a16w4 == AITER weight/scale offsets")
    # 4. vLLM 0.20.0 wheel == a saved copy of the 0.19/0.20 oracle/mxfp4.py for the CUTLASS SM90 scale
    #    helper and the AITER branch (MXCONVERT_ORACLE_PAGE names the copy; skipped without one)
    page = Path(os.environ.get("MXCONVERT_ORACLE_PAGE", ""))
    if os.environ.get("MXCONVERT_ORACLE_PAGE") and page.exists():
        norm = lambda t: " ".join(t.split())  # noqa: E731
        wheel = (REFENV / "vllm020" / "oracle_mxfp4.py").read_text()
        a = wheel[wheel.index("def _interleave_mxfp4_cutlass_sm90") : wheel.index("w2_scale_interleaved = _interleave")]
        ptxt = page.read_text()
        b = ptxt[ptxt.index("def _interleave_mxfp4_cutlass_sm90") : ptxt.index("w2_scale_interleaved = _interleave")]
        expect(norm(a) == norm(b), "0.20.0 wheel's _interleave_mxfp4_cutlass_sm90 differs from the saved copy")
        a = wheel[
            wheel.index("elif mxfp4_backend == Mxfp4MoeBackend.AITER:") : wheel.index(
                "elif mxfp4_backend in TRITON_BACKENDS"
            )
        ]
        b = ptxt[
            ptxt.index("elif mxfp4_backend == Mxfp4MoeBackend.AITER:") : ptxt.index(
                "elif mxfp4_backend in TRITON_BACKENDS"
            )
        ]
        expect(norm(a) == norm(b), "0.20.0 wheel's AITER branch differs from the saved copy")
        log("ok  vLLM 0.20.0 wheel == saved copy of oracle/mxfp4.py (CUTLASS SM90 scale helper, AITER branch)")


def check_device_results(results: dict, log=print) -> list:
    """Every GPU output vs the closed form (C2a + Hopper packing; 128x4, docs/layouts.md) and vs
    flashinfer's pure-torch 128x4."""
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4

    rows = []
    for k in sorted(results):
        if k.startswith("in."):
            continue
        x = results.get("in." + k)
        y = results[k]
        if x is None:
            continue
        expect(MB.CudaCalls.key(k.split(".")[0], x) == k, f"{k}: input hash mismatch")
        if k.startswith("sm90w."):
            ok = torch.equal(y, MB.cf_sm90_weights(x, cf_pack))
            rows.append({"key": k, "function": "sm90 fp4 weight interleave", "spec": "C2a + PACK", "equal": ok})
        else:
            E = x.shape[0] if x.dim() == 3 else 1
            xs = x.reshape(E, *x.shape[-2:])
            cf = torch.cat([cf_swz128x4(xs[e]) for e in range(E)])
            pt = torch.cat([_swizzle_sf_128x4(xs[e]) for e in range(E)])
            ok = torch.equal(y, cf)
            rows.append(
                {
                    "key": k,
                    "function": "block_scale_interleave",
                    "spec": "T4 128x4",
                    "equal": ok,
                    "equal_pure_torch_swizzle_sf_128x4": torch.equal(y, pt),
                }
            )
        expect(rows[-1]["equal"], f"GPU result {k} differs from the closed form")
    log(
        f"ok  {len(rows)} GPU outputs == closed forms (C2a+PACK / 128x4), 128x4 also == _swizzle_sf_128x4: "
        f"{all(r.get('equal_pure_torch_swizzle_sf_128x4', True) for r in rows)}"
    )
    return rows


def aiter_primitive_cases(out_dir: Path, log=print) -> list:
    """Direct calls of the AITER shuffles on shapes the converter never produces (Ks % 8 != 0)."""
    from safetensors.torch import save_file

    sh = refs().aiter_shuffle
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    g = torch.Generator().manual_seed(585)
    for E, n, Ks, gate_up in ((1, 64, 5, True), (2, 32, 12, False)):
        S = torch.randint(100, 141, (E * n, Ks), dtype=torch.uint8, generator=g)
        name = f"aiter-primitive_shuffle-scale-a16w4_{'gateup' if gate_up else 'down'}_e{E}_n{n}_ks{Ks}"
        meta = {
            "case": name,
            "kind": "primitive (direct call, not a converter output)",
            "function": "aiter.ops.shuffle.shuffle_scale_a16w4(src, experts_cnt, gate_up)",
            "args": {"src_shape": [E * n, Ks], "experts_cnt": E, "gate_up": gate_up},
            "reference": refs().aiter_info(),
            "generator": GENERATOR,
        }
        tensors = {"input.src": S}
        try:
            y = sh.shuffle_scale_a16w4(S, E, gate_up)
            tensors["output"] = y.contiguous()
            meta["result"] = {"dtype": dtype_name(y.dtype), "shape": list(y.shape)}
            meta["pad_0x7f"] = bool(y.shape[-1] != Ks)
        except Exception as e:  # noqa: BLE001
            meta["raises"] = f"{type(e).__name__}: {e}"
        path = out_dir / f"{name}.safetensors"
        save_file(tensors, str(path), metadata={"case": json.dumps(meta, sort_keys=True)})
        made.append(meta)
        log(f"wrote {path.relative_to(REPO)}: {meta.get('raises') or meta['result']}")
    return made


# --------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--check-only", action="store_true", help="run self-checks only")
    ap.add_argument("--no-large", action="store_true", help="skip the hash-only real-size cases")
    ap.add_argument(
        "--prepare-device",
        type=Path,
        metavar="DIR",
        help="write DIR/fi_inputs.safetensors: the inputs of FlashInfer's CUDA-only calls "
        "for every FLASHINFER_CUTLASS case (to run tools/golden/device_flashinfer.py)",
    )
    ap.add_argument(
        "--device-results",
        type=Path,
        default=DEVICE_DIR,
        help="folder with the GPU run's fi_out_*.safetensors + fi_report.json and the "
        "fi_inputs.safetensors they were made from (default .refenv/device_results)",
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    print(f"torch {torch.__version__}; refenv {REFENV}")
    if args.prepare_device:
        prepare_device(args.prepare_device)
        return
    selfcheck()
    selfcheck_vllm()
    device_rows = []
    if (args.device_results / "fi_report.json").exists():
        results, report = load_device_results(args.device_results)
        device_rows = check_device_results(results)
        _STATE["cuda"] = MB.CudaCalls("replay", {k: v for k, v in results.items() if not k.startswith("in.")})
        _STATE["device"] = report
    else:
        print(f"!! no GPU results in {args.device_results}: FLASHINFER_CUTLASS cases that need them will abort")
        _STATE["cuda"] = MB.CudaCalls("replay", {})
    if args.check_only:
        return

    from safetensors.torch import save_file

    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.safetensors"):
        old.unlink()

    # determinism: a couple of cases twice
    twice = {
        "triton_v033_sm90_e2_h160_i160",
        "trtllm_v020_sm100_e2_h160_i160",
        "triton_v020_sm100_e1_h96_i96",
        "cutlass-bf16_v033_sm90_e2_h160_i160",
        "marlin_v033_sm89-fp8_e2_h160_i160",
        "aiter_v033_gfx950_e2_h160_i160",
    }
    index = []
    for name, backend, rev, tgt, sname, E, H, I in all_cases(large=False):
        canon, buffers, meta = build_case(name, backend, rev, tgt, sname, E, H, I)
        check_case_closed_form(canon, buffers, meta)
        if name in twice:
            _, b2, _ = build_case(name, backend, rev, tgt, sname, E, H, I)
            for k in NAMES:
                same(buffers[k], b2[k], f"{name}:{k} recomputed")
        tensors = {f"canonical.{k}": canon[k].contiguous() for k in NAMES}
        tensors |= {f"kernel.{k}": buffers[k] for k in NAMES}
        path = args.out / f"{name}.safetensors"
        save_file(tensors, str(path), metadata={"case": json.dumps(meta, sort_keys=True)})
        index.append(name)
        print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size} B)")

    hashes = []
    if not args.no_large:
        twice_large = {"triton_v033_sm90_e1_h2880_i2880", "trtllm_v033_sm100_e1_h2880_i2880"}
        for name, backend, rev, tgt, sname, E, H, I in all_cases(large=True):
            canon, buffers, meta = build_case(name, backend, rev, tgt, sname, E, H, I)
            entry = hash_entry(canon, buffers, meta)
            if name in twice_large:
                e2 = hash_entry(*build_case(name, backend, rev, tgt, sname, E, H, I))
                expect(e2["outputs"] == entry["outputs"], f"{name}: recomputation differs")
            if (
                name
                in {
                    "triton_v020_sm90_e1_h2880_i2880",
                    "trtllm_v033_sm100_e1_h2880_i2880",
                    "triton_v033_gfx950-tp1_e1_h2880_i2880",
                }
                or backend in VLLM_BACKENDS
            ):
                check_case_closed_form(canon, buffers, meta)
            hashes.append(entry)
            print(f"hashed {name}")
    (args.out / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"{len(index)} stored cases, {len(hashes)} hash-only cases")

    aiter_primitive_cases(args.out / "primitives")
    if _STATE["device"] is not None:
        from safetensors.torch import load_file

        ins = load_file(str(args.device_results / "fi_inputs.safetensors"))
        used = set(_STATE["cuda"].used)
        manifest = {
            "what": (
                "outputs of FlashInfer's CUDA-only functions, computed on a GPU by "
                "tools/golden/device_flashinfer.py, consumed by the FLASHINFER_CUTLASS cases"
            ),
            "device": device_info(_STATE["device"]),
            "results": [
                {
                    "key": k,
                    "input_shape": list(ins[k].shape),
                    "input_sha256": MB.sha256_bytes(ins[k]),
                    "output_shape": list(_STATE["cuda"].results[k].shape),
                    "output_sha256": MB.sha256_bytes(_STATE["cuda"].results[k]),
                    "used_by_cases": k in used,
                    **{c: r[c] for r in device_rows if r["key"] == k for c in r if c != "key"},
                }
                for k in sorted(_STATE["cuda"].results)
            ],
        }
        DEVICE_MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        print(f"wrote {DEVICE_MANIFEST.relative_to(REPO)}")


def prepare_device(folder: Path):
    """Run every FLASHINFER_CUTLASS converter with recording stand-ins; save what the CUDA calls got."""
    from safetensors.torch import save_file

    rec = MB.CudaCalls("record")
    _STATE["cuda"] = rec
    for large in (False, True):
        for _name, backend, rev, tgt, sname, E, H, I in vllm_cases(large):
            if backend.startswith("FLASHINFER_CUTLASS"):
                Hp, Ip = padded_sizes(backend, rev, tgt, H, I)
                MB.run_vllm_converter(refs(), rec, backend, rev, tgt, make_canonical(E, H, I, Hp, Ip, SEED[sname]))
    # probes beyond the converter's shapes (report only): odd / unaligned scale shapes, other n, k
    g = torch.Generator().manual_seed(4242)
    for shp in ((2, 200, 7), (1, 5888, 96), (3, 128, 4)):
        rec.block_scale_interleave(torch.randint(0, 256, shp, dtype=torch.uint8, generator=g))
    for shp in ((3, 48, 96), (1, 2944, 1472), (2, 16, 32)):
        rec.sm90_weights(torch.randint(0, 256, shp, dtype=torch.uint8, generator=g))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in rec.inputs.items()}, str(folder / "fi_inputs.safetensors"))
    size = (folder / "fi_inputs.safetensors").stat().st_size
    print(f"wrote {folder / 'fi_inputs.safetensors'}: {len(rec.inputs)} inputs, {size} B")


if __name__ == "__main__":
    main()
