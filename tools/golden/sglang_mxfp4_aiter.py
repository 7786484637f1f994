#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's GPT-OSS MXFP4 AITER expert bytes (ROCm gfx95x with
SGLANG_USE_AITER=1: AITER_MXFP4_BF16), made by RUNNING SGLang's own weight creation, expert loading
and post-processing on CPU (docs/sglang.md, "AITER").

What runs is SGLang's code, from the wheel: `Mxfp4MoEMethod.create_weights` (its `_use_aiter`
branch: I padded to 256, H to 256, scales filled with 0x7F), `process_weights_after_loading` (its
`_use_aiter` branch: biases to float32, the gate/up de-interleave of w13's weights, scales and bias
over the padded rows, then `shuffle_weight_a16w4` / `shuffle_scale_a16w4` since
SGLANG_USE_AITER_MOE_GU_ITLV is on by default), `_aiter_situ_uses_gu_interleaved_weights`
(layers/quantization/mxfp4.py) and `GptOssForCausalLM._load_mxfp4_experts_weights`
(models/gpt_oss.py), with the environment SGLang reads at its defaults: SGLANG_USE_AITER=1,
SGLANG_AITER_K3_OPT unset (off), SGLANG_USE_AITER_MOE_GU_ITLV unset (on).

Stood in (named):
  * `from aiter.ops.shuffle import shuffle_weight, shuffle_weight_a16w4, shuffle_scale,
    shuffle_scale_a16w4` (mxfp4.py's module level, on ROCm) -> AITER's own `aiter/ops/shuffle.py`
    (pure torch), read out of the cached amd-aiter 0.1.7.post2.dev18 wheel (the file
    tests_vllm/harness_rocm.py runs for vLLM's AITER, checked by the same sha256);
  * `_is_hip` / `_use_aiter` -> True, `_aiter_k3_opt` -> False (module-level flags of mxfp4.py, read
    from the environment at import); `envs.SGLANG_USE_AITER_MOE_GU_ITLV.get()` -> True (its
    `EnvBool(True)` default, environ.py); `get_bool_env_var` -> False for the AITER_SITUV2_* variables
    (never read for GPT-OSS, whose activation is not "situ");
  * `get_platform()` -> a ROCm device (no is_sm90 / is_sm100 / is_sm120); `FusedMoE.__init__`'s
    attributes as SGLang sets them (no hidden rounding outside `flashinfer_mxfp4`: create_weights
    rounds H to 256 itself), the model object and the MXFP4 fast path of `FusedMoE.weight_loader`
    as for the other SGLang goldens (tools/golden/sglang_mxfp4_example.py, sglang_common.py).

    .venv-sglang/bin/python tools/golden/sglang_mxfp4_aiter.py   # writes tests/golden/sglang/
"""

from __future__ import annotations

import glob
import hashlib
import json
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_example as golden_example  # noqa: E402 - the sibling tools, by path
from sglang_common import (  # noqa: E402
    NAMES,
    OUT,
    WHEELS,
    compile_functions,
    cuda_is_identity,
    gpt_oss_checkpoint,
    load_fast_path,
    mxfp4_namespace,
    sglang_wheel,
    wheel_reader,
)

SOURCE = "sglang/srt/layers/quantization/mxfp4.py"
FUNCTIONS: dict[str | None, set[str]] = {
    None: {"_aiter_situ_uses_gu_interleaved_weights"},
    "Mxfp4MoEMethod": {"create_weights", "process_weights_after_loading"},
}
AITER_WHEEL = "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
#: sha256 of that wheel's aiter/ops/shuffle.py (tests_vllm/harness_rocm.py `AITER_SHUFFLE_SHA256`).
AITER_SHUFFLE_SHA256 = "8cbf0cf9a78cf9d6dc1e8fb75d64f6e67bf0dad7f2c24c41b07e50171905f37d"
#: (experts, hidden, intermediate) of the random-checkpoint cases (seed = index): one padded
#: (H 160 -> 256, I 160 -> 256), one not (H = I = 256); the example (I 320 -> 512) adds I past one 256.
CASES = ((2, 160, 160), (1, 256, 256))
TAG = "aiter-gfx950"


def aiter_shuffle() -> types.ModuleType:
    """AITER's `aiter/ops/shuffle.py` from the cached amd-aiter wheel, checked by its sha256."""
    wheel = next(iter(sorted(glob.glob(str(WHEELS / AITER_WHEEL)))), None)
    if wheel is None:
        raise SystemExit(f"no {WHEELS / AITER_WHEEL}: pip download --no-deps amd-aiter==0.1.7.post2.dev18 -d {WHEELS}")
    source = zipfile.ZipFile(wheel).read("aiter/ops/shuffle.py")
    found = hashlib.sha256(source).hexdigest()
    if found != AITER_SHUFFLE_SHA256:
        raise SystemExit(f"aiter/ops/shuffle.py of {wheel}: sha256 {found}, expected {AITER_SHUFFLE_SHA256}")
    module = types.ModuleType("aiter.ops.shuffle")
    exec(compile(source, "aiter/ops/shuffle.py", "exec"), module.__dict__)  # noqa: S102 - AITER's own code
    return module


def aiter_namespace() -> dict:
    """What mxfp4.py's AITER branches and the model's expert loader look up, on a ROCm gfx95x host."""
    shuffle = aiter_shuffle()
    platform = types.SimpleNamespace(is_cuda=False, is_sm90=False, is_sm100=False, is_sm120=False)
    env_gu_itlv = types.SimpleNamespace(get=lambda: True)  # environ.py: EnvBool(True)
    return (
        mxfp4_namespace(platform, has_triton_kernels=False)
        | {"math": golden_example.math, "default_weight_loader": golden_example.fused_moe_fast_path}
        | {
            "_is_hip": True,
            "_use_aiter": True,
            "_aiter_k3_opt": False,
            "envs": types.SimpleNamespace(SGLANG_USE_AITER_MOE_GU_ITLV=env_gu_itlv),
            "get_bool_env_var": lambda name, default="false": False,
            "shuffle_weight": shuffle.shuffle_weight,
            "shuffle_weight_a16w4": shuffle.shuffle_weight_a16w4,
            "shuffle_scale": getattr(shuffle, "shuffle_scale", None),
            "shuffle_scale_a16w4": shuffle.shuffle_scale_a16w4,
        }
    )


def compile_aiter(read) -> dict:
    namespace = aiter_namespace()
    compile_functions(read, SOURCE, FUNCTIONS, namespace)
    golden_example.expert_loader(read, namespace)
    return namespace


def build_layer(fns: dict, experts: int, hidden: int, intermediate: int, tp: int, rank: int, activation: str):
    """What `FusedMoE.__init__` + `Mxfp4MoEMethod.create_weights` make for one layer (method, layer)."""
    method: Any = types.SimpleNamespace(
        use_marlin=False,
        use_mega_moe=False,
        use_deep_gemm=False,
        use_flashinfer=False,
        use_triton_kernels=False,
        _fi_kernel=None,
        prefix="",
    )
    layer: Any = torch.nn.Module()  # FusedMoE's attributes are set on it below
    layer.num_experts = experts
    layer.num_local_experts = experts
    layer.num_fused_shared_experts = 0
    layer.hidden_size = hidden  # FusedMoE rounds H only for flashinfer_mxfp4
    layer.intermediate_size_per_partition = intermediate // tp
    layer.moe_tp_rank, layer.moe_tp_size, layer.moe_ep_rank, layer.moe_ep_size = rank, tp, 0, 1
    layer.moe_runner_config = types.SimpleNamespace(
        activation=activation, gemm1_alpha=1.702, gemm1_clamp_limit=7.0, gate_up_interleaved=True
    )
    method.moe_runner_config = layer.moe_runner_config
    fns["create_weights"](
        method, layer, experts, hidden, layer.intermediate_size_per_partition, torch.bfloat16, with_bias=True
    )
    return method, layer


def post_process(fns: dict, method: Any, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """SGLang's `process_weights_after_loading` (AITER branch); the six parameters after it."""
    with cuda_is_identity():
        fns["process_weights_after_loading"](method, layer)
    if not all(getattr(getattr(layer, n), "is_shuffled", False) for n in ("w13_weight", "w2_weight")):
        raise AssertionError("SGLang's AITER branch did not tag the weights is_shuffled")
    return {n: getattr(layer, n).data.contiguous() for n in NAMES}


def random_case(fns: dict, case: int) -> dict[str, torch.Tensor]:
    """Inputs (`in.*`, one TP=1 rank of a random GPT-OSS checkpoint) and SGLang's parameters after
    post-processing (`out.*`) of case `case`."""
    experts, hidden, intermediate = CASES[case]
    ckpt = gpt_oss_checkpoint(experts, hidden, intermediate, case)
    method, layer = build_layer(fns, experts, hidden, intermediate, 1, 0, "silu")
    load_fast_path(layer, ckpt)  # FusedMoE.weight_loader, MXFP4 fast path (expert_id None)
    out = post_process(fns, method, layer)
    return {f"in.{n}": t for n, t in ckpt.items()} | {f"out.{n}": t for n, t in out.items()}


def rank_layer(fns: dict, config: dict, layer_id: int, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """SGLang's expert parameters of one example layer on one TP rank, after post-processing."""
    method, layer = build_layer(
        fns,
        config["num_local_experts"],
        config["hidden_size"],
        config["intermediate_size"],
        tp,
        rank,
        config.get("hidden_act", "silu"),
    )
    golden_example.load_example_layer(fns["_load_mxfp4_experts_weights"], layer, layer_id, config)
    return post_process(fns, method, layer)


def main() -> None:
    import argparse

    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", default=None, help="the sglang 0.5.23 wheel (default: the cached one)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    fns = compile_aiter(wheel_reader(args.wheel or sglang_wheel()))
    config = json.loads((golden_example.EXAMPLE / "config.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"sglang": "0.5.23", "aiter_shuffle": AITER_WHEEL, "torch": torch.__version__}
    for case, (experts, hidden, intermediate) in enumerate(CASES):
        path = args.out / f"{TAG}_sglang-0.5.23_e{experts}_h{hidden}_i{intermediate}.safetensors"
        save_file(random_case(fns, case), str(path), metadata=meta)
        print("wrote", path)
    document = {
        "what": "sha256 of SGLang 0.5.23's expert parameters after process_weights_after_loading (AITER, gfx95x)",
        "checkpoint": "examples/tiny-gpt-oss",
        **meta,
        "env": {"SGLANG_USE_AITER": "1", "SGLANG_AITER_K3_OPT": "unset", "SGLANG_USE_AITER_MOE_GU_ITLV": "unset"},
        "made_by": "tools/golden/sglang_mxfp4_aiter.py",
        "digests": golden_example.example_digests(lambda lid, tp, rank: rank_layer(fns, config, lid, tp, rank), config),
    }
    path = args.out / f"{TAG}_sglang-0.5.23_example_digests.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
