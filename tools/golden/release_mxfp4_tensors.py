#!/usr/bin/env python3
"""Run ONE vLLM release's own GPT-OSS MXFP4 weight processing on CPU and print a digest of every
tensor it lays out (JSON on stdout). Runs INSIDE that release's environment: made and called by
tools/vllm_releases/record_tensors.py (`record_tensors.py mxfp4 X.Y.Z`), not by hand.

What runs is the release's code: `mxfp4_round_up_hidden_size_and_intermediate_size` for the padded
sizes, and its converter (`convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`, in 0.19.x
`convert_to_mxfp4_moe_kernel_format`) on the canonical loader tensors of
tests/golden/canonical_inputs.py, for every backend whose layout mxconvert writes, with the
release's vendored triton_kernels (TRITON's `_swizzle_mxfp4`), its Marlin helpers, and the Python of
the FlashInfer release it pins. Device queries and CUDA-only ops are the stand-ins of
tools/golden/release_standins.py.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import sys
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "golden"))
import release_standins as S  # noqa: E402
from canonical_inputs import NAMES, make_canonical  # noqa: E402

# (E, H, I, seed): the shapes of tests/golden (make_mxfp4_goldens.SMALL_SHAPES): one that pads on
# every backend with an odd scale-group count, a tiny one, and one aligned for every layout.
SHAPES = {
    "e2_h160_i160": (2, 160, 160, 1601),
    "e1_h96_i96": (1, 96, 96, 961),
    "e1_h256_i256": (1, 256, 256, 2561),
    # one rank of a TP=2 split of I=384 (I_r = 192: pads to 256 where the rule rounds to 128 or 256)
    "e2_h128_i192-tp2": (2, 128, 192, 1922),
}


def cuda(major: int, minor: int, **extra) -> dict:
    return {"platform": "cuda", "capability": [major, minor], "tp": 1, **extra}


def rocm(gfx: str, tp: int = 1, **extra) -> dict:
    return {"platform": "rocm", "gfx": gfx, "tp": tp, **extra}


# (mxconvert backend, target key, target): every MXFP4 backend mxconvert lays out, on the device
# families whose bytes differ (docs/layouts.md).
TARGETS = [
    ("TRITON", "sm90", cuda(9, 0)),
    ("TRITON", "sm90-oldtorch", cuda(9, 0, torch_geq_2_8_1=False)),
    ("TRITON", "sm100", cuda(10, 0)),
    ("TRITON", "gfx950-tp1", rocm("gfx950", 1)),
    ("TRITON", "gfx950-tp2", rocm("gfx950", 2)),
    ("TRITON", "gfx950-tp4", rocm("gfx950", 4)),
    ("TRITON", "gfx942", rocm("gfx942", 1)),
    ("FLASHINFER_TRTLLM_MXFP4_BF16", "sm100", cuda(10, 0)),
    ("FLASHINFER_TRTLLM_MXFP4_MXFP8", "sm100", cuda(10, 0)),
    ("FLASHINFER_CUTLASS_MXFP4_BF16", "sm90", cuda(9, 0)),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "sm100", cuda(10, 0)),
    ("MARLIN", "sm80", cuda(8, 0)),
    ("MARLIN", "sm89-fp8", cuda(8, 9, marlin_input_dtype="fp8")),
    ("AITER_MXFP4_BF16", "gfx950", rocm("gfx950", 1)),
]

# mxconvert's backend name -> the names the releases' `Mxfp4MoeBackend` used for it, newest first
ENUM_NAMES = {"AITER_MXFP4_BF16": ("AITER_MXFP4_BF16", "AITER", "CK")}


def release_enum(oracle, backend: str):
    for name in ENUM_NAMES.get(backend, (backend,)):
        if name in oracle.Mxfp4MoeBackend.__members__:
            return oracle.Mxfp4MoeBackend[name]
    return None


def memory_order(t: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """(dense buffer in memory order, perm) with buffer = t.permute(perm).contiguous(): the bytes a
    kernel reads (tests/golden/README.md, "<case>.safetensors")."""
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))  # type: ignore[operator]
    return t.permute(perm).contiguous(), perm


def describe(t) -> dict:
    """{dtype, shape, sha256, view} of one output (a torch tensor or a triton_kernels Tensor)."""
    if hasattr(t, "storage") and hasattr(t.storage, "data"):  # triton_kernels Tensor
        t = t.storage.data
    if isinstance(t, torch.nn.Parameter):
        t = t.data
    entry: dict = {"dtype": str(t.dtype).removeprefix("torch.")}
    buf, perm = memory_order(t)
    entry["shape"] = list(buf.shape)
    entry["sha256"] = S.sha256_bytes(buf)
    if perm != list(range(t.dim())):
        entry["view"] = {"shape": list(t.shape), "stride": list(t.stride())}
    return entry


def weight_scale(precision_config_or_tensor):
    for attr in ("weight_scale", "b_mx_scale"):
        if hasattr(precision_config_or_tensor, attr):
            return getattr(precision_config_or_tensor, attr)
    return precision_config_or_tensor


def run_one(oracle, converter, fi, aiter_mods, backend: str, target: dict, E: int, H: int, I: int, seed: int):  # noqa: E741
    be = release_enum(oracle, backend)
    if be is None:
        return {"absent": f"no Mxfp4MoeBackend for {backend} in this release"}
    tgt = {k: v for k, v in target.items() if k not in ("torch_geq_2_8_1", "marlin_input_dtype")}
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4

    marlin_dtype = torch.float8_e4m3fn if target.get("marlin_input_dtype") == "fp8" else None
    with S.device(tgt, torch_geq_2_8_1=target.get("torch_geq_2_8_1", True)):
        Hp, Ip = oracle.mxfp4_round_up_hidden_size_and_intermediate_size(be, H, I)
        canon = make_canonical(E, H, I, Hp, Ip, seed)
        layer = torch.nn.Module()
        for k in NAMES:
            layer.register_parameter(k, torch.nn.Parameter(canon[k].clone(), requires_grad=False))
        layer.params_dtype = torch.bfloat16  # type: ignore[assignment]
        args = [getattr(layer, k) for k in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")]
        args += [layer.w13_bias, layer.w2_bias]
        kwargs: dict[str, dict] = {}
        if "_cache_permute_indices" in converter.__code__.co_varnames:
            kwargs["_cache_permute_indices"] = {}
        with (
            S.patched_attrs(
                [
                    (ops, "gptq_marlin_repack", S.marlin_repack_reference),
                    (marlin_utils_fp4, "get_marlin_input_dtype", lambda *a, **k: marlin_dtype),
                ]
            ),
            S.modules(aiter_mods),
            torch.no_grad(),
        ):
            result = converter(be, layer, *args, **kwargs)
    w13, w2, s13, s2, b13, b2 = result
    outs = {
        "w13_weight": w13,
        "w13_weight_scale": weight_scale(s13),
        "w13_bias": b13,
        "w2_weight": w2,
        "w2_weight_scale": weight_scale(s2),
        "w2_bias": b2,
    }
    entry: dict = {
        "release_backend": be.name,
        "Hp": Hp,
        "Ip": Ip,
        "canonical_sha256": {k: S.sha256_bytes(canon[k]) for k in NAMES},
    }
    entry["tensors"] = {k: describe(v) for k, v in outs.items()}
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiter-shuffle", type=Path, required=True, help="aiter/ops/shuffle.py of the amd-aiter wheel")
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
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.utils.import_utils import has_triton_kernels

    assert has_triton_kernels()
    import triton_kernels.tensor  # noqa: F401  (the vendored copy, aliased by vLLM)

    tk_file = Path(sys.modules["triton_kernels"].__file__ or "")
    if Path(vllm.__file__).parent / "third_party" not in tk_file.parents:
        raise SystemExit(f"triton_kernels imported from {tk_file}, not from the release's vllm/third_party")
    converter = (
        getattr(oracle, "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format", None)
        or oracle.convert_to_mxfp4_moe_kernel_format
    )
    fi = S.FlashInferCuda(args.flashinfer, Path(flashinfer.__file__).parent / "data" / "csrc" / "nv_internal")
    aiter_mods = S.aiter_modules(args.aiter_shuffle)
    import flashinfer.fused_moe as fi_moe

    fi_patch: list[tuple[object, str, object]] = [(flashinfer, "block_scale_interleave", fi.block_scale_interleave)]
    for modname in ("flashinfer.fp4_quantization", "flashinfer.quantization.fp4_quantization", "flashinfer"):
        mod = sys.modules.get(modname)
        for fn in ("block_scale_interleave", "nvfp4_block_scale_interleave"):
            if mod is not None and hasattr(mod, fn):
                fi_patch.append((mod, fn, fi.block_scale_interleave))
    for modname in ("flashinfer.fused_moe", "flashinfer.fused_moe.core", "flashinfer.fused_moe.prepare"):
        mod = sys.modules.get(modname)
        if mod is not None and hasattr(mod, "interleave_moe_weights_for_sm90_mixed_gemm"):
            fi_patch.append((mod, "interleave_moe_weights_for_sm90_mixed_gemm", fi.sm90_weights))
    del fi_moe
    cases = []
    with S.patched_attrs(fi_patch):
        for backend, key, target in TARGETS:
            for sname, (E, H, I, seed) in SHAPES.items():  # noqa: E741
                tgt = target
                if sname.endswith("-tp2") and "-tp" not in key:  # a rank's slice: the world size is 2
                    tgt = dict(target, tp=2)
                case: dict[str, object] = {"backend": backend, "target_key": key, "target": tgt, "shape": sname}
                case |= {"E": E, "H": H, "I": I, "seed": seed}
                try:
                    case |= run_one(oracle, converter, fi, aiter_mods, backend, tgt, E, H, I, seed)
                except S.Unrecorded as e:  # a CUDA op no checked reference stands for: never guessed
                    case["unrecorded"] = str(e)
                except Exception as e:  # recorded, never guessed: the test reports it
                    case["error"] = f"{type(e).__name__}: {e}"
                    case["traceback"] = traceback.format_exc(limit=-4)
                cases.append(case)
    json.dump(
        {
            "vllm": vllm.__version__,
            "flashinfer": flashinfer.__version__,
            "torch": torch.__version__,
            "triton_kernels": str(tk_file.parent.relative_to(Path(vllm.__file__).parent.parent)),
            "converter": converter.__name__,
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
