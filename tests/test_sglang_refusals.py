"""What `convert` refuses under an SGLang row because SGLang 0.5.23 itself would refuse or ignore it
(docs/sglang.md "MARLIN"): a MARLIN layer its `check_moe_marlin_supports_layer(layer, 32,
allow_tile_padding=True)` rejects (unpadded hidden % 64, the rank's `intermediate_size // tp` % 32),
and an fp8 Marlin input dtype, which SGLang's MXFP4 Marlin does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures_ckpt import EXAMPLE_DIR, make_checkpoint

from mxconvert.selection.sglang.mxfp4_0_5_23 import marlin_layer_refusal

SGLANG = ("--runtime", "sglang==0.5.23")
MARLIN_H100 = ("--profile", "h100", "--backend", "marlin")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_MARLIN_INPUT_DTYPE"} | (env or {})
    cmd = [sys.executable, "-m", "mxconvert", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environ)


# ---- A: SGLang's Marlin layer check -------------------------------------------------------------------
@pytest.mark.parametrize(("tp", "refused"), [(1, False), (2, False), (4, True), (8, True)])
def test_gpt_oss_sizes_follow_sglangs_marlin_check(tp, refused):
    """GPT-OSS (H = I = 2880): 2880 // 4 = 720 and 2880 // 8 = 360 are not multiples of 32."""
    reason = marlin_layer_refusal(2880, 2880, tp)
    assert (reason is not None) == refused
    if refused:
        assert "check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True)" in reason
        assert f"2880 // {tp} = {2880 // tp}, % 32 = {(2880 // tp) % 32}" in reason
        assert "use a --tp at which intermediate_size / tp is a multiple of 32 (here 1, 2, 3, 5, 6)" in reason


def test_a_hidden_size_sglangs_marlin_rejects_names_no_tp():
    reason = marlin_layer_refusal(288, 320, 1)
    assert reason is not None
    assert "hidden_size % 64 == 0 (here 288 % 64 = 32)" in reason
    assert "no TP size helps" in reason


def test_convert_at_a_tp_sglangs_marlin_rejects_exits_2_and_writes_nothing(tmp_path):
    """The example's I = 320: at TP 4 each rank holds 80 rows, 80 % 32 = 16."""
    out = tmp_path / "out"
    done = cli("convert", str(EXAMPLE_DIR), *SGLANG, *MARLIN_H100, "--tp", "4", "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert "SGLang 0.5.23 cannot run MARLIN for this model at MoE TP 4" in done.stderr
    assert "check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True)" in done.stderr
    assert "320 // 4 = 80, % 32 = 16" in done.stderr
    assert "use a --tp at which intermediate_size / tp is a multiple of 32 (here 1, 2, 5)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_select_prints_its_report_before_the_marlin_refusal():
    done = cli("select", str(EXAMPLE_DIR), *SGLANG, *MARLIN_H100, "--tp", "4")
    assert done.returncode == 2
    assert "MARLIN (Mxfp4MoEMethod)" in done.stdout
    assert "cannot run MARLIN for this model at MoE TP 4" in done.stderr


def test_convert_refuses_a_hidden_size_sglangs_marlin_rejects(tmp_path):
    ckpt = make_checkpoint(tmp_path, hidden_size=288)
    out = tmp_path / "out"
    done = cli("convert", str(ckpt), *SGLANG, *MARLIN_H100, "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert "hidden_size % 64 == 0 (here 288 % 64 = 32)" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("tp", [1, 2])
def test_marlin_still_converts_where_sglangs_check_passes(tmp_path, tp):
    out = tmp_path / "out"
    done = cli("convert", str(EXAMPLE_DIR), *SGLANG, *MARLIN_H100, "--tp", str(tp), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert manifest["target"]["backend"] == "MARLIN"
    assert manifest["target"]["tp_size"] == tp


def test_the_marlin_check_applies_to_marlin_only():
    """TP 4 is refused for MARLIN only: the TRT-LLM backend on a B200 plans at TP 4."""
    done = cli("select", str(EXAMPLE_DIR), *SGLANG, "--profile", "b200", "--tp", "4", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"


# ---- B: no fp8-activation MXFP4 Marlin in SGLang --------------------------------------------------------
@pytest.mark.parametrize(
    ("option", "named"),
    [
        (("--marlin-input-dtype", "fp8"), "--marlin-input-dtype fp8"),
        (("--env", "VLLM_MARLIN_INPUT_DTYPE=fp8"), "--env VLLM_MARLIN_INPUT_DTYPE=fp8"),
    ],
)
def test_an_fp8_marlin_input_under_sglang_is_refused(tmp_path, option, named):
    out = tmp_path / "out"
    done = cli("convert", str(EXAMPLE_DIR), *SGLANG, *MARLIN_H100, *option, "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert f"error: {named}: SGLang has no fp8-activation MXFP4 Marlin" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_the_marlin_input_option_is_refused_whatever_sglang_backend():
    done = cli("select", str(EXAMPLE_DIR), *SGLANG, "--profile", "b200", "--marlin-input-dtype", "fp8")
    assert done.returncode == 2
    assert "SGLang has no fp8-activation MXFP4 Marlin" in done.stderr


def test_the_variable_in_the_environment_is_reported_ignored_under_sglang():
    """A CI job may export VLLM_MARLIN_INPUT_DTYPE for a vLLM server: SGLang does not read it, so
    the plan says so and keeps the 16-bit Marlin layout."""
    done = cli("select", str(EXAMPLE_DIR), *SGLANG, *MARLIN_H100, "--json", env={"VLLM_MARLIN_INPUT_DTYPE": "fp8"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["marlin_input_dtype"] is None
    entry = report["environment"]["VLLM_MARLIN_INPUT_DTYPE"]
    assert entry["from"] == "environment" and entry["value"] == "fp8"
    assert entry["ignored"].startswith("SGLang does not read it")
