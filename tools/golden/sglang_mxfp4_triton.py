#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's GPT-OSS MXFP4 TRITON (`--moe-runner-backend triton_kernel`, its
`auto` pick on an H100 with triton_kernels installed) expert bytes on SM90, made by RUNNING SGLang's
own weight creation and `_swizzle_mxfp4` on CPU with a triton_kernels of the generation SGLang calls
(docs/sglang.md, "triton_kernels").

    /work/main/.venv-vllm/bin/python tools/golden/sglang_mxfp4_triton.py    # writes tests/golden/sglang/

Environment: the vLLM test environment's python (torch 2.13 CPU and triton 3.9.0, which imports on
a CPU-only host; tools/vllm_env/setup.sh). No GPU.

triton_kernels: SGLang 0.5.23 vendors none and runs whatever `import triton_kernels` finds; its
`_swizzle_mxfp4` takes layout OBJECTS from `make_default_matmul_mxfp4_w_layout(mx_axis=-2)` and
`_mx_block_kwargs` probes `PrecisionConfig.b_microblock_size` (the triton_kernels 3.8 API: the 3.5.1 /
3.6.0 copies vLLM vendors return `(class, kwargs)` pairs and cannot run it). The one copy of that
API on the package index is the `triton_kernels` package of `tokenspeed-triton-kernels
1.0.0.post20260510` (PyPI; a vendor snapshot of triton main's python/triton_kernels, 2026-05-10:
after triton's 3.7 branch cut, before its 3.8 cut of July 2026). The tool fetches that wheel with
`pip download --no-deps` into ~/.cache/mxconvert-wheels when it is not there, and imports its
`triton_kernels` from a temporary folder (nothing is vendored into this repository). It is NOT
triton's v3.8 tree: triton PR #10428 ("Fix Hopper MXFP4 packed value padding", merged 2026-05-31,
before the 3.8 cut) pads the Hopper value dimension packed by four to 256 instead of 64 (see
docs/sglang.md for what that changes).

What runs is SGLang's code, compiled from the wheel's source as written
(sglang/srt/layers/quantization/mxfp4.py): `Mxfp4MoEMethod.create_weights` (with triton_kernels
installed: I -> 64, H unchanged, scales filled with `_UE8M0_ONE` = 0x7F),
`process_weights_after_loading` (its `use_triton_kernels` branch: biases to float32,
`_swizzle_mxfp4(..., num_warps=8)` of w13 and w2, `PrecisionConfig(b_mx_scale=..., **_mx_block_kwargs())`),
`_swizzle_mxfp4` (SM90: `update_opt_flags_constraints({"split_k": 1})`, `_pad_hopper_mxfp4_scale`,
transposes, `wrap_torch_tensor`, `convert_layout`) and `_pad_hopper_mxfp4_scale`, with the
triton_kernels layout code (`make_default_matmul_mxfp4_w_layout`, `..._w_scale_layout`,
`HopperMXValueLayout`, `HopperMXScaleLayout`, `convert_layout`: pure torch on CPU).

Stood in (named):
  * triton_kernels' device queries in tensor_details/layout.py: `cuda_capability_geq(major, minor)`
    answers as an SM90 device (9, 0) would, `is_hip_cdna4()` / `is_hip_gfx1250()` -> False (what an
    H100 answers; on a CPU triton has no active target);
  * `get_platform()` -> is_sm90 (an H100); `get_moe_a2a_backend()` -> not MORI;
  * `FusedMoE.__init__`'s attributes (no hidden rounding for triton_kernel) and the MXFP4 fast path of
    `FusedMoE.weight_loader` (`param.data[:, :dim1, :dim2].copy_(loaded)`), as in sglang_mxfp4_trtllm.py.

Recorded per case (`CASES`): the checkpoint tensors (`in.*`), what SGLang's kernel reads
(`out.w13_weight` / `out.w2_weight`: the triton tensor's storage, `out.w13_weight_scale` /
`out.w2_weight_scale`: the precision config's `b_mx_scale` storage, each as the dense buffer whose
`.mT` the kernel holds; `out.*_bias`: float32), the
padded sizes, and in the metadata the layout classes, the logical shapes and the triton_kernels wheel.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_common import (  # noqa: E402 - the sibling module, by path
    WHEELS,
    compile_functions,
    golden_arguments,
    gpt_oss_checkpoint,
    load_fast_path,
    mxfp4_namespace,
    wheel_reader,
)

#: The package-index copy of triton_kernels with the API SGLang 0.5.23 calls (see the docstring).
TK_REQUIREMENT = "tokenspeed-triton-kernels==1.0.0.post20260510"
TK_WHEEL = "tokenspeed_triton_kernels-1.0.0.post20260510-py3-none-any.whl"
SOURCE = "sglang/srt/layers/quantization/mxfp4.py"
#: (experts, hidden, intermediate): one padded everywhere (I 160 -> 192 by create_weights, scale
#: groups 10 -> 12 and 6 -> 8 by _pad_hopper_mxfp4_scale, rows 384 -> 512 and 320 -> 512 by the
#: Hopper scale layout), one whose sizes need no padding but the Hopper layouts' own.
CASES = ((2, 320, 160), (1, 256, 256))
#: What this tool runs of SOURCE: three module functions and two `Mxfp4MoEMethod` methods.
FUNCTIONS: dict[str | None, set[str]] = {
    None: {"_pad_hopper_mxfp4_scale", "_mx_block_kwargs", "_swizzle_mxfp4"},
    "Mxfp4MoEMethod": {"create_weights", "process_weights_after_loading"},
}


def triton_kernels_wheel() -> Path:
    """The tokenspeed-triton-kernels wheel, fetched from the package index when it is not cached."""
    wheel = WHEELS / TK_WHEEL
    if not wheel.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", TK_REQUIREMENT, "-d", str(WHEELS)]
        subprocess.run(cmd, check=True)
    return wheel


def import_triton_kernels(wheel: Path, into: Path) -> types.ModuleType:
    """Extract the wheel's `triton_kernels` package into `into`, import it from there and stand in
    for its device queries as an SM90 device answers them."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(into, [n for n in zf.namelist() if n.startswith("triton_kernels/")])
    sys.path.insert(0, str(into))
    import triton_kernels.tensor_details.layout as layout

    layout.cuda_capability_geq = lambda major, minor=0: (major, minor) <= (9, 0)
    for name in ("is_hip_cdna4", "is_hip_gfx1250"):
        if hasattr(layout, name):
            setattr(layout, name, lambda: False)
    return layout


def sglang_functions(wheel: str) -> dict:
    """SGLang's functions this tool runs, compiled from the wheel's mxfp4.py with the names they look up."""
    platform = types.SimpleNamespace(
        is_sm100=False, is_sm90=True, is_sm120=False, is_cuda=True, device_capability=(9, 0)
    )
    namespace = mxfp4_namespace(platform, has_triton_kernels=True) | {
        "fields": dataclasses.fields,
        "lru_cache": functools.lru_cache,
    }
    return compile_functions(wheel_reader(wheel), SOURCE, FUNCTIONS, namespace)


def run_sglang(fns: dict, ckpt: dict[str, torch.Tensor], experts: int, hidden: int, intermediate: int):
    """SGLang's create_weights, loading and process_weights_after_loading (triton_kernels branch)."""
    method = types.SimpleNamespace(
        use_marlin=False,
        use_mega_moe=False,
        use_deep_gemm=False,
        use_flashinfer=False,
        use_triton_kernels=True,
        _fi_kernel=None,
    )
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_local_experts = experts
    layer.hidden_size = hidden  # FusedMoE.__init__ rounds H for flashinfer_mxfp4 only
    layer.intermediate_size_per_partition = intermediate
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=1.702, gemm1_clamp_limit=7.0, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](method, layer, experts, hidden, intermediate, torch.bfloat16, with_bias=True)
    load_fast_path(layer, ckpt)  # FusedMoE.weight_loader, MXFP4 fast path (expert_id None)
    fns["process_weights_after_loading"](method, layer)
    return method, layer


def dense_buffer(data: torch.Tensor) -> torch.Tensor:
    """The memory the kernel reads, in memory order: triton_kernels' Hopper layouts hand the matmul
    the `.mT` of a dense buffer (mxconvert stores that buffer and records the view)."""
    if data.is_contiguous():
        return data
    if not data.mT.is_contiguous():
        raise SystemExit(f"a storage of strides {data.stride()} is neither dense nor the .mT of a dense buffer")
    return data.mT


def kernel_tensors(method, layer) -> tuple[dict[str, torch.Tensor], dict]:
    """What the triton_kernels matmul reads, and a description of each triton tensor."""
    out: dict[str, torch.Tensor] = {}
    info: dict = {}
    for w in ("w13", "w2"):
        value = getattr(method, f"{w}_weight_triton_tensor")
        scale = getattr(method, f"{w}_precision_config").b_mx_scale
        out[f"out.{w}_weight"] = dense_buffer(value.storage.data)
        out[f"out.{w}_weight_scale"] = dense_buffer(scale.storage.data)
        out[f"out.{w}_weight_bias"] = getattr(layer, f"{w}_weight_bias").data.contiguous()
        for name, t in ((f"{w}_weight", value), (f"{w}_weight_scale", scale)):
            data = t.storage.data
            info[name] = {
                "layout": type(t.storage.layout).__name__,
                "layout_fields": {k: v for k, v in vars(t.storage.layout).items() if isinstance(v, (int, str))},
                "logical_shape": list(t.shape),
                "storage_shape": list(data.shape),
                "storage_stride": list(data.stride()),
            }
        info[f"{w}_b_microblock_size"] = getattr(method, f"{w}_precision_config").b_microblock_size
    return out, info


def main() -> None:
    args = golden_arguments(__doc__.split("\n", 1)[0])
    tk_wheel = triton_kernels_wheel()
    tk_sha = hashlib.sha256(tk_wheel.read_bytes()).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sglang-tk-") as tmp:
        import_triton_kernels(tk_wheel, Path(tmp))
        fns = sglang_functions(args.wheel)
        for seed, (experts, hidden, intermediate) in enumerate(CASES):
            ckpt = gpt_oss_checkpoint(experts, hidden, intermediate, seed)
            method, layer = run_sglang(fns, ckpt, experts, hidden, intermediate)
            out, info = kernel_tensors(method, layer)
            tensors = {f"in.{n}": t for n, t in ckpt.items()} | out
            tensors["params.hidden_padded"] = torch.tensor([method.hidden_size])
            tensors["params.intermediate_padded"] = torch.tensor([method.intermediate_size_per_partition])
            name = f"triton-sm90_sglang-0.5.23_e{experts}_h{hidden}_i{intermediate}.safetensors"
            meta = {
                "sglang": "0.5.23",
                "triton_kernels": f"{TK_REQUIREMENT} (sha256 {tk_sha})",
                "torch": torch.__version__,
                "kernel_tensors": json.dumps(info, sort_keys=True),
            }
            save_file(tensors, str(args.out / name), metadata=meta)
            print("wrote", args.out / name)
            print("  ", json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    main()
