#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer CUTLASS expert bytes (SM90:
FLASHINFER_CUTLASS_MXFP4_BF16, `_process_weights_for_sm90_cutlass`; SM120:
FLASHINFER_CUTLASS_MXFP4_MXFP8, `_process_weights_for_sm120_cutlass`), made by RUNNING SGLang's own
weight creation, expert loading and post-processing on CPU (docs/sglang.md, "FLASHINFER_CUTLASS").

What runs is SGLang's code, from the wheel (or, for tests_sglang, the installed package):
`Mxfp4MoEMethod.create_weights` (cutlass branch: no padding at creation, `_padded_intermediate` /
`_padded_hidden` = round_up(., 128), scales filled with 0x7F), `process_weights_after_loading`, the
two `_process_weights_for_sm*_cutlass` methods (layers/quantization/mxfp4.py) and
`GptOssForCausalLM._load_mxfp4_experts_weights` (models/gpt_oss.py), with FlashInfer 0.7.2 (SGLang's
pin) `interleave_moe_scales_for_sm90_mixed_gemm` (plain torch, run as is).

Stood in (named), besides those of sglang_mxfp4_example.py / sglang_mxfp4_trtllm.py (whose namespace
this reuses: the model object, the MXFP4 fast path of `FusedMoE.weight_loader`, `Tensor.cuda`):
  * `interleave_moe_weights_for_sm90_mixed_gemm` (FlashInfer, CUDA-only op of its `fused_moe_90` JIT
    module) -> tests_vllm/harness_sm90.py's `Sm90Interleave`: "replay" returns the bytes FlashInfer's
    own kernel produced on a GPU for exactly that input (tests_sglang/data/sm90_interleave/, recorded
    by tools/gpu_check/sglang_sm90_record.py; see its README.md), "record" collects the inputs;
  * `block_scale_interleave` (SM120 scales; FlashInfer, CUDA-only JIT) -> FlashInfer 0.7.2's
    pure-torch 128x4 swizzle `_swizzle_sf_128x4`, expert by expert (the stand-in of the TRT-LLM
    goldens; SGLang's sizes are whole 128-row, 4-column tiles, so no padding is involved);
  * `get_platform()` -> is_sm90 (or is_sm120); `FusedMoE.__init__`'s attributes as SGLang sets them
    (hidden rounded to 256 for flashinfer_mxfp4, `hidden_size_unpadded`, intermediate / TP).

    .venv-sglang/bin/python tools/golden/sglang_mxfp4_cutlass.py   # writes tests/golden/sglang/
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_example as golden_example  # noqa: E402 - the sibling tools, by path
import sglang_mxfp4_trtllm as golden_trtllm  # noqa: E402
from sglang_common import (  # noqa: E402
    NAMES,
    ROOT,
    compile_functions,
    cuda_is_identity,
    gpt_oss_checkpoint,
    load_fast_path,
    round_up,
)

#: The two CUTLASS kernels of `Mxfp4MoEMethod` (its `_fi_kernel`) and the device each runs on.
KERNELS = {"cutlass_sm90": "is_sm90", "cutlass_sm120": "is_sm120"}
#: mxconvert's backend name of each kernel.
BACKENDS = {"cutlass_sm90": "FLASHINFER_CUTLASS_MXFP4_BF16", "cutlass_sm120": "FLASHINFER_CUTLASS_MXFP4_MXFP8"}
#: What this tool runs of mxfp4.py besides the TRT-LLM tool's functions.
FUNCTIONS: dict[str | None, set[str]] = {
    "Mxfp4MoEMethod": {
        "create_weights",
        "process_weights_after_loading",
        "_process_weights_for_sm90_cutlass",
        "_process_weights_for_sm120_cutlass",
    },
}
SM90_DATA = ROOT / "tests_sglang" / "data" / "sm90_interleave"
SM90_RESULTS = SM90_DATA / "fi_sm90_outputs.safetensors"


def sm90_interleave_module():
    """tests_vllm/harness_sm90.py (its `Sm90Interleave` and `input_key`, reused, not copied). It
    imports tests_vllm's `harness` by that name; only its `path_a` / `sm90_interleave` use it, so a
    caller whose `harness` is another module (tests_sglang) still gets the same class."""
    import importlib.util

    name = "harness_sm90"
    if name in sys.modules:
        return sys.modules[name]
    tests_vllm = str(ROOT / "tests_vllm")
    if "harness" not in sys.modules:
        sys.path.insert(0, tests_vllm)
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests_vllm" / "harness_sm90.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def batched_swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """`block_scale_interleave` of a 3-D [E, R, C] uint8 tensor, expert by expert, by FlashInfer's
    pure-torch `_swizzle_sf_128x4`; only whole 128x4 tiles (SGLang's CUTLASS sizes) are accepted."""
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4

    if sf.dim() != 3 or sf.dtype != torch.uint8 or sf.shape[1] % 128 or sf.shape[2] % 4:
        raise AssertionError(f"unexpected block_scale_interleave call: {sf.dtype} {tuple(sf.shape)}")
    return torch.cat([_swizzle_sf_128x4(e) for e in sf]).reshape(-1)


def cutlass_namespace(kernel: str, sm90_weights: Callable) -> dict:
    """sglang_mxfp4_example.py's namespace (TRT-LLM tool's + the model loader's) on an SM90 / SM120
    platform, with FlashInfer's SM90 helpers: the weight interleave `sm90_weights` (stand-in), the
    scale interleave FlashInfer 0.7.2's own."""
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    flags = {flag: flag == KERNELS[kernel] for flag in ("is_sm90", "is_sm100", "is_sm120")}
    platform = types.SimpleNamespace(is_cuda=True, **flags)
    return golden_example.loader_namespace() | {
        "get_platform": lambda: platform,
        "interleave_moe_weights_for_sm90_mixed_gemm": sm90_weights,
        "interleave_moe_scales_for_sm90_mixed_gemm": interleave_moe_scales_for_sm90_mixed_gemm,
    }


def compile_cutlass(read: Callable[[str], str], namespace: dict) -> dict:
    """The TRT-LLM tool's functions, this tool's and the model's expert loader, compiled into `namespace`."""
    compile_functions(read, golden_trtllm.SOURCE, golden_trtllm.FUNCTIONS, namespace)
    compile_functions(read, golden_trtllm.SOURCE, FUNCTIONS, namespace)
    golden_example.expert_loader(read, namespace)
    return namespace


@contextlib.contextmanager
def sm120_scale_interleave() -> Iterator[None]:
    """`from flashinfer import block_scale_interleave` (inside `_process_weights_for_sm120_cutlass`)
    answered by `batched_swizzle_128x4`."""
    import flashinfer

    saved = flashinfer.block_scale_interleave
    flashinfer.block_scale_interleave = batched_swizzle_128x4
    try:
        yield
    finally:
        flashinfer.block_scale_interleave = saved


def method_for(fns: dict, kernel: str) -> Any:
    """An `Mxfp4MoEMethod` as `__init__` leaves it for `flashinfer_mxfp4` on SM90 (bf16, not Humming)
    or SM120, its methods SGLang's compiled source."""
    method: Any = types.SimpleNamespace(
        use_marlin=False,
        use_mega_moe=False,
        use_deep_gemm=False,
        use_flashinfer=True,
        use_triton_kernels=False,
        _use_sm90_humming=False,
        _fi_kernel=kernel,
        prefix="",
        with_bias=False,
    )
    for name in ("_process_weights_for_sm90_cutlass", "_process_weights_for_sm120_cutlass"):
        setattr(method, name, lambda layer, _f=fns[name]: _f(method, layer))
    return method


def build_layer(fns: dict, kernel: str, experts: int, hidden: int, intermediate: int, tp: int, rank: int):
    """What `FusedMoE.__init__` + `Mxfp4MoEMethod.create_weights` make for one layer (method, layer)."""
    method = method_for(fns, kernel)
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_experts = experts
    layer.num_local_experts = experts
    layer.num_fused_shared_experts = 0
    layer.hidden_size_unpadded = hidden
    layer.hidden_size = round_up(hidden, 256)  # FusedMoE.__init__ for mxfp4 + flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    method.moe_runner_config = layer.moe_runner_config
    layer.quant_method = method
    fns["create_weights"](
        method, layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    return method, layer


def post_process(fns: dict, method: Any, layer: torch.nn.Module) -> None:
    """SGLang's `process_weights_after_loading` with the CPU stand-ins in place."""
    with cuda_is_identity(), sm120_scale_interleave():
        fns["process_weights_after_loading"](method, layer)


def rank_layer(fns: dict, kernel: str, config: dict, layer_id: int, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """SGLang's expert parameters of one example layer on one TP rank, after post-processing."""
    method, layer = build_layer(
        fns, kernel, config["num_local_experts"], config["hidden_size"], config["intermediate_size"], tp, rank
    )
    golden_example.load_example_layer(fns["_load_mxfp4_experts_weights"], layer, layer_id, config)
    post_process(fns, method, layer)
    return {n: getattr(layer, n).data.contiguous() for n in NAMES}


def example_config() -> dict:
    return json.loads((golden_example.EXAMPLE / "config.json").read_text())


#: (experts, hidden, intermediate) of the random-checkpoint cases (seed = index): the TRT-LLM tool's,
#: one padded (H 160 -> 256 by FusedMoE, I 160 -> 256 after loading), one not.
CASES = golden_trtllm.CASES


def random_case(fns: dict, kernel: str, case: int) -> dict[str, torch.Tensor]:
    """Inputs (`in.*`, one TP=1 rank of a random GPT-OSS checkpoint) and SGLang's parameters after
    post-processing (`out.*`) of case `case`."""
    experts, hidden, intermediate = CASES[case]
    ckpt = gpt_oss_checkpoint(experts, hidden, intermediate, case)
    method, layer = build_layer(fns, kernel, experts, hidden, intermediate, 1, 0)
    load_fast_path(layer, ckpt)  # FusedMoE.weight_loader, MXFP4 fast path (expert_id None)
    post_process(fns, method, layer)
    return {f"in.{n}": t for n, t in ckpt.items()} | {f"out.{n}": getattr(layer, n).data.contiguous() for n in NAMES}


def sm90_stand_in():
    """`Sm90Interleave("replay")` over the GPU outputs in tests_sglang/data/sm90_interleave/."""
    from safetensors.torch import load_file

    module = sm90_interleave_module()
    if not SM90_RESULTS.exists():
        raise SystemExit(
            f"no {SM90_RESULTS}: record the inputs (tools/gpu_check/sglang_sm90_record.py) and run FlashInfer's "
            "kernel on a GPU (tools/gpu_check/sglang_sm90_gpu.sh) first; --kernels cutlass_sm120 needs no GPU"
        )
    return module.Sm90Interleave("replay", load_file(str(SM90_RESULTS)))


def no_sm90_interleave(weight, quant_type="fp4"):
    """The SM120 path never calls FlashInfer's SM90 weight interleave."""
    raise AssertionError("the SM120 path called interleave_moe_weights_for_sm90_mixed_gemm")


def main() -> None:
    import argparse

    from safetensors.torch import save_file
    from sglang_common import OUT, digest, pinned_flashinfer, sglang_wheel, wheel_reader

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", default=None, help="the sglang 0.5.23 wheel (default: the cached one)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--kernels", nargs="+", choices=sorted(KERNELS), default=sorted(KERNELS))
    args = parser.parse_args()
    read = wheel_reader(args.wheel or sglang_wheel())
    flashinfer = pinned_flashinfer()
    config = example_config()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"sglang": "0.5.23", "flashinfer": flashinfer.__version__, "torch": torch.__version__}
    for kernel in args.kernels:
        stand_in = sm90_stand_in() if kernel == "cutlass_sm90" else no_sm90_interleave
        fns = compile_cutlass(read, cutlass_namespace(kernel, stand_in))
        tag = kernel.replace("_", "-")
        for case, (experts, hidden, intermediate) in enumerate(CASES):
            path = args.out / f"{tag}_sglang-0.5.23_e{experts}_h{hidden}_i{intermediate}.safetensors"
            save_file(random_case(fns, kernel, case), str(path), metadata=meta)
            print("wrote", path)
        digests: dict = {}
        for tp in golden_example.TP_SIZES:
            for rank in range(tp):
                for layer in range(config["num_hidden_layers"]):
                    tensors = rank_layer(fns, kernel, config, layer, tp, rank)
                    digests.setdefault(f"tp{tp}", {}).setdefault(f"rank{rank}", {})[f"layer{layer}"] = {
                        n: digest(t) for n, t in tensors.items()
                    }
        document = {
            "what": f"sha256 of SGLang 0.5.23's expert parameters after process_weights_after_loading ({kernel})",
            "checkpoint": "examples/tiny-gpt-oss",
            **meta,
            "sm90_weight_interleave": (
                "FlashInfer's kernel on a GPU, replayed (tests_sglang/data/sm90_interleave/)"
                if kernel == "cutlass_sm90"
                else "not called"
            ),
            "made_by": "tools/golden/sglang_mxfp4_cutlass.py",
            "digests": digests,
        }
        path = args.out / f"{tag}_sglang-0.5.23_example_digests.json"
        path.write_text(json.dumps(document, indent=1) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
