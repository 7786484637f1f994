"""NVFP4 expert parallelism under the SGLang row (docs/sglang.md, "Expert parallelism"), on CPU without SGLang:
which NVFP4 paths SGLang 0.5.23 runs with ep_size > 1 (CuTe DSL refused with the reason), the EP artifact
(rank r the global experts 2r, 2r + 1; ModelOpt's scalars reduced over every global expert, so each rank's
bytes are TP 1's of its experts; compressed-tensors TRT-LLM's minimum over the rank's experts, as SGLang's
local `input_global_scale` parameters) and the loader's expert placement. Path A = path B of the EP
artifacts is tests_sglang/test_nvfp4_ep.py."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from fixtures_ckpt import REPO_ROOT
from safetensors import safe_open
from safetensors.torch import load_file

from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.nvfp4 import select_nvfp4_backend
from mxconvert.selection.report import SelectionRefused
from mxconvert.selection.sglang import nvfp4_0_5_23 as mirror
from mxconvert.target.backends import Nvfp4Backend as B
from mxconvert.target.profiles import get_profile
from mxconvert.target.releases import resolve_runtime

ROW = resolve_runtime("sglang==0.5.23", "nvfp4").revision
EP2 = Deployment(tp=2, ep=2)
MODELOPT = REPO_ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
CT = REPO_ROOT / "examples" / "tiny-nvfp4-ct-qwen3"


def convert(source: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mxconvert", "convert", str(source), "--runtime", "sglang==0.5.23", *args]
    return subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=300)


# ---- selection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("producer", "profile", "runner", "backend"),
    [
        ("modelopt", "b200", "auto", B.FLASHINFER_TRTLLM),
        ("modelopt", "b200", "flashinfer_trtllm_routed", B.FLASHINFER_TRTLLM),
        ("modelopt", "b200", "flashinfer_cutlass", B.FLASHINFER_CUTLASS),
        ("modelopt", "rtx-pro-6000", "flashinfer_cutlass", B.FLASHINFER_CUTLASS),
        ("modelopt", "h100", "auto", B.MARLIN),
        ("compressed-tensors", "b200", "auto", B.FLASHINFER_CUTLASS),
        ("compressed-tensors", "b200", "flashinfer_trtllm", B.FLASHINFER_TRTLLM),
        ("compressed-tensors", "h100", "auto", B.MARLIN),
    ],
)
def test_the_paths_sglang_runs_with_ep_are_selected_under_ep(producer, profile, runner, backend):
    picked = select_nvfp4_backend(
        get_profile(profile), ROW, EP2, runner, producer=producer, model_type="qwen3_moe"
    )  # fmt: skip
    assert picked.backend is backend and backend in mirror.EP_BACKENDS


def test_cutedsl_under_ep_is_refused_with_the_reason():
    profile = get_profile("b200")
    with pytest.raises(SelectionRefused, match="expert parallelism is mirrored for NVFP4") as err:
        mirror.select(profile, ROW, EP2, "flashinfer_cutedsl", producer="modelopt", model_type="qwen3_moe")
    cutedsl = [c for c in err.value.considered if c.backend is B.FLASHINFER_CUTEDSL]
    assert cutedsl and not cutedsl[-1].chosen and "slices w2's per-expert input scales" in cutedsl[-1].reason
    # the same request without EP is chosen: only EP refuses it
    picked = mirror.select(profile, ROW, Deployment(tp=2), "flashinfer_cutedsl", producer="modelopt")
    assert picked.backend is B.FLASHINFER_CUTEDSL


def test_convert_refuses_cutedsl_under_ep(tmp_path):
    done = convert(MODELOPT, tmp_path / "out", "--profile", "b200", "--backend", "flashinfer_cutedsl", "--ep", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not FLASHINFER_CUTEDSL" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


# ---- convert --------------------------------------------------------------------------------------


def _plans(out: Path) -> dict[int, tuple[int, int]]:
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert (manifest["target"]["tp_size"], manifest["target"]["ep_size"]) == (1, 2)
    return {e["rank"]: (e["plan"]["expert_start"], e["plan"]["expert_end"]) for e in manifest["ranks"]}


def _rank(out: Path, rank: int) -> dict[str, torch.Tensor]:
    return load_file(next((out / f"rank-{rank:05d}").glob("*.safetensors")))


def test_a_modelopt_ep_artifact_is_tp1s_bytes_of_each_ranks_experts(tmp_path):
    """FLASHINFER_TRTLLM (b200): every tensor, the scalars too, since SGLang reduces ModelOpt's input scales
    over every global expert (TP 1's maximum, repeated per local expert)."""
    ep_out, tp_out = tmp_path / "ep", tmp_path / "tp1"
    done = convert(MODELOPT, ep_out, "--profile", "b200", "--ep", "2")
    assert done.returncode == 0, done.stderr
    assert f"sglang serve --model-path {ep_out} --load-format mxconvert --tp-size 2 --ep-size 2" in done.stdout
    assert convert(MODELOPT, tp_out, "--profile", "b200").returncode == 0
    plans = _plans(ep_out)
    assert plans == {0: (0, 2), 1: (2, 4)}
    whole = _rank(tp_out, 0)
    for rank, (start, end) in plans.items():
        part = _rank(ep_out, rank)
        assert part.keys() == whole.keys() and any(name.endswith("g1_scale_c") for name in part)
        for name, tensor in part.items():
            want = whole[name][start:end]
            assert tensor.dtype == want.dtype and tensor.shape == want.shape, name
            assert torch.equal(tensor.view(torch.uint8), want.view(torch.uint8)), name


def _stored(layer: int, experts: range, proj: str) -> list[float]:
    """The checkpoint's stored `input_global_scale` of `proj` for `experts`."""
    names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.input_global_scale" for e in experts]
    found: dict[str, float] = {}
    for path in CT.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            found |= {name: f.get_tensor(name).item() for name in names if name in f.keys()}  # noqa: SIM118
    return [found[name] for name in names]


def test_a_compressed_tensors_trtllm_ep_artifact_takes_the_minimum_over_the_ranks_experts(tmp_path):
    """CT W4A4 TRT-LLM (b200): `CompressedTensorsW4A4Nvfp4MoE` allocates its input global scales for the
    rank's experts, so its `.min()` is over those (rank 1's differs from TP 1's global minimum here)."""
    out = tmp_path / "ep"
    done = convert(CT, out, "--profile", "b200", "--backend", "flashinfer_trtllm", "--ep", "2")
    assert done.returncode == 0, done.stderr
    for rank, (start, end) in _plans(out).items():
        part = _rank(out, rank)
        for layer in (0, 1):
            for proj, name in (("gate_proj", "w13_input_scale_quant"), ("down_proj", "w2_input_scale_quant")):
                local = min(_stored(layer, range(start, end), proj))
                got = part[f"model.layers.{layer}.mlp.experts.{name}"]
                assert got.tolist() == [local] * (end - start), (rank, layer, name)
    assert min(_stored(1, range(2, 4), "gate_proj")) != min(_stored(1, range(4), "gate_proj"))


# ---- the loader's placement ------------------------------------------------------------------------


def test_the_nvfp4_layer_places_the_ep_ranks_experts():
    """`nvfp4_layer` gives SGLang's first local expert (moe_ep_rank x local experts), which the loader
    compares with the artifact's plan (checks.rank_mismatch)."""
    method = types.SimpleNamespace(enable_flashinfer_trtllm_moe=True, use_flashinfer_trtllm_weight_layout=True,
                                   _moe_runner_backend=types.SimpleNamespace(value="flashinfer_trtllm"))  # fmt: skip
    module = types.SimpleNamespace(
        moe_runner_config=types.SimpleNamespace(is_gated=True, activation="silu"),
        moe_ep_size=2, moe_ep_rank=1, moe_tp_size=1, moe_tp_rank=0, num_local_experts=2,
        w2_weight=torch.empty(2, 256, 64), intermediate_size_per_partition=128,
    )  # fmt: skip
    live = nvfp4_layer("p", method, module)
    assert (live.rank, live.first_expert, live.num_experts, live.ep_size) == (1, 2, 2, 2)
    module.moe_ep_size, module.moe_ep_rank, module.num_local_experts = 1, 0, 4
    assert nvfp4_layer("p", method, module).first_expert == 0
