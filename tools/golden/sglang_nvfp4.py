#!/usr/bin/env python3
"""Golden data for SGLang 0.5.23's NVFP4 (ModelOpt) FlashInfer TRT-LLM expert bytes, the backend SGLang
picks on a B200, its Marlin bytes (an H100) and its FlashInfer CUTLASS bytes (`--moe-runner-backend
flashinfer_cutlass` on Blackwell), made by RUNNING SGLang's own weight creation, loading and
post-processing on CPU (docs/sglang.md, "NVFP4").

Environment: /work/main/.venv-sglang (tools/sglang_env/setup.sh: sglang 0.5.23 and FlashInfer 0.7.2
without their CUDA stack, torch CPU):

    .venv-sglang/bin/python tools/golden/sglang_nvfp4.py       # writes tests/golden/sglang/nvfp4-*
    .venv-sglang/bin/python tools/golden/sglang_nvfp4.py --only-ct   # only nvfp4-ct-marlin_*
    .venv-sglang/bin/python tools/golden/sglang_nvfp4.py --only-cutedsl   # only nvfp4-cutedsl_*
    .venv-sglang/bin/python tools/golden/sglang_nvfp4.py --only-ct-cutlass   # only nvfp4-ct-cutlass_*
    .venv-sglang/bin/python tools/golden/sglang_nvfp4.py --only-ct-trtllm   # only nvfp4-ct-trtllm_*

What runs is SGLang's code, read from the wheel and executed as written (importing the modules needs
SGLang's CUDA stack, so the functions are compiled from the wheel's source into one namespace):

* layers/quantization/modelopt_quant.py: `ModelOptNvFp4FusedMoEMethod.__init__`, `create_weights`,
  `process_weights_after_loading` (its `enable_flashinfer_trtllm_moe` branch) and the properties they
  read, `_make_per_tensor_scale_parameter`, `_compute_gemm1_alphas`;
* layers/moe/moe_runner/flashinfer_trtllm.py: `align_fp4_moe_weights_for_flashinfer_trtllm`,
  `_align_fp4_moe_weights`, `_compute_g1_scale_c`, `trtllm_nvfp4_hidden_alignment`;
* layers/quantization/utils.py: `prepare_static_weights_for_trtllm_fp4_moe`, with FlashInfer 0.7.2's
  `_maybe_get_cached_w3_w1_permute_indices` / `get_w2_permute_indices_with_cache`;
* layers/moe/fused_moe_triton/layer.py: `FusedMoE._load_w13`, `_load_w2`,
  `_load_model_weight_or_group_weight_scale`, `_load_per_tensor_weight_scale`, `_load_single_value`,
  `use_padded_loading`, `_weight_layout_method` (the per-expert loading, padding zeroed);
  model_loader/weight_utils.py `narrow_padded_param_and_loaded_weight` and its helpers;
  layers/utils/common.py `copy_or_rebind_param`, `alias_or_bind_derived_param`;
* compressed-tensors (`nvfp4-ct-marlin_*`, SGLang's path on SM80-SM90):
  layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py
  `CompressedTensorsW4A16Nvfp4MoE.__init__` / `create_weights` / `process_weights_after_loading` (and its
  `NVFP4_GROUP_SIZE`), compressed_tensors.py `CompressedTensorsFusedMoEMethod.__init__` /
  `create_weights` / `process_weights_after_loading`, then the same `prepare_moe_nvfp4_layer_for_marlin`;
  `FusedMoE.weight_loader`'s compressed-tensors dispatch is re-enacted in `_ct_load`;
* CUTLASS: the same `process_weights_after_loading` (its CUTLASS branch), layers/quantization/utils.py
  `swizzle_blockscale` and layers/moe/moe_runner/flashinfer_cutlass.py
  `materialize_swiglu_params_for_cutlass` (pure torch: no stand-in needed for the bytes).
* CuTe DSL (`nvfp4-cutedsl_*`, `--moe-runner-backend flashinfer_cutedsl`, the v2 standard path): the same
  `process_weights_after_loading` (its `_is_cutedsl_v2_standard` branches), layers/moe/moe_runner/
  flashinfer_cutedsl.py `interleave_w13_halves`, `_FP4_SF_VEC_SIZE`, and the scalars the runner reads
  (`resolve_cutedsl_standard_scales`, `cutedsl_quant_scale_to_scalar`: what `ensure_cutedsl_wrapper`
  keeps as `layer._cutedsl_scales` / `_cutedsl_input_scale` at the first forward), recorded as
  `cutedsl.w1_alpha`, `cutedsl.fc2_input_scale`, `cutedsl.w2_alpha`, `cutedsl.used_input_scale`;
  FlashInfer 0.7.2's `convert_sf_to_mma_layout` and `ceil_div` (flashinfer/cute_dsl/utils.py, pure
  torch) compiled from the installed FlashInfer's source (importing that module needs the CUTLASS DSL).

Stood in (named):
  * `nvfp4_block_scale_interleave` (FlashInfer, CUDA-only JIT) -> FlashInfer 0.7.2's own pure-torch
    128x4 swizzle `_swizzle_sf_128x4` (as tools/golden/sglang_mxfp4_trtllm.py);
  * `ModelWeightParameter` / `PerTensorScaleParameter` -> a `Parameter` carrying the given attributes;
  * `get_moe_runner_backend()` -> flashinfer_trtllm (what SGLang's override makes of "auto" on SM100
    for the Qwen3-MoE and DeepSeek families); `get_moe_a2a_backend()` -> none; `get_platform()` ->
    Blackwell; `envs` -> defaults (off); `layer.dispatcher` -> `Dispatcher` (keeps its quant config);
  * `FusedMoE.__init__`: the layer attributes the code reads, and what its `create_moe_runner` call
    sets on the method (`moe_runner_config`, `_moe_runner_backend`; for CuTe DSL `layer._cutedsl_wrapper`
    None, so `refresh_cutedsl_standard_scales_for_weight_update` is not reached);
  * `ensure_cutedsl_wrapper` (it builds FlashInfer's CUDA `CuteDslMoEWrapper`) -> its scale step alone,
    SGLang's `resolve_cutedsl_standard_scales(layer)`; `print_warning_once` / `log_info_on_rank0` -> logging;
  * `FusedMoE.weight_loader`'s dispatch (a few lines per case: "weight" / "weight_scale" to
    `_load_model_weight_or_group_weight_scale`, "weight_scale_2" to `_load_per_tensor_weight_scale`,
    "input_scale" to `_load_single_value`, by shard id w1 / w3 / w2) is re-enacted in `_load`.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import json
import logging
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_mxfp4_marlin as marlin_tool  # noqa: E402 - the sibling tool's Marlin stand-ins, by path
from release_standins import modules as stand_in_modules  # noqa: E402
from sglang_common import (  # noqa: E402
    ROOT,
    digest,
    golden_arguments,
    pinned_flashinfer,
    round_up,
    wheel_reader,
)

EXAMPLE = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
#: A second example whose intermediate size (96) SGLang's TRT-LLM path pads (to 128), at TP 1 (at TP 2
#: SGLang slices it unevenly, which convert refuses); its MoE layers are 1 and 2 (layer 0 is dense).
EXAMPLE_PADDED = ROOT / "examples" / "tiny-nvfp4-modelopt-deepseek"
#: (experts, hidden, intermediate) per case: I 96 is padded to 128 by create_weights, 128 is not.
CASES = ((2, 256, 96), (2, 128, 128))
#: Marlin cases (SGLang's pick on an H100): I 192 is not a multiple of 128 (SGLang pads gated layers not).
MARLIN_CASES = ((2, 256, 128), (1, 128, 192))
#: What a Marlin golden records of the layer after post-processing.
MARLIN_OUTPUTS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2",
                  "w2_weight_scale_2", "workspace")  # fmt: skip
#: FlashInfer CUTLASS cases (`--moe-runner-backend flashinfer_cutlass` on Blackwell): H 160 pads the
#: swizzled scales' columns (10 -> 12) and the w2 scale rows (160 -> 256); a gated 2I must be a multiple
#: of 128 (SGLang asserts before padding one), so I is 64 or 128.
CUTLASS_CASES = ((2, 256, 128), (1, 160, 64))
#: What a CUTLASS golden records: the moved tensors and every scalar `apply` hands `cutlass_fused_moe`
#: (`quant_scales`), plus `g1_alphas_up`, which the CUTLASS runner does not read.
CUTLASS_OUTPUTS = ("w13_weight", "w13_blockscale_swizzled", "w2_weight", "w2_blockscale_swizzled", "g1_alphas",
                   "g1_alphas_up", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant")  # fmt: skip
#: CuTe DSL cases (`--moe-runner-backend flashinfer_cutedsl`, the v2 standard path): I / tp must be a multiple
#: of 64 (`interleave_w13_halves` raises otherwise); H 160 pads the swizzled scales as for CUTLASS (not aliased).
CUTEDSL_CASES = ((2, 256, 128), (1, 160, 64))
#: What a CuTe DSL golden records: the moved tensors, the MMA views (`.contiguous()` of the strided view),
#: the raw global scales the runner divides, SGLang's alphas and reciprocal input scales, and (prefixed
#: `cutedsl.`) the four scalars `resolve_cutedsl_standard_scales` gives the runner.
CUTEDSL_OUTPUTS = ("w13_weight", "w13_blockscale_swizzled", "w2_weight", "w2_blockscale_swizzled", "w13_blockscale_mma",
                   "w2_blockscale_mma", "w13_weight_scale_2", "w2_weight_scale_2", "g1_alphas", "g1_alphas_up",
                   "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant")  # fmt: skip
#: The runner's scalars (`resolve_cutedsl_standard_scales`' return order).
CUTEDSL_RESOLVED = ("w1_alpha", "fc2_input_scale", "w2_alpha", "used_input_scale")
#: What a TRT-LLM golden records of the layer after post-processing.
OUTPUTS = (
    "w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
    "g1_alphas", "g1_alphas_up", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant", "g1_scale_c",
)  # fmt: skip

#: wheel path -> {class name: methods (None: the whole class)} and the module functions to compile.
SOURCES: dict[str, tuple[dict[str, tuple[str, ...] | None], tuple[str, ...]]] = {
    "sglang/srt/layers/moe/utils.py": ({"_MoeRunnerBackendPredicates": None, "MoeRunnerBackend": None}, ()),
    "sglang/srt/layers/moe/fused_moe_triton/layer.py": (
        {
            "FusedMoeWeightScaleSupported": None,
            "FusedMoE": (
                "_load_w13",
                "_load_w2",
                "_load_model_weight_or_group_weight_scale",
                "_load_per_tensor_weight_scale",
                "_load_single_value",
                "use_padded_loading",
            ),
        },
        ("_weight_layout_method",),
    ),  # fmt: skip
    "sglang/srt/model_loader/weight_utils.py": (
        {},
        ("narrow_padded_param_and_loaded_weight", "get_actual_shard_size", "reset_param_data_if_needed"),
    ),
    "sglang/srt/layers/utils/common.py": ({}, ("copy_or_rebind_param", "alias_or_bind_derived_param")),
    "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py": ({}, ("materialize_swiglu_params_for_cutlass",)),
    "sglang/srt/layers/moe/moe_runner/flashinfer_cutedsl.py": (
        {},
        (
            "_FP4_SF_VEC_SIZE",
            "_cutedsl_logged_scalarize",
            "interleave_w13_halves",
            "cutedsl_quant_scale_to_scalar",
            "resolve_cutedsl_standard_scales",
        ),
    ),  # fmt: skip
    "sglang/srt/layers/quantization/utils.py": (
        {},
        # the last three: CompressedTensorsW4A4Nvfp4MoE's TRT-LLM branch
        (
            "prepare_static_weights_for_trtllm_fp4_moe",
            "swizzle_blockscale",
            "reorder_w1w3_to_w3w1",
            "replace_parameter",
            "update_tensor_inplace",
        ),  # fmt: skip
    ),
    "sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py": (
        {},
        (
            "round_up_to_multiple",
            "_align_fp4_moe_weights",
            "_compute_g1_scale_c",
            "trtllm_nvfp4_hidden_alignment",
            "align_fp4_moe_weights_for_flashinfer_trtllm",
        ),
    ),  # fmt: skip
    "sglang/srt/layers/quantization/marlin_utils.py": (
        {},
        ("get_scale_perms", "marlin_permute_scales", "marlin_permute_bias"),
    ),
    "sglang/srt/layers/quantization/marlin_utils_fp4.py": (
        {},
        (
            "prepare_moe_nvfp4_layer_for_marlin",
            "_repack_moe_fp4_weight_for_marlin",
            "_permute_moe_fp4_scales_for_marlin",
            "nvfp4_marlin_process_scales",
            "nvfp4_marlin_process_global_scale",
        ),
    ),  # fmt: skip
    # compressed-tensors (CT_SOURCES' run): the weight-only scheme SGLang takes on SM80-SM90 and the
    # FusedMoE method that forwards to it
    "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py": (
        {"CompressedTensorsW4A16Nvfp4MoE": ("__init__", "create_weights", "process_weights_after_loading")},
        (),
    ),
    # ... and the W4A4 scheme SGLang takes from capability 10.0 (its CUTLASS branch: flashinfer_cutlass)
    "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py": (
        {
            "CompressedTensorsW4A4Nvfp4MoE": (
                "__init__",
                "load_up_proj_weight_first",
                "create_weights",
                "process_weights_after_loading",
            )
        },
        (),
    ),
    "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py": (
        {"CompressedTensorsFusedMoEMethod": ("__init__", "create_weights", "process_weights_after_loading")},
        (),
    ),
    "sglang/srt/layers/quantization/modelopt_quant.py": (
        {
            "ModelOptNvFp4FusedMoEMethod": (
                "__init__",
                "enable_flashinfer_cutlass_moe",
                "enable_flashinfer_cutedsl_moe",
                "_is_cutedsl_v1_deepep",
                "_is_cutedsl_v2_standard",
                "prepare_weight_loader",
                "_uses_serialized_fp8_source",
                "_align_fp4_moe_weights_for_flashinfer_trtllm",
                "create_weights",
                "process_weights_after_loading",
                "load_up_proj_weight_first",
            )
        },
        ("_make_per_tensor_scale_parameter", "_compute_gemm1_alphas", "_input_scale_to_local_experts"),
    ),  # fmt: skip
}


def _compile(read: Callable[[str], str], ns: dict) -> None:
    """Exec the SOURCES' classes (named methods only, or whole) and functions into `ns`."""
    for path, (classes, functions) in SOURCES.items():
        tree = ast.parse(read(path))
        found = set()
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                keep = classes[node.name]
                if keep is not None:
                    methods = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in keep]
                    node.body = list(methods)
                    missing = set(keep) - {n.name for n in methods}
                    if missing:
                        raise SystemExit(f"{path}: {node.name} lacks {sorted(missing)}")
                    node.bases = [ast.Name("Module", ast.Load())] if node.name == "FusedMoE" else []
                    node.keywords = []
                    node.decorator_list = []
            elif _assigned(node) in functions:  # a module constant the functions read
                found.add(_assigned(node))
                exec(compile(ast.fix_missing_locations(ast.Module([node], [])), path, "exec"), ns)  # noqa: S102
                continue
            elif not (isinstance(node, ast.FunctionDef) and node.name in functions):
                continue
            found.add(node.name)
            exec(compile(ast.fix_missing_locations(ast.Module([node], [])), path, "exec"), ns)  # noqa: S102
        if found != set(classes) | set(functions):
            raise SystemExit(f"{path} lacks {sorted(set(classes) | set(functions) - found)}")


def _assigned(node: ast.stmt) -> str | None:
    """The name a module-level `NAME = ...` / `NAME: T = ...` statement binds, else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def _flashinfer_mma_layout() -> Callable:
    """FlashInfer's own `convert_sf_to_mma_layout` (and its `ceil_div`), compiled from the installed
    flashinfer/cute_dsl/utils.py: pure torch, in a module that imports the CUTLASS DSL at its top."""
    import flashinfer

    path = Path(flashinfer.__file__).parent / "cute_dsl" / "utils.py"
    tree = ast.parse(path.read_text())
    nodes = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("ceil_div", "convert_sf_to_mma_layout")
    ]
    if len(nodes) != 2:
        raise SystemExit(f"{path}: lacks ceil_div / convert_sf_to_mma_layout")
    ns: dict = {"torch": torch}
    for node in nodes:
        node.decorator_list = []
        exec(compile(ast.fix_missing_locations(ast.Module([node], [])), str(path), "exec"), ns)  # noqa: S102
    return ns["convert_sf_to_mma_layout"]


def _parameter(data: torch.Tensor, weight_loader=None, **_: object) -> torch.nn.Parameter:
    """Stand-in for ModelWeightParameter / PerTensorScaleParameter: the data, requires_grad off."""
    param = torch.nn.Parameter(data, requires_grad=False)
    param.weight_loader = weight_loader  # type: ignore[attr-defined]  # the attribute SGLang's loaders read
    return param


def _set_weight_attrs(weight, attrs: dict | None) -> None:
    """SGLang's `set_weight_attrs` (utils): each attribute set on the parameter."""
    for key, value in (attrs or {}).items():
        setattr(weight, key, value)


def _namespace(runner: str) -> dict:
    import flashinfer
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4

    ns_interleave = lambda sf: _swizzle_sf_128x4(sf).reshape(-1)  # noqa: E731 - the stand-in
    off = types.SimpleNamespace(get=lambda: False, is_set=lambda: False)
    a2a = types.SimpleNamespace(is_megamoe=lambda: False, is_deepep=lambda: False, is_mori=lambda: False)
    ns: dict = {
        "torch": torch,
        "Module": torch.nn.Module,
        "Parameter": torch.nn.Parameter,
        "Enum": enum.Enum,
        "Optional": Optional,
        "Union": Union,
        "cast": lambda _type, value: value,
        "cached_property": functools.cached_property,
        "logger": logging.getLogger("sglang-golden"),
        "envs": types.SimpleNamespace(
            SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16=off, SGLANG_MOE_COPY_WEIGHT_VIEWS_BEFORE_H2D=off
        ),
        "ModelWeightParameter": _parameter,
        "PerTensorScaleParameter": _parameter,
        "set_weight_attrs": _set_weight_attrs,
        "round_up": round_up,
        "get_moe_a2a_backend": lambda: a2a,
        "get_platform": lambda: types.SimpleNamespace(is_blackwell=True, is_sm100=True),
        "get_device_capability": lambda: (10, 0),
        "is_cuda": lambda: True,
        "is_flashinfer_cutedsl_v1_path": lambda: False,
        "_use_nvfp4_dispatch": lambda: False,
        "should_use_flashinfer_cutlass_moe_fp4_allgather": lambda: False,
        "reorder_rows_for_gated_act_gemm": flashinfer.reorder_rows_for_gated_act_gemm,
        "shuffle_matrix_sf_a": flashinfer.shuffle_matrix_sf_a,
        "_is_cpu": False,
        "_is_hip": False,
        "_use_aiter": False,
        "print_warning_once": logging.getLogger("sglang-golden").warning,
        "log_info_on_rank0": lambda log, message: log.info(message),
        "convert_sf_to_mma_layout": _flashinfer_mma_layout(),
        "refresh_cutedsl_standard_scales_for_weight_update": _no_wrapper,
    }
    ns["nvfp4_block_scale_interleave"] = ns_interleave
    ns["_maybe_copy_weight_view_before_h2d"] = lambda w: w  # env SGLANG_MOE_COPY_WEIGHT_VIEWS_BEFORE_H2D off
    ns["get_moe_runner_backend"] = lambda: ns["MoeRunnerBackend"](runner)
    return ns


def _no_wrapper(layer) -> None:
    """Reached only with a `CuteDslMoEWrapper` on the layer, which the golden never builds."""
    raise SystemExit("refresh_cutedsl_standard_scales_for_weight_update reached without a wrapper (a bug)")


@contextlib.contextmanager
def sglang_imports(ns: dict):
    """While SGLang's compiled code runs, the `from sglang... import X` statements inside it find
    `ns`'s names (stand-in modules), and `from flashinfer import nvfp4_block_scale_interleave` the
    stand-in; everything is put back afterwards."""
    import flashinfer

    names = {
        "sglang.srt.layers.moe": ("get_moe_runner_backend",),
        "sglang.srt.layers.moe.fused_moe_triton": ("FusedMoeWeightScaleSupported",),
        "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm": (
            "align_fp4_moe_weights_for_flashinfer_trtllm",
            "trtllm_nvfp4_hidden_alignment",
        ),
        "sglang.srt.layers.quantization.utils": ("prepare_static_weights_for_trtllm_fp4_moe",),
        "sglang.srt.layers.moe.moe_runner.flashinfer_cutlass": ("materialize_swiglu_params_for_cutlass",),
        "sglang.srt.layers.moe.moe_runner.flashinfer_cutedsl": (
            "interleave_w13_halves", "_FP4_SF_VEC_SIZE", "refresh_cutedsl_standard_scales_for_weight_update",
        ),
        "flashinfer.cute_dsl.utils": ("convert_sf_to_mma_layout",),
        "sglang.srt.layers.quantization.marlin_utils_fp4": ("prepare_moe_nvfp4_layer_for_marlin",),
    }  # fmt: skip
    parents = ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe.moe_runner",
               "sglang.srt.layers.quantization", "flashinfer.cute_dsl")  # fmt: skip
    modules = {name: types.ModuleType(name) for name in parents}
    for name, attrs in names.items():
        module = modules[name] = types.ModuleType(name)
        for attr in attrs:
            setattr(module, attr, ns[attr])
    saved_interleave = getattr(flashinfer, "nvfp4_block_scale_interleave", None)
    try:
        with stand_in_modules(modules):
            flashinfer.nvfp4_block_scale_interleave = ns["nvfp4_block_scale_interleave"]
            yield
    finally:
        flashinfer.nvfp4_block_scale_interleave = saved_interleave


def _layer(
    ns: dict, method, experts: int, global_experts: int, hidden: int, inter: int, tp: int, rank: int, ep: int = 1
):
    """A FusedMoE with the attributes `FusedMoE.__init__` sets that the compiled code reads. `ep` > 1:
    SGLang's MoE EP (`--tp-size ep --ep-size ep`, MoE TP 1), `rank` the EP rank holding `experts` of the
    `global_experts`."""
    layer = ns["FusedMoE"]()
    layer.num_local_experts, layer.num_experts = experts, global_experts
    _parallel(layer, tp, rank, ep)
    layer.moe_runner_config = types.SimpleNamespace(
        is_gated=True, activation="silu", gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=None
    )
    layer.quant_method = method
    layer.quant_config = method.quant_config
    layer.use_presharded_weights = False
    layer.use_triton_kernels = False
    layer.use_flashinfer_trtllm_moe = method.enable_flashinfer_trtllm_moe
    layer.dispatcher = Dispatcher()
    # FusedMoE.__init__ calls create_moe_runner, which sets these two (the runner object is not needed)
    method.moe_runner_config = layer.moe_runner_config
    method._moe_runner_backend = ns["get_moe_runner_backend"]()
    if method._moe_runner_backend.is_flashinfer_cutedsl():
        layer._cutedsl_wrapper = None  # create_moe_runner: the runner builds it at the first forward
    method.create_weights(layer, experts, hidden, inter // tp, torch.bfloat16)
    return layer


def _parallel(layer, tp: int, rank: int, ep: int) -> None:
    """FusedMoE's MoE sizes and ranks: TP `tp` (rank `rank`), or with `ep` > 1 EP `ep` (rank `rank`) at MoE
    TP 1 (SGLang 0.5.23 runtime_context.py `derive_parallel_widths`: moe_tp = tp_size // ep_size)."""
    if ep > 1:
        layer.moe_ep_rank, layer.moe_ep_size, layer.moe_tp_rank, layer.moe_tp_size = rank, ep, 0, 1
    else:
        layer.moe_ep_rank, layer.moe_ep_size, layer.moe_tp_rank, layer.moe_tp_size = 0, 1, rank, tp


def _expert_id(layer, param, expert: int) -> int:
    """`FusedMoE.weight_loader`'s expert id for `param` (layers/moe/fused_moe_triton/layer.py:1191-1195):
    the global id for a parameter marked `_sglang_require_global_experts` (ModelOpt's input scales), else
    `_map_global_expert_id_to_local_expert_id` (layer.py:1153-1161, no fused shared experts): the local id
    on the rank holding the expert, -1 (not loaded) elsewhere."""
    if getattr(param, "_sglang_require_global_experts", False):
        return expert
    start = layer.moe_ep_rank * layer.num_local_experts
    return expert - start if start <= expert < start + layer.num_local_experts else -1


class Dispatcher:
    """Stand-in for the layer's token dispatcher: keeps what `set_quant_config` hands it."""

    def __init__(self) -> None:
        self.quant_config: dict | None = None

    def set_quant_config(self, config: dict) -> None:
        self.quant_config = config


#: checkpoint projection -> SGLang shard id (models' expert_params_mapping).
SHARDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _load(layer, experts: dict[int, dict[str, dict[str, torch.Tensor]]]) -> None:
    """`FusedMoE.weight_loader`'s ModelOpt NVFP4 cases, re-enacted around SGLang's own helpers."""
    for expert, projs in experts.items():
        for proj, tensors in projs.items():
            shard = SHARDS[proj]
            dim = 1 if shard == "w2" else 0  # SHARD_ID_TO_SHARDED_DIM, per expert's [rows, cols]
            target = "w2" if shard == "w2" else "w13"
            local = _expert_id(layer, getattr(layer, f"{target}_weight"), expert)
            if local >= 0:
                for kind in ("weight", "weight_scale"):
                    param = getattr(layer, f"{target}_{kind}")
                    layer._load_model_weight_or_group_weight_scale(
                        shard_dim=dim, expert_data=param.data[local], shard_id=shard, loaded_weight=tensors[kind]
                    )
                layer._load_per_tensor_weight_scale(
                    shard_id=shard,
                    param=getattr(layer, f"{target}_weight_scale_2"),
                    loaded_weight=tensors["weight_scale_2"],
                    expert_id=local,
                )
            param = getattr(layer, f"{target}_input_scale")
            held = _expert_id(layer, param, expert)
            if held >= 0:
                layer._load_single_value(param=param, loaded_weight=tensors["input_scale"], expert_id=held)


class SglangNvfp4:
    """SGLang 0.5.23's ModelOpt NVFP4 MoE code (SOURCES), compiled once, run for FlashInfer TRT-LLM."""

    def __init__(self, read: Callable[[str], str], runner: str = "flashinfer_trtllm"):
        self.runner = runner
        self.outputs = {"marlin": MARLIN_OUTPUTS, "flashinfer_cutlass": CUTLASS_OUTPUTS,
                        "flashinfer_cutedsl": CUTEDSL_OUTPUTS}.get(runner, OUTPUTS)  # fmt: skip
        self.ns = _namespace(runner)
        self.ns |= {
            "Callable": Callable,
            "gptq_marlin_repack": marlin_tool.gptq_marlin_repack,
            "marlin_make_workspace": marlin_tool.marlin_make_workspace,
        }
        _compile(read, self.ns)
        self.config = types.SimpleNamespace(
            is_checkpoint_nvfp4_serialized=True, group_size=16, use_per_token_activation=False,
            get_name=lambda: "modelopt_fp4",
        )  # fmt: skip

    def build(self, experts: int, hidden: int, inter: int, tp: int = 1, rank: int = 0, ep: int = 1):
        """(method, layer): `ModelOptNvFp4FusedMoEMethod.__init__` and `create_weights` for one rank (with
        `ep` > 1 the EP rank `rank`, holding `experts / ep` of the `experts`)."""
        with sglang_imports(self.ns):
            method = self.ns["ModelOptNvFp4FusedMoEMethod"](self.config)
            return method, _layer(self.ns, method, experts // ep, experts, hidden, inter, tp, rank, ep)

    def load(self, layer, experts: dict) -> None:
        with sglang_imports(self.ns):
            _load(layer, experts)

    def process(self, method, layer) -> None:
        with sglang_imports(self.ns):
            method.process_weights_after_loading(layer)


def run_sglang(code: SglangNvfp4, experts: dict, hidden: int, inter: int, tp: int = 1, rank: int = 0) -> dict:
    """SGLang's layer tensors (`code.outputs`) after create_weights, loading and post-processing."""
    method, layer = code.build(len(experts), hidden, inter, tp, rank)
    code.load(layer, experts)
    code.process(method, layer)
    out = {name: getattr(layer, name).data.contiguous() for name in code.outputs}
    if code.runner == "flashinfer_cutedsl":  # ensure_cutedsl_wrapper's scale step (the wrapper is CUDA's)
        with sglang_imports(code.ns):
            resolved = code.ns["resolve_cutedsl_standard_scales"](layer)
        out |= {f"cutedsl.{name}": t.clone().contiguous() for name, t in zip(CUTEDSL_RESOLVED, resolved, strict=True)}
    return out


def random_experts(num: int, hidden: int, inter: int, seed: int, lowest: int = 0x08) -> dict:
    """ModelOpt NVFP4 expert tensors (per expert and projection) with positive E4M3 scales from byte
    `lowest` (0x08: normal only; 0x01: subnormals too, which vLLM's rescaled Marlin scales zero)."""
    g = torch.Generator().manual_seed(seed)
    u8 = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.uint8)  # noqa: E731
    e4m3 = lambda *s: torch.randint(lowest, 0x78, s, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)  # noqa: E731
    scalar = lambda: (torch.rand((), generator=g) * 0.01 + 0.001).float()  # noqa: E731
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    out: dict = {}
    for e in range(num):
        s2, a13 = scalar(), scalar()  # ModelOpt shares w1 / w3 global and input scales
        out[e] = {}
        for proj, (rows, cols) in shapes.items():
            out[e][proj] = {
                "weight": u8(rows, cols // 2),
                "weight_scale": e4m3(rows, cols // 16),
                "weight_scale_2": s2 if proj != "down_proj" else scalar(),
                "input_scale": a13 if proj != "down_proj" else scalar(),
            }
    return out


def example_experts(folder: Path, layer: int) -> dict:
    """One MoE layer's expert tensors of the ModelOpt example, as SGLang's loader receives them."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    prefix = f"model.layers.{layer}.mlp.experts."
    out: dict = {}
    for key, shard in index.items():
        if not key.startswith(prefix):
            continue
        expert, proj, kind = key[len(prefix) :].split(".", 2)
        with safe_open(str(folder / shard), "pt") as f:
            out.setdefault(int(expert), {}).setdefault(proj, {})[kind] = f.get_tensor(key)
    return out


def _flatten(experts: dict) -> dict[str, torch.Tensor]:
    return {
        f"in.{e}.{proj}.{kind}": t.clone().contiguous()
        for e, projs in experts.items()
        for proj, tensors in projs.items()
        for kind, t in tensors.items()
    }


def example_digests(code: SglangNvfp4, folder: Path, tps: tuple[int, ...]) -> dict:
    """{tpN: {rankR: {layerL: {parameter: digest}}}} of SGLang's run over an example's MoE layers."""
    config = json.loads((folder / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    moe = [layer for layer in range(config["num_hidden_layers"]) if example_experts(folder, layer)]
    return {
        f"tp{tp}": {
            f"rank{rank}": {
                f"layer{layer}": {
                    name: digest(t)
                    for name, t in run_sglang(code, example_experts(folder, layer), hidden, inter, tp, rank).items()
                }
                for layer in moe
            }
            for rank in range(tp)
        }
        for tp in tps
    }


#: compressed-tensors Marlin cases (CompressedTensorsW4A16Nvfp4MoE, SGLang's pick on SM80-SM90): a W4A4
#: checkpoint served weight-only (input global scales registered, loaded, dropped) and an NVFP4A16 one
#: with I 192 (not a multiple of 128), both with subnormal block scales.
CT_MARLIN_CASES = ((2, 256, 128, True), (1, 128, 192, False))
#: The compressed-tensors examples: Qwen3 (H 256, I 128) at TP 1 and 2; DeepSeek's I 96 is one SGLang's
#: scheme raises on ("intermediate_size_per_partition % 64"), so it has no digests.
CT_EXAMPLE = ROOT / "examples" / "tiny-nvfp4-ct-qwen3"
#: compressed-tensors CUTLASS case (CompressedTensorsW4A4Nvfp4MoE, `flashinfer_cutlass` on SM100): W4A4, the
#: input global scales of gate and up differ per expert (the scheme takes their per-expert minimum).
#: The second case's stored input scales are ones whose float32 `1 / (1 / x)` is not x (`_uninvertible`):
#: SGLang reads the stored values, which mxconvert's decoded canonical scales cannot give back.
CT_CUTLASS_CASES = ((2, 256, 128, False), (2, 128, 128, True))
#: What a compressed-tensors CUTLASS golden records: the moved tensors and every scalar its `apply` hands
#: `cutlass_fused_moe` (`quant_scales`), plus the reciprocal global scales the alphas are made of.
CT_CUTLASS_OUTPUTS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2",
                      "w2_weight_scale_2", "g1_alphas", "g2_alphas", "w13_input_scale_quant",
                      "w2_input_scale_quant")  # fmt: skip
#: What a compressed-tensors TRT-LLM golden records (CompressedTensorsW4A4Nvfp4MoE, `flashinfer_trtllm`): the
#: moved tensors and every scalar its `apply` hands `FlashInferTrtllmFp4MoeQuantInfo`, plus the reciprocal
#: global scales the alphas are made of.
CT_TRTLLM_OUTPUTS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2",
                     "w2_weight_scale_2", "g1_alphas", "g2_alphas", "w13_input_scale_quant",
                     "w2_input_scale_quant", "g1_scale_c")  # fmt: skip
#: compressed-tensors TRT-LLM cases: the input scales differ per expert and between gate and up (the scheme
#: takes ONE minimum over all of them); the second case's are float32-uninvertible (`_uninvertible_input_scales`).
CT_TRTLLM_CASES = ((2, 256, 128, False), (3, 128, 64, True))
#: compressed-tensors tensor kind -> the FusedMoE parameter suffix it loads into (w13_ / w2_).
CT_KINDS = {"weight_packed": "weight_packed", "weight_scale": "weight_scale",
            "weight_global_scale": "weight_global_scale", "input_global_scale": "input_global_scale"}  # fmt: skip


def _ct_load(layer, experts: dict) -> None:
    """`FusedMoE.weight_loader`'s dispatch for a compressed-tensors NVFP4 layer, re-enacted around SGLang's
    own helpers: "weight_packed" (a "weight") and "weight_scale" (GROUP) to
    `_load_model_weight_or_group_weight_scale`; "weight_global_scale" and "input_global_scale" (TENSOR:
    neither name contains "input_scale") to `_load_per_tensor_weight_scale`, by shard id w1 / w3 / w2."""
    for expert, projs in experts.items():
        for proj, tensors in projs.items():
            shard = SHARDS[proj]
            dim = 1 if shard == "w2" else 0  # SHARD_ID_TO_SHARDED_DIM
            target = "w2" if shard == "w2" else "w13"
            for kind, tensor in tensors.items():
                param = getattr(layer, f"{target}_{CT_KINDS[kind]}")
                local = _expert_id(layer, param, expert)  # the scheme marks no parameter global
                if local < 0:
                    continue
                if kind in ("weight_packed", "weight_scale"):
                    layer._load_model_weight_or_group_weight_scale(
                        shard_dim=dim, expert_data=param.data[local], shard_id=shard, loaded_weight=tensor
                    )
                else:
                    layer._load_per_tensor_weight_scale(
                        shard_id=shard, param=param, loaded_weight=tensor, expert_id=local
                    )


FIRST = "load_up_proj_weight_first"


class SglangNvfp4Ct(SglangNvfp4):
    """SGLang 0.5.23's compressed-tensors NVFP4 MoE on SM80-SM90: `CompressedTensorsFusedMoEMethod`
    forwarding to `CompressedTensorsW4A16Nvfp4MoE` (weight-only FP4 Marlin; a W4A4 checkpoint's
    activation scales are loaded and dropped), compiled from the wheel."""

    SCHEME = "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py"

    BASE = "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_scheme.py"

    W4A4 = "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"

    def __init__(self, read: Callable[[str], str], runner: str = "marlin"):
        super().__init__(read, runner)
        self.outputs = {"flashinfer_cutlass": CT_CUTLASS_OUTPUTS, "flashinfer_trtllm": CT_TRTLLM_OUTPUTS}.get(
            runner, MARLIN_OUTPUTS
        )
        # the W4A4 scheme's class attribute `requires_blackwell` (True), which the compiled class lacks
        (w4a4,) = [
            n
            for n in ast.parse(read(self.W4A4)).body
            if isinstance(n, ast.ClassDef) and n.name == "CompressedTensorsW4A4Nvfp4MoE"
        ]
        (blackwell,) = [
            ast.literal_eval(n.value)
            for n in w4a4.body
            if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["requires_blackwell"]
        ]
        self.ns["CompressedTensorsW4A4Nvfp4MoE"].requires_blackwell = blackwell
        constants: list[ast.stmt] = [
            node
            for node in ast.parse(read(self.SCHEME)).body
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["NVFP4_GROUP_SIZE"]
        ]
        exec(compile(ast.Module(constants, []), self.SCHEME, "exec"), self.ns)  # noqa: S102 - the module's constant
        # what the scheme inherits from CompressedTensorsMoEScheme and the compiled class (no bases) lacks:
        # the class attribute `load_up_proj_weight_first` (False: w13 loads as [w1; w3])
        (base,) = [
            node
            for node in ast.parse(read(self.BASE)).body
            if isinstance(node, ast.ClassDef) and node.name == "CompressedTensorsMoEScheme"
        ]
        (value,) = [
            ast.literal_eval(node.value)
            for node in base.body
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [FIRST]
        ]
        setattr(self.ns["CompressedTensorsW4A16Nvfp4MoE"], FIRST, value)
        self.ct_config = types.SimpleNamespace(get_name=lambda: "compressed-tensors")

    def build_ct(self, experts: int, hidden: int, inter: int, w4a4: bool, tp: int = 1, rank: int = 0, ep: int = 1):
        """A FusedMoE whose quant method is `CompressedTensorsFusedMoEMethod` with `layer.scheme` the W4A16
        scheme (`has_input_global_scale` for a W4A4 checkpoint, as `get_moe_scheme` makes it below SM100);
        with `ep` > 1 the EP rank `rank`, holding `experts / ep` of the `experts`."""
        with sglang_imports(self.ns):
            method = self.ns["CompressedTensorsFusedMoEMethod"](self.ct_config)
            layer = self.ns["FusedMoE"]()
            layer.num_local_experts, layer.num_experts = experts // ep, experts
            _parallel(layer, tp, rank, ep)
            layer.moe_runner_config = types.SimpleNamespace(
                is_gated=True, activation="silu", gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=None
            )
            layer.quant_method, layer.quant_config = method, self.ct_config
            # get_moe_scheme from capability 10.0 (get_platform: Blackwell); the scheme's __init__ reads the runner
            if self.runner in ("flashinfer_cutlass", "flashinfer_trtllm"):
                layer.scheme = self.ns["CompressedTensorsW4A4Nvfp4MoE"]()
                layer.scheme.moe_runner_config = layer.moe_runner_config  # what its create_moe_runner sets
                # FusedMoE.__init__ sets it (intermediate_size // moe_tp_size; the scheme's create_weights does not)
                layer.intermediate_size_per_partition = inter // tp
            else:
                layer.scheme = self.ns["CompressedTensorsW4A16Nvfp4MoE"](has_input_global_scale=w4a4)
            layer.use_presharded_weights = layer.use_triton_kernels = False
            # FusedMoE.__init__: True for flashinfer_trtllm (use_padded_loading then narrows; nothing is padded)
            layer.use_flashinfer_trtllm_moe = self.runner == "flashinfer_trtllm"
            layer.dispatcher = Dispatcher()
            method.create_weights(layer, experts // ep, hidden, inter // tp, torch.bfloat16)
            return method, layer


def run_sglang_ct(code: SglangNvfp4Ct, experts: dict, hidden: int, inter: int, tp: int = 1, rank: int = 0) -> dict:
    """SGLang's compressed-tensors Marlin layer tensors after create_weights, loading and post-processing;
    also checks that what the scheme drops (the `_packed` / `_global_scale` / input parameters) is gone."""
    w4a4 = "input_global_scale" in experts[next(iter(experts))]["gate_proj"]
    method, layer = code.build_ct(len(experts), hidden, inter, w4a4, tp, rank)
    with sglang_imports(code.ns):
        _ct_load(layer, experts)
        method.process_weights_after_loading(layer)
    dropped: tuple[str, ...] = (
        "w13_weight_packed",
        "w2_weight_packed",
        "w13_weight_global_scale",
        "w2_weight_global_scale",
        "w13_input_global_scale",
        "w2_input_global_scale",
    )
    if code.runner in ("flashinfer_cutlass", "flashinfer_trtllm"):
        dropped = dropped[:2]  # the W4A4 scheme renames the weights and keeps the raw scalars
    left = [name for name in dropped if hasattr(layer, name)]
    if left:
        raise SystemExit(f"SGLang's compressed-tensors scheme left {left} on the layer")
    return {name: getattr(layer, name).data.contiguous() for name in code.outputs}


def random_ct_experts(num: int, hidden: int, inter: int, seed: int, w4a4: bool, split_inputs: bool = False) -> dict:
    """compressed-tensors NVFP4 expert tensors: E4M3 block scales from byte 0x01 (subnormals too) and
    float32 global scales in the encode convention (the divisor, ~ 448 x 6 / amax), gate's and up's
    shared as llm-compressor fuses them (SGLang's W4A16 scheme raises on differing ones)."""
    g = torch.Generator().manual_seed(seed)
    u8 = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.uint8)  # noqa: E731
    e4m3 = lambda *s: torch.randint(0x01, 0x78, s, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)  # noqa: E731
    scalar = lambda: (torch.rand((1,), generator=g) * 3000 + 100).float()  # noqa: E731
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    out: dict = {}
    for e in range(num):
        w13_global, w13_input = scalar(), scalar()
        out[e] = {}
        for proj, (rows, cols) in shapes.items():
            tensors = {
                "weight_packed": u8(rows, cols // 2),
                "weight_scale": e4m3(rows, cols // 16),
                "weight_global_scale": w13_global if proj != "down_proj" else scalar(),
            }
            if w4a4:
                shared = w13_input if not (split_inputs and proj == "up_proj") else scalar()
                tensors["input_global_scale"] = shared if proj != "down_proj" else scalar()
            out[e][proj] = tensors
    return out


def ct_example_digests(code: SglangNvfp4Ct, folder: Path, tps: tuple[int, ...]) -> dict:
    """{tpN: {rankR: {layerL: {parameter: digest}}}} of SGLang's compressed-tensors Marlin run."""
    config = json.loads((folder / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    moe = [layer for layer in range(config["num_hidden_layers"]) if example_experts(folder, layer)]
    return {
        f"tp{tp}": {
            f"rank{rank}": {
                f"layer{layer}": {
                    name: digest(t)
                    for name, t in run_sglang_ct(code, example_experts(folder, layer), hidden, inter, tp, rank).items()
                }
                for layer in moe
            }
            for rank in range(tp)
        }
        for tp in tps
    }


def _uninvertible_input_scales(experts: dict) -> None:
    """Each `input_global_scale` moved up, one float32 step at a time, to the nearest value whose float32
    `1 / (1 / x)` is not x (about one float32 in eight is such a value)."""
    for projs in experts.values():
        for tensors in projs.values():
            x = tensors["input_global_scale"]
            while bool((1.0 / (1.0 / x) == x).all()):
                x = torch.nextafter(x, torch.full_like(x, float("inf")))
            tensors["input_global_scale"] = x


def _write_ct_w4a4_goldens(args, meta: dict, runner: str, tag: str, cases, first_seed: int) -> None:
    """tests/golden/sglang/nvfp4-ct-{tag}_*: the W4A4 scheme's `runner` branch on the random `cases`
    (seeds from `first_seed`) and the Qwen3 CT example's digests at TP 1 and 2."""
    code = SglangNvfp4Ct(wheel_reader(args.wheel), runner)
    for seed, (num, h, i, uninvertible) in enumerate(cases, first_seed):
        experts = random_ct_experts(num, h, i, seed, True, split_inputs=True)
        if uninvertible:
            _uninvertible_input_scales(experts)
        tensors = _flatten(experts) | {f"out.{n}": t for n, t in run_sglang_ct(code, experts, h, i).items()}
        suffix = "_uninvertible" if uninvertible else ""
        path = args.out / f"nvfp4-ct-{tag}_sglang-0.5.23_e{num}_h{h}_i{i}_w4a4{suffix}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        print("wrote", path)
    path = args.out / f"nvfp4-ct-{tag}_sglang-0.5.23_example_digests.json"
    digests = ct_example_digests(code, CT_EXAMPLE, (1, 2))
    document = {"example": CT_EXAMPLE.name, "runner": runner, "scheme": "CompressedTensorsW4A4Nvfp4MoE",
                **meta, "digests": digests}  # fmt: skip
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print("wrote", path)


def write_ct_cutlass_goldens(args, meta: dict) -> None:
    """tests/golden/sglang/nvfp4-ct-cutlass_*: the W4A4 scheme's CUTLASS branch, the random case and the
    Qwen3 CT example's digests at TP 1 and 2 (the CT DeepSeek example's 2I 192 is not compared: the row's
    CUTLASS layout refuses a 2I that is not a multiple of 128, whose swizzled scales SGLang pads)."""
    _write_ct_w4a4_goldens(args, meta, "flashinfer_cutlass", "cutlass", CT_CUTLASS_CASES, 100)


def write_ct_trtllm_goldens(args, meta: dict) -> None:
    """tests/golden/sglang/nvfp4-ct-trtllm_*: the W4A4 scheme's TRT-LLM branch (`flashinfer_trtllm`), the
    random cases and the Qwen3 CT example's digests at TP 1 and 2 (the CT DeepSeek example's I 96 is not
    compared: the row's TRT-LLM layout pads I to 64, which the scheme does not)."""
    _write_ct_w4a4_goldens(args, meta, "flashinfer_trtllm", "trtllm", CT_TRTLLM_CASES, 200)


def write_ct_goldens(args, meta: dict) -> None:
    """tests/golden/sglang/nvfp4-ct-marlin_*: the random cases and the Qwen3 CT example's digests; and
    the CUTLASS ones (`write_ct_cutlass_goldens`)."""
    code = SglangNvfp4Ct(wheel_reader(args.wheel))
    for seed, (num, h, i, w4a4) in enumerate(CT_MARLIN_CASES):
        experts = random_ct_experts(num, h, i, seed, w4a4)
        tensors = _flatten(experts) | {f"out.{n}": t for n, t in run_sglang_ct(code, experts, h, i).items()}
        path = args.out / f"nvfp4-ct-marlin_sglang-0.5.23_e{num}_h{h}_i{i}_{'w4a4' if w4a4 else 'w4a16'}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        print("wrote", path)
    write_ct_cutlass_goldens(args, meta)
    write_ct_trtllm_goldens(args, meta)
    path = args.out / "nvfp4-ct-marlin_sglang-0.5.23_example_digests.json"
    digests = ct_example_digests(code, CT_EXAMPLE, (1, 2))
    document = {"example": CT_EXAMPLE.name, "runner": "marlin", "scheme": "CompressedTensorsW4A16Nvfp4MoE", **meta,
                "digests": digests}  # fmt: skip
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print("wrote", path)


def main() -> None:
    only_ct = "--only-ct" in sys.argv  # the compressed-tensors goldens alone (golden_arguments knows no such flag)
    if only_ct:
        sys.argv.remove("--only-ct")
    only_ct_cutlass = "--only-ct-cutlass" in sys.argv  # the compressed-tensors CUTLASS goldens alone
    if only_ct_cutlass:
        sys.argv.remove("--only-ct-cutlass")
    only_ct_trtllm = "--only-ct-trtllm" in sys.argv  # the compressed-tensors TRT-LLM goldens alone
    if only_ct_trtllm:
        sys.argv.remove("--only-ct-trtllm")
    only_cutedsl = "--only-cutedsl" in sys.argv  # the CuTe DSL goldens alone (nvfp4-cutedsl_*)
    if only_cutedsl:
        sys.argv.remove("--only-cutedsl")
    args = golden_arguments(__doc__.split("\n", 1)[0])
    flashinfer = pinned_flashinfer()
    meta = {"sglang": "0.5.23", "flashinfer": flashinfer.__version__, "torch": torch.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    if only_ct:
        write_ct_goldens(args, meta)
        return
    if only_ct_cutlass:
        write_ct_cutlass_goldens(args, meta)
        return
    if only_ct_trtllm:
        write_ct_trtllm_goldens(args, meta)
        return
    both = ((EXAMPLE, (1, 2), "example"), (EXAMPLE_PADDED, (1,), "example-deepseek"))
    runs: tuple = (
        ("flashinfer_trtllm", "nvfp4-trtllm", CASES, 0x08, both),
        ("marlin", "nvfp4-marlin", MARLIN_CASES, 0x01, both),
        # the deepseek example's I 96 (2I 192) is one SGLang's CUTLASS preparation asserts on: no digests
        ("flashinfer_cutlass", "nvfp4-cutlass", CUTLASS_CASES, 0x08, both[:1]),
        # the deepseek example's I 96 is one interleave_w13_halves raises on: no digests
        ("flashinfer_cutedsl", "nvfp4-cutedsl", CUTEDSL_CASES, 0x08, both[:1]),
    )
    if only_cutedsl:
        runs = runs[-1:]
    for runner, stem, cases, lowest, examples in runs:
        code = SglangNvfp4(wheel_reader(args.wheel), runner)
        for seed, (num, h, i) in enumerate(cases):
            experts = random_experts(num, h, i, seed, lowest)
            tensors = _flatten(experts) | {f"out.{n}": t for n, t in run_sglang(code, experts, h, i).items()}
            path = args.out / f"{stem}_sglang-0.5.23_e{num}_h{h}_i{i}.safetensors"
            save_file(tensors, str(path), metadata=meta)
            print("wrote", path)
        for folder, tps, name in examples:
            path = args.out / f"{stem}_sglang-0.5.23_{name}_digests.json"
            document = {"example": folder.name, "runner": runner, **meta, "digests": example_digests(code, folder, tps)}
            path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
            print("wrote", path)
    if not only_cutedsl:
        write_ct_goldens(args, meta)


if __name__ == "__main__":
    main()
