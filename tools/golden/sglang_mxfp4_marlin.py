#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's GPT-OSS MXFP4 MARLIN (`--moe-runner-backend marlin`, SM90+)
expert bytes, made by RUNNING SGLang's own weight creation and Marlin post-processing on CPU
(docs/sglang.md, "Goldens" and "MARLIN").

    /tmp/sglang-env/bin/python tools/golden/sglang_mxfp4_marlin.py   # environment: see sglang_mxfp4_trtllm.py
    python tools/golden/sglang_mxfp4_marlin.py --check-cuda-kernel    # GPU + SGLang 0.5.23 + vLLM: the stand-in

Writes tests/golden/sglang/marlin_sglang-0.5.23_e*_h*_i*.safetensors (random checkpoints, one with
H and I padded, one not) and marlin_sglang-0.5.23_example_digests.json (examples/tiny-gpt-oss at
TP 1 and TP 2, every rank and layer: sha256, dtype and shape of each expert parameter).

What runs is SGLang's code, compiled from the wheel's source as written:
  * layers/quantization/mxfp4.py `Mxfp4MoEMethod.create_weights` (the marlin branch: I -> 128,
    H -> 256, scales filled with `_UE8M0_ONE`) and `process_weights_after_loading` (its marlin
    branch: `check_moe_marlin_supports_layer`, then, GPT-OSS having `gemm1_alpha` 1.702 and
    `gate_up_interleaved`, `deinterleave_moe_mxfp4_w13_for_marlin`, then
    `prepare_moe_mxfp4_layer_for_marlin`);
  * layers/quantization/marlin_utils_fp4.py: `deinterleave_moe_mxfp4_w13_for_marlin`,
    `prepare_moe_mxfp4_layer_for_marlin`, `_repack_moe_fp4_weight_for_marlin`,
    `_permute_moe_fp4_scales_for_marlin`, `mxfp4_marlin_process_scales`, `_normalize_scale_tensor`,
    `_get_optional_param`;
  * layers/quantization/marlin_utils.py: `check_moe_marlin_supports_layer`, `get_scale_perms`,
    `marlin_permute_scales`, `marlin_permute_bias`;
  * models/gpt_oss.py `GptOssForCausalLM._load_mxfp4_experts_weights` for the example (TP slicing).

Stood in (named):
  * `gptq_marlin_repack` (SGLang's JIT CUDA kernel, kernels/jit/csrc/gemm/marlin/gptq_marlin_repack.cuh)
    -> vLLM's test reference `marlin_weights(..., get_weight_perm(4))` on the unpacked nibbles, the
    stand-in tools/golden/mxfp4_vllm_backends.py (`marlin_repack_reference`) and tests_vllm use,
    which vLLM's own test holds equal to its CUDA op. SGLang's kernel is a separate copy, so every
    call is ALSO checked against `repack_as_sglang_kernel`, a line-by-line transcription of that
    .cuh's index arithmetic (the no-perm, 4-bit path SGLang takes); the two must agree or the tool
    stops;
  * `marlin_make_workspace` (reads the CUDA device's SM count) -> int32 zeros of 132 * 4 (an H100
    SXM's 132 SMs): device state, not weight bytes, and not part of the goldens;
  * `get_platform()` -> is_sm90 (an H100); `torch.Tensor.cuda` -> identity;
  * `FusedMoE.__init__`'s attributes (no hidden rounding for marlin: only `flashinfer_mxfp4` rounds;
    `moe_runner_config` with GPT-OSS's activation "silu", gemm1_alpha 1.702, clamp 7.0) and the MXFP4
    fast path of `FusedMoE.weight_loader` (`param.data[:, :dim1, :dim2].copy_(loaded)`), as in
    sglang_mxfp4_trtllm.py.
"""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_example as example  # noqa: E402 - the sibling tools, by path
import sglang_mxfp4_trtllm as trtllm  # noqa: E402
from mxfp4_vllm_backends import marlin_repack_reference  # noqa: E402
from release_standins import modules as stand_in_modules  # noqa: E402
from sglang_common import (  # noqa: E402
    NAMES,
    OUT,
    compile_functions,
    cuda_is_identity,
    gpt_oss_checkpoint,
    load_fast_path,
    sglang_wheel,
    wheel_reader,
)

DIGESTS = OUT / "marlin_sglang-0.5.23_example_digests.json"
#: (experts, hidden, intermediate): one padded (H 192 -> 256, I 160 -> 256), one not. Marlin needs
#: hidden % 64 == 0 (`check_moe_marlin_supports_layer`), so TRT-LLM's H 160 case does not apply.
CASES = ((2, 192, 160), (1, 256, 256))
#: GPT-OSS's MoE runner config (models/gpt_oss.py: hidden_act_alpha default 1.702, swiglu_limit).
GEMM1_ALPHA, GEMM1_CLAMP = 1.702, 7.0
SMS = 132

#: source file -> {class name (None: module level): the functions of it this tool runs}.
FUNCTIONS: dict[str, dict[str | None, set[str]]] = {
    "sglang/srt/layers/quantization/mxfp4.py": {"Mxfp4MoEMethod": {"create_weights", "process_weights_after_loading"}},
    "sglang/srt/layers/quantization/marlin_utils_fp4.py": {
        None: {
            "deinterleave_moe_mxfp4_w13_for_marlin",
            "prepare_moe_mxfp4_layer_for_marlin",
            "_repack_moe_fp4_weight_for_marlin",
            "_permute_moe_fp4_scales_for_marlin",
            "mxfp4_marlin_process_scales",
            "_normalize_scale_tensor",
            "_get_optional_param",
        },
    },
    "sglang/srt/layers/quantization/marlin_utils.py": {
        None: {"check_moe_marlin_supports_layer", "get_scale_perms", "marlin_permute_scales", "marlin_permute_bias"},
    },
}


def _compile_from(read: Callable[[str], str], source: str, namespace: dict) -> dict:
    """The FUNCTIONS of `source`, run as written, in `namespace`."""
    return compile_functions(read, source, FUNCTIONS[source], namespace)


def repack_as_sglang_kernel(b_q_weight: torch.Tensor, size_k: int, size_n: int) -> torch.Tensor:
    """SGLang 0.5.23's `gptq_marlin_repack_kernel<.., num_bits=4, has_perm=false>` transcribed
    (kernels/jit/csrc/gemm/marlin/gptq_marlin_repack.cuh; marlin.cuh: tile_k_size 16, tile_n_size 64):
    per 16x64 tile, thread `th_id` of warp `warp_id` (< 4) reads rows `tc_row + {0, 1, 8, 9}` of
    columns `cur_n` and `cur_n + 8` and writes `out[tile * 128 + th_id * 4 + warp_id]`."""
    assert b_q_weight.dtype == torch.int32 and tuple(b_q_weight.shape) == (size_k // 8, size_n)
    assert size_k % 16 == 0 and size_n % 64 == 0
    words = b_q_weight.view(torch.uint8).reshape(size_k // 8, size_n, 4).to(torch.int64)
    codes = torch.stack([words & 0xF, words >> 4], dim=-1).reshape(size_k // 8, size_n, 8)
    q = codes.permute(0, 2, 1).reshape(size_k, size_n).tolist()  # q[k][n]: bits 4(k%8).. of word [k/8, n]
    out = [0] * (size_k // 16 * size_n * 2)
    n_tiles = size_n // 64
    pack_idx = (0, 2, 4, 6, 1, 3, 5, 7)
    tc_offsets = (0, 1, 8, 9)
    for warp_id in range(4):
        for th_id in range(32):
            cur_n = warp_id * 16 + th_id // 4
            tc_row = (th_id % 4) * 2
            rows = [tc_row + tc_offsets[i] for i in range(4)]
            for k_tile in range(size_k // 16):
                for n_tile in range(n_tiles):
                    k0, n0 = 16 * k_tile, 64 * n_tile
                    vals = [q[k0 + r][n0 + cur_n] for r in rows] + [q[k0 + r][n0 + cur_n + 8] for r in rows]
                    res = sum(vals[pack_idx[i]] << (4 * i) for i in range(8))
                    out[(k_tile * n_tiles + n_tile) * 128 + th_id * 4 + warp_id] = res - (1 << 32 if res >> 31 else 0)
    return torch.tensor(out, dtype=torch.int32).reshape(size_k // 16, size_n * 2)


#: Making goldens (`main`) needs vLLM's repack reference beside the transcription; tests_sglang's
#: environment has no vLLM, and there the transcription alone stands in (its output is then held to
#: the committed goldens, which were made with both and found equal).
REQUIRE_VLLM_REFERENCE = False


def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits):
    """Stand-in for SGLang's `gptq_marlin_repack` (kernels/ops/quantization/gptq_marlin_repack.py):
    vLLM's test reference, checked against the transcription of SGLang's kernel; the transcription
    alone where vLLM is not installed (unless `REQUIRE_VLLM_REFERENCE`)."""
    assert num_bits == 4 and perm.numel() == 0
    transcribed = repack_as_sglang_kernel(b_q_weight, size_k, size_n)
    try:
        out = marlin_repack_reference(b_q_weight, size_k, size_n, num_bits)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "vllm" or REQUIRE_VLLM_REFERENCE:
            raise
        return transcribed
    if not torch.equal(out, transcribed):
        raise SystemExit(f"vLLM's repack reference and SGLang's kernel disagree at size_k={size_k} size_n={size_n}")
    return out


def marlin_make_workspace(device, max_blocks_per_sm: int = 1) -> torch.Tensor:
    """Stand-in for SGLang's `marlin_make_workspace` (marlin_utils.py): the same zeros, for SMS SMs."""
    return torch.zeros(SMS * max_blocks_per_sm, dtype=torch.int, device=device)


def functions(read: Callable[[str], str]) -> dict:
    """SGLang's create_weights / process_weights_after_loading (the namespace they run in), with
    the Marlin helpers they import under `namespace["marlin_modules"]` (module name -> module)."""
    utils = _compile_from(read, "sglang/srt/layers/quantization/marlin_utils.py", {"torch": torch, "FusedMoE": object})
    utils["marlin_make_workspace"] = marlin_make_workspace
    fp4 = _compile_from(
        read,
        "sglang/srt/layers/quantization/marlin_utils_fp4.py",
        {"torch": torch, "Callable": object, "Optional": object, "gptq_marlin_repack": gptq_marlin_repack}
        | {n: utils[n] for n in ("marlin_make_workspace", "marlin_permute_bias", "marlin_permute_scales")},
    )
    modules = {}
    for name, namespace in (("marlin_utils", utils), ("marlin_utils_fp4", fp4)):
        module = types.ModuleType(f"sglang.srt.layers.quantization.{name}")
        module.__dict__.update(namespace)
        modules[module.__name__] = module
    platform = types.SimpleNamespace(is_sm100=False, is_sm90=True, is_sm120=False, is_cuda=True)
    namespace = trtllm._namespace() | {"get_platform": lambda: platform, "math": math}
    compiled = _compile_from(read, "sglang/srt/layers/quantization/mxfp4.py", namespace)
    compiled["marlin_modules"] = modules
    return compiled


def marlin_imports(fns: dict):
    """`process_weights_after_loading` imports the Marlin helpers by module name: the compiled ones
    answer while it runs (and the real modules, where SGLang is installed, are restored after)."""
    return stand_in_modules(fns["marlin_modules"])


def new_layer(fns: dict, experts: int, hidden: int, intermediate: int, tp: int = 1, rank: int = 0):
    """A layer after FusedMoE.__init__ (marlin: no hidden rounding) and SGLang's create_weights."""
    method = types.SimpleNamespace(use_marlin=True, use_mega_moe=False, use_deep_gemm=False, use_flashinfer=False)
    method._fi_kernel = None
    layer: Any = torch.nn.Module()
    layer.num_local_experts = experts
    layer.hidden_size = hidden
    layer.intermediate_size_per_partition = intermediate // tp
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(
        gemm1_alpha=GEMM1_ALPHA,
        gemm1_clamp_limit=GEMM1_CLAMP,
        gate_up_interleaved=True,
        apply_router_weight_on_input=False,
        is_gated=True,
        activation="silu",
    )
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](
        method, layer, experts, hidden, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    return method, layer


def post_process(fns: dict, method, layer) -> dict[str, torch.Tensor]:
    """SGLang's process_weights_after_loading (marlin branch) on the layer; its six expert tensors."""
    with cuda_is_identity(), marlin_imports(fns):
        fns["process_weights_after_loading"](method, layer)
    assert layer._mxfp4_backend == "marlin"
    return {n: getattr(layer, n).data.contiguous() for n in NAMES}


def small_case(fns: dict, experts: int, hidden: int, intermediate: int, seed: int) -> dict[str, torch.Tensor]:
    ckpt = gpt_oss_checkpoint(experts, hidden, intermediate, seed)
    method, layer = new_layer(fns, experts, hidden, intermediate)
    load_fast_path(layer, ckpt)
    out = post_process(fns, method, layer)
    padded = {
        "params.hidden_padded": torch.tensor([method.hidden_size]),
        "params.intermediate_padded": torch.tensor([method.intermediate_size_per_partition]),
    }
    return {f"in.{n}": t for n, t in ckpt.items()} | {f"out.{n}": t for n, t in out.items()} | padded


def example_digests(fns: dict, wheel: str) -> dict:
    """sglang_mxfp4_example.py's digests of examples/tiny-gpt-oss, SGLang's Marlin post-processing run."""
    load_experts = example.expert_loader(wheel_reader(wheel), example.loader_namespace())
    config = json.loads((example.EXAMPLE / "config.json").read_text())
    experts, hidden, intermediate = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]

    def run_layer(layer_id: int, tp: int, rank: int) -> dict[str, torch.Tensor]:
        method, layer = new_layer(fns, experts, hidden, intermediate, tp, rank)
        example.load_example_layer(load_experts, layer, layer_id, config)
        return post_process(fns, method, layer)

    return example.example_digests(run_layer, config)


def check_cuda_kernel(sizes=((256, 512), (512, 768), (384, 1024))) -> None:
    """On a CUDA machine with SGLang 0.5.23 installed: SGLang's own `gptq_marlin_repack` (the JIT
    kernel this tool stands in) against the stand-in and the transcription, on random words."""
    from sglang.kernels.ops.quantization.gptq_marlin_repack import gptq_marlin_repack as sglang_repack

    g = torch.Generator().manual_seed(0)
    for size_k, size_n in sizes:
        words = torch.randint(-(2**31), 2**31, (size_k // 8, size_n), generator=g, dtype=torch.int64).to(torch.int32)
        perm = torch.empty(0, dtype=torch.int, device="cuda")
        got = sglang_repack(words.cuda(), perm, size_k, size_n, 4).cpu()
        reference = marlin_repack_reference(words, size_k, size_n, 4)
        transcribed = repack_as_sglang_kernel(words, size_k, size_n)
        ok = torch.equal(got, reference) and torch.equal(got, transcribed)
        print(f"size_k={size_k} size_n={size_n}: SGLang's CUDA kernel {'==' if ok else '!='} the stand-in")
        if not ok:
            raise SystemExit(1)


def main() -> None:
    global REQUIRE_VLLM_REFERENCE
    if sys.argv[1:] == ["--check-cuda-kernel"]:
        check_cuda_kernel()
        return
    REQUIRE_VLLM_REFERENCE = True  # goldens: both stand-ins, found equal
    wheel = sglang_wheel()
    fns = functions(wheel_reader(wheel))
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {"sglang": "0.5.23", "torch": torch.__version__, "made_by": "tools/golden/sglang_mxfp4_marlin.py"}
    for seed, (experts, hidden, intermediate) in enumerate(CASES):
        tensors = small_case(fns, experts, hidden, intermediate, seed)
        path = OUT / f"marlin_sglang-0.5.23_e{experts}_h{hidden}_i{intermediate}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        print("wrote", path)
    document = {
        "what": "sha256 of SGLang 0.5.23's expert parameters after process_weights_after_loading (marlin, SM90)",
        "checkpoint": "examples/tiny-gpt-oss",
        **meta,
        "digests": example_digests(fns, wheel),
    }
    DIGESTS.write_text(json.dumps(document, indent=1) + "\n")
    print("wrote", DIGESTS)


if __name__ == "__main__":
    main()
