"""Expert parallelism under the SGLang row (docs/sglang.md, "Expert parallelism"), on CPU without SGLang:
which MXFP4 backends SGLang 0.5.23 runs with ep_size > 1 (the others refused with the reason), the serve
command in SGLang's own flags (`--tp-size`, `--ep-size`), `--dp` refused, the EP artifact (each rank the
TP-1 bytes of its experts, SGLang's contiguous placement) and the loader's expert-id check. Path A =
path B of the EP artifacts is tests_sglang/test_ep.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from fixtures_ckpt import EXAMPLE_DIR, REPO_ROOT
from safetensors.torch import load_file

from mxconvert.core.errors import InputError
from mxconvert.pipeline.plan import serve_command
from mxconvert.runtimes.sglang.checks import SglangLayer, rank_mismatch
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.report import SelectionRefused
from mxconvert.selection.sglang import mxfp4_0_5_23 as mirror
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.profiles import get_profile
from mxconvert.target.releases import resolve_runtime

ROW = resolve_runtime("sglang==0.5.23", "mxfp4").revision
EP2 = Deployment(tp=2, ep=2)


NVFP4_EXAMPLE = REPO_ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"


def run(command: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mxconvert", command, str(EXAMPLE_DIR), "--runtime", "sglang==0.5.23", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


# ---- selection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "runner", "backend"),
    [
        ("b200", "auto", B.FLASHINFER_TRTLLM_MXFP4_MXFP8),
        ("rtx-pro-6000", "auto", B.FLASHINFER_CUTLASS_MXFP4_MXFP8),
        ("h100", "flashinfer_mxfp4", B.FLASHINFER_CUTLASS_MXFP4_BF16),
        ("h100", "marlin", B.MARLIN),
    ],
)
def test_the_backends_sglang_runs_with_ep_are_selected_under_ep(profile, runner, backend):
    assert mirror.select(get_profile(profile), ROW, EP2, runner).backend is backend
    assert backend in mirror.EP_BACKENDS


def test_aiter_under_ep_is_refused_with_the_reason():
    deployment = Deployment(tp=2, ep=2, env={"SGLANG_USE_AITER": "1"})
    with pytest.raises(SelectionRefused, match="expert parallelism is mirrored for") as err:
        mirror.select(get_profile("mi355x"), ROW, deployment)
    aiter = [c for c in err.value.considered if c.backend is B.AITER_MXFP4_BF16]
    assert aiter and not aiter[-1].chosen and "expert_mask" in aiter[-1].reason
    # the same row without EP is chosen: only EP refuses it
    assert mirror.select(get_profile("mi355x"), ROW, Deployment(tp=2, env={"SGLANG_USE_AITER": "1"})).backend is (
        B.AITER_MXFP4_BF16
    )


def test_dp_has_no_sglang_meaning_and_is_refused():
    with pytest.raises(InputError, match="--dp 2 has no SGLang 0.5.23 meaning.*--tp-size T --ep-size T"):
        mirror.select(get_profile("b200"), ROW, Deployment(tp=1, dp=2))


# ---- the serve command ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp_size", "ep_size", "flags"),
    [
        (1, 1, "--tp-size 1"),
        (2, 1, "--tp-size 2"),
        (1, 2, "--tp-size 2 --ep-size 2"),
        (1, 4, "--tp-size 4 --ep-size 4"),
    ],
)
def test_the_serve_command_gives_sglangs_tp_and_ep_sizes(tp_size, ep_size, flags):
    target = {"runtime_revision": "sglang-0.5.23", "tp_size": tp_size, "ep_size": ep_size, "requested_backend": "auto"}
    assert serve_command(target, "ART") == f"sglang serve --model-path ART --load-format mxconvert {flags}"


# ---- convert --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "backend"), [("b200", "auto"), ("h100", "marlin"), ("h100", "flashinfer_mxfp4")], ids=str
)
def test_an_ep_artifact_holds_each_ranks_experts_as_tp1_lays_them_out(tmp_path, profile, backend):
    """EP 2 (`--tp 2 --enable-expert-parallel`, vLLM's spelling, is the same deployment): rank r holds
    global experts 2r, 2r + 1 (SGLang's placement), each byte for byte what TP 1 writes for it."""
    ep_out, tp_out = tmp_path / "ep", tmp_path / "tp1"
    args = ("--profile", profile, "--backend", backend)
    done = run("convert", *args, "--tp", "2", "--enable-expert-parallel", "-o", str(ep_out))
    assert done.returncode == 0, done.stderr
    runner = "" if backend == "auto" else f" --moe-runner-backend {backend}"
    assert (
        f"serve with: sglang serve --model-path {ep_out} --load-format mxconvert --tp-size 2 --ep-size 2{runner}"
        in (done.stdout)
    )
    assert run("convert", *args, "-o", str(tp_out)).returncode == 0
    manifest = json.loads((ep_out / "mxconvert.json").read_text())
    assert (manifest["target"]["tp_size"], manifest["target"]["ep_size"]) == (1, 2)
    plans = {e["rank"]: (e["plan"]["expert_start"], e["plan"]["expert_end"]) for e in manifest["ranks"]}
    assert plans == {0: (0, 2), 1: (2, 4)}
    whole = load_file(next((tp_out / "rank-00000").glob("*.safetensors")))
    for rank, (start, end) in plans.items():
        part = load_file(next((ep_out / f"rank-{rank:05d}").glob("*.safetensors")))
        assert part.keys() == whole.keys()
        for name, tensor in part.items():
            want = whole[name][start:end]
            assert tensor.dtype == want.dtype and tensor.shape == want.shape, name
            assert torch.equal(tensor.view(torch.uint8), want.view(torch.uint8)), name


def test_convert_refuses_dp_under_sglang(tmp_path):
    done = run("convert", "--profile", "b200", "--tp", "2", "--dp", "2", "-o", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "--dp 2 has no SGLang 0.5.23 meaning" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_nvfp4_refuses_dp_under_sglang_too(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "mxconvert", "convert", str(NVFP4_EXAMPLE), "--runtime", "sglang==0.5.23"]
        + ["--profile", "b200", "--dp", "2", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--dp 2 has no SGLang 0.5.23 meaning" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_convert_refuses_aiter_under_ep(tmp_path):
    done = run("convert", "--profile", "mi355x-aiter", "--ep", "2", "-o", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not AITER_MXFP4_BF16" in done.stderr
    assert not (tmp_path / "out").exists()


# ---- the loader's expert ids ----------------------------------------------------------------------


def _layer(rank: int, first_expert: int, experts: int = 2) -> SglangLayer:
    return SglangLayer("p", "FLASHINFER_TRTLLM_MXFP4_MXFP8", 512, 384, 1, 2, rank, experts, first_expert=first_expert)


def _manifest() -> dict:
    return {"ranks": [{"rank": r, "plan": {"expert_start": 2 * r, "expert_end": 2 * r + 2}} for r in (0, 1)]}


def test_the_loader_accepts_sglangs_placement_and_refuses_another():
    assert rank_mismatch(_manifest(), _layer(1, 2)) is None
    wrong = rank_mismatch(_manifest(), _layer(1, 0))
    assert wrong is not None and (wrong.field, wrong.artifact, wrong.live) == ("experts", "2..3", "0..1")
    fewer = rank_mismatch(_manifest(), _layer(1, 2, experts=1))
    assert fewer is not None and fewer.field == "experts"


def test_layer_state_places_the_ep_ranks_experts():
    import types

    from mxconvert.runtimes.sglang.layer_state import sglang_layer

    method = types.SimpleNamespace(
        use_flashinfer=True, _fi_kernel="trtllm_sm100", hidden_size=512, intermediate_size_per_partition=384
    )
    module = types.SimpleNamespace(
        moe_tp_size=1, moe_tp_rank=0, moe_ep_size=2, moe_ep_rank=1, num_local_experts=2,
        moe_runner_config=types.SimpleNamespace(gate_up_interleaved=True),
    )  # fmt: skip
    live = sglang_layer("p", method, module)
    assert (live.rank, live.first_expert, live.num_experts) == (1, 2, 2)
    module.moe_ep_size, module.moe_ep_rank, module.num_local_experts = 1, 0, 4
    assert sglang_layer("p", method, module).first_expert == 0


def test_a_process_with_moe_tp_within_ep_is_told_what_mxconvert_writes():
    """SGLang's `--tp-size 4 --ep-size 2` (MoE TP 2 within EP 2) is not written: the refusal says so and
    which sizes to serve with, besides the mismatching fields."""
    from mxconvert.runtimes.sglang.checks import LiveSglang, refusal

    manifest = _manifest() | {"source": {"identity": {"kind": "local"}}, "provenance": {"source_path": "CKPT"}}
    layer = SglangLayer("p", "FLASHINFER_TRTLLM_MXFP4_MXFP8", 512, 192, 2, 2, 1, 2, first_expert=2)
    text = str(refusal("ART", [], manifest, LiveSglang("0.5.23", "cuda", [10, 0], "0.7.2"), layer))
    assert "MoE TP 2 within EP 2 (--tp-size 4 --ep-size 2), which mxconvert does not write" in text
    assert "--ep 2" in text
    tp_only = SglangLayer("p", "FLASHINFER_TRTLLM_MXFP4_MXFP8", 512, 192, 2, 1, 1, 4)
    assert "within EP" not in str(refusal("ART", [], manifest, LiveSglang("0.5.23", "cuda", [10, 0], "0.7.2"), tp_only))
