#!/usr/bin/env python3
"""Run ONE vLLM release's own NVFP4 MoE weight processing on CPU and print a digest of every tensor
the kernels read (JSON on stdout). Runs INSIDE that release's environment: made and called by
tools/vllm_releases/record_tensors.py (`record_tensors.py nvfp4 X.Y.Z`), not by hand.

The steps are those of the ModelOpt / compressed-tensors NVFP4 MoE methods'
`process_weights_after_loading` once the canonical tensors are built (tests/golden/nvfp4_inputs.py,
docs/checkpoints.md "NVFP4 canonical tensors"), as tools/golden/make_nvfp4_goldens.py runs them for
0.33.0 and 0.15.0, each the release's own call, with the arguments its signature takes:

    oracle.nvfp4.convert_to_nvfp4_moe_kernel_format(backend, layer, ...)   (+ use_a16 and
        trtllm_hidden_alignment=flashinfer_utils.trtllm_nvfp4_hidden_alignment(False, gated) where
        the release has them)
    model_executor.utils.replace_parameter(layer, name, t) for the eight tensors
    oracle.nvfp4.make_nvfp4_moe_quant_config(...)
    <experts class>.process_weights_after_loading(self, layer) where the release's experts class
        (oracle.nvfp4.backend_to_kernel_cls(backend)[0]) has one (the global-scale fold)

Stand-ins: the layer (an nn.Module with the eight tensors and the attributes the conversion reads,
as make_nvfp4_goldens.StandInRoutedExperts), the experts `self` (a namespace with quant_config and
moe_config), `torch.Tensor.cuda` -> identity while the release runs, FlashInfer's CUDA-only
block-scale interleave and `gptq_marlin_repack` (tools/golden/release_standins.py), and Marlin's
workspace (queries the device; not a weight) -> zeros.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import site
import sys
import traceback
import types
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "golden"))
import release_standins as S  # noqa: E402
from nvfp4_inputs import NAMES, make_nvfp4_canonical  # noqa: E402

# name: (E, K, N, w4a16, seed): gated shapes of tests/golden/nvfp4 (make_nvfp4_goldens.SMALL_SHAPES;
# mxconvert lays out gated layers only): aligned, N padded (or refused), K padded, a W4A16 checkpoint.
SHAPES = {
    "e2_k256_n64": (2, 256, 64, False, 25664),
    "e2_k256_n96": (2, 256, 96, False, 25696),
    "e2_k320_n64": (2, 320, 64, False, 32064),
    "e2_k256_n64_a16": (2, 256, 64, True, 25666),
    # one rank of a TP=2 split of N=384 (N_r = 192: rows 384, a multiple of 128; not of 256)
    "e2_k256_n192-tp2": (2, 256, 192, False, 25692),
}
BACKENDS = (
    "FLASHINFER_TRTLLM",
    "FLASHINFER_CUTLASS",
    "VLLM_CUTLASS",
    "FLASHINFER_CUTEDSL",
    "FLASHINFER_CUTEDSL_BATCHED",
    "MARLIN",
)
A16_BACKENDS = ("MARLIN",)  # the W4A16 shape is recorded for the backends that run it


#: what vLLM's and FlashInfer's preparations raise to refuse a shape (their asserts and explicit
#: raises); any other exception (a TypeError calling a stand-in, a missing module) is a recording
#: error, never a refusal
REFUSALS = (AssertionError, ValueError, NotImplementedError, RuntimeError)


class StandInLayer(torch.nn.Module):
    """The eight canonical tensors as Parameters, plus the attributes the conversion reads."""

    def __init__(self, canon, E, K, N, activation):
        super().__init__()
        for k in NAMES:
            if k in canon:
                self.register_parameter(k, torch.nn.Parameter(canon[k].clone(), requires_grad=False))
        self.activation = activation
        self.moe_config = SimpleNamespace(
            hidden_dim=K,
            hidden_dim_unpadded=None,
            intermediate_size_per_partition=N,
            is_act_and_mul=True,
            activation=activation,
            moe_parallel_config=SimpleNamespace(enable_eplb=False),
        )
        self.num_experts = E
        self.hidden_size = K
        self.intermediate_size_per_partition = N
        self.params_dtype = torch.bfloat16


def _activation():
    try:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    except ImportError:
        return None  # releases before the enum read only is_act_and_mul
    return MoEActivation.SILU


def _kwargs(fn, **values):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in values.items() if k in params}


@contextlib.contextmanager
def patches(fi: S.FlashInferCuda):

    import vllm._custom_ops as ops
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as m4

    pairs = [
        (torch.Tensor, "cuda", lambda self, *a, **k: self),
        (ops, "gptq_marlin_repack", S.marlin_repack_reference),
        # the workspace sizes itself by the device's SM count (not a weight): any signature, zeros
        (m4, "marlin_make_workspace_new", lambda *a, **k: torch.zeros(1, dtype=torch.int)),
    ]

    def interleave(sf, *a, **k):
        return fi.block_scale_interleave(sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf, *a, **k)

    for modname in ("flashinfer", "flashinfer.fp4_quantization", "flashinfer.quantization.fp4_quantization"):
        mod = sys.modules.get(modname)
        for fn in ("nvfp4_block_scale_interleave", "block_scale_interleave"):
            if mod is not None and hasattr(mod, fn):
                pairs.append((mod, fn, interleave))
    with S.patched_attrs(pairs):
        yield


def run_case(oracle, fi, backend: str, E: int, K: int, N: int, w4a16: bool, seed: int) -> dict:

    if backend not in oracle.NvFp4MoeBackend.__members__:
        return {"absent": f"no NvFp4MoeBackend.{backend} in this release"}
    B = oracle.NvFp4MoeBackend[backend]
    canon = make_nvfp4_canonical(E, K, N, seed, gated=True, w4a16=w4a16)
    layer = StandInLayer(canon, E, K, N, _activation())
    entry: dict = {"canonical_sha256": {k: S.sha256_bytes(v) for k, v in canon.items()}}
    try:
        with patches(fi), torch.no_grad():
            extra = _convert(oracle, B, layer, w4a16)
    except S.Unrecorded as e:
        return entry | {"unrecorded": str(e)}
    except ImportError as e:  # this environment lacks a package the release imports: not a refusal
        return entry | {"error": f"{type(e).__name__}: {e} (missing from the recording environment)"}
    except REFUSALS as e:  # the release refuses this case: recorded as such
        frame = traceback.extract_tb(e.__traceback__)[-1]
        if Path(frame.filename).resolve().is_relative_to(HERE):
            raise  # a stand-in's own check failed: a recording error, not the release's refusal
        where = frame.filename.split("site-packages/")[-1]
        return entry | {"raises": f"{type(e).__name__}: {e}", "raised_at": f"{where}:{frame.lineno} {frame.name}"}
    tensors = {}
    for k in NAMES:
        p = getattr(layer, k, None)
        if p is None or p.numel() == 0:
            continue
        tensors[k] = _describe(p.data)
    for k, v in extra.items():
        tensors[k] = _describe(v.data if isinstance(v, torch.nn.Parameter) else v)
    return entry | {"tensors": tensors}


def _describe(t: torch.Tensor) -> dict:
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))  # type: ignore[operator]
    p = t.permute(perm)
    buf = torch.empty(p.shape, dtype=p.dtype).copy_(p)
    out: dict[str, object] = {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(buf.shape),
        "sha256": S.sha256_bytes(buf),
    }
    if perm != list(range(t.dim())):
        out["view"] = {"shape": list(t.shape), "stride": list(t.stride())}
    return out


def _convert(oracle, B, layer, w4a16: bool) -> dict:
    from vllm.model_executor.utils import replace_parameter

    values = dict(
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
        is_act_and_mul=True,
        use_a16=w4a16,
    )
    params = inspect.signature(oracle.convert_to_nvfp4_moe_kernel_format).parameters
    if "trtllm_hidden_alignment" in params:
        from vllm.model_executor.layers.quantization.utils.flashinfer_utils import trtllm_nvfp4_hidden_alignment

        values["trtllm_hidden_alignment"] = trtllm_nvfp4_hidden_alignment(
            per_token_activation=False, is_act_and_mul=True
        )
    # a release without use_a16 reads a W4A16 checkpoint as one without input scales (as
    # make_nvfp4_goldens.py's 0.15.0 run does): the canonical tensors then hold none
    outs = oracle.convert_to_nvfp4_moe_kernel_format(**_kwargs(oracle.convert_to_nvfp4_moe_kernel_format, **values))
    for name, t in zip(NAMES, outs):
        replace_parameter(layer, name, t)
    qc = oracle.make_nvfp4_moe_quant_config(
        **_kwargs(
            oracle.make_nvfp4_moe_quant_config,
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
    )
    try:
        classes = oracle.backend_to_kernel_cls(B)
    except NotImplementedError:  # a monolithic backend (TRTLLM up to 0.16): no experts class, no fold
        classes = []
    cls = classes[0] if isinstance(classes, (list, tuple)) and classes else classes or None
    if cls is not None and "process_weights_after_loading" in {n for c in cls.__mro__ for n in vars(c)}:
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
    if qc is not None:
        for k in ("a1_gscale", "a2_gscale", "g1_alphas", "g2_alphas"):
            v = getattr(qc, k, None)
            if v is not None:
                extra[k] = v
    else:  # TRTLLM before the quant config held them: plain attributes of the layer
        for k in ("a1_gscale", "g1_alphas", "g2_alphas"):
            if getattr(layer, k, None) is not None:
                extra[k] = getattr(layer, k)
    if getattr(layer, "g1_scale_c", None) is not None:
        extra["g1_scale_c"] = layer.g1_scale_c
    return extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiter-shuffle", type=Path, help="unused (the MXFP4 runner's argument)")
    ap.add_argument("--flashinfer", required=True, help="the FlashInfer version the release pins (installed first)")
    ap.add_argument("--site-dir", type=Path, action="append", default=[], help="extra site folders (.pth read)")
    args = ap.parse_args()
    for folder in args.site_dir:
        site.addsitedir(str(folder))
    with S.cuda_properties_at_import():
        import flashinfer
    import vllm

    if getattr(flashinfer, "__version__", None) != args.flashinfer:
        raise SystemExit(f"flashinfer {flashinfer.__version__} imported, the release pins {args.flashinfer}")
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    fi = S.FlashInferCuda(args.flashinfer, Path(flashinfer.__file__).parent / "data" / "csrc" / "nv_internal")
    cases = []
    for backend in BACKENDS:
        for sname, (E, K, N, w4a16, seed) in SHAPES.items():
            if w4a16 and backend not in A16_BACKENDS:
                continue
            case = {"backend": backend, "shape": sname, "E": E, "K": K, "N": N, "gated": True, "w4a16": w4a16}
            case["seed"] = seed
            try:
                case |= run_case(oracle, fi, backend, E, K, N, w4a16, seed)
            except Exception as e:  # noqa: BLE001 - recorded, never guessed: the table reports it
                case["error"] = f"{type(e).__name__}: {e}"
                case["traceback"] = traceback.format_exc(limit=-4)
            cases.append(case)
    json.dump(
        {
            "vllm": vllm.__version__,
            "flashinfer": flashinfer.__version__,
            "torch": torch.__version__,
            "converter": "convert_to_nvfp4_moe_kernel_format",
            "gpu_checked": sorted(set(fi.checked)),
            "flashinfer_sources": fi.sources,
            "cases": cases,
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.exit(main())
