"""`--backend` under an SGLang row takes SGLang's own `--moe-runner-backend` names (and mxconvert's
enum names), as it takes vLLM's `--moe-backend` names under a vLLM row: each reaches the backend
SGLang 0.5.23 runs for it (selection/sglang/mxfp4_0_5_23.py RUNNER_BACKENDS)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixtures_ckpt import EXAMPLE_DIR


def select(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mxconvert", "select", str(EXAMPLE_DIR), "--runtime", "sglang==0.5.23", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("request_name", "profile", "backend"),
    [
        ("flashinfer_mxfp4", "b200", "FLASHINFER_TRTLLM_MXFP4_MXFP8"),
        ("FLASHINFER_TRTLLM_MXFP4_MXFP8", "b200", "FLASHINFER_TRTLLM_MXFP4_MXFP8"),
    ],
)
def test_a_runner_name_or_enum_name_reaches_its_backend(request_name, profile, backend):
    done = select("--profile", profile, "--backend", request_name, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == backend


def test_a_runner_name_whose_bytes_are_unproven_is_selected_then_refused():
    done = select("--profile", "h100", "--backend", "triton_kernel")
    assert done.returncode == 2
    assert "TRITON under sglang-0.5.23: its bytes are not proven yet" in done.stderr
    assert "TRITON (Mxfp4MoEMethod)" in done.stdout  # the report names SGLang's choice first


@pytest.mark.parametrize("request_name", ["marlin", "MARLIN"])
def test_marlin_by_runner_or_enum_name_is_written_and_served_with_sglangs_name(request_name):
    """MARLIN's bytes are SGLang's (tests/test_sglang_marlin.py): selected and planned, and the
    serve line names SGLang's runner."""
    done = select("--profile", "h100", "--backend", request_name)
    assert done.returncode == 0, done.stderr
    assert "serve with: sglang serve --model-path" in done.stdout and "--load-format mxconvert" in done.stdout


def test_another_runner_backend_is_refused_as_no_gpt_oss_path():
    done = select("--profile", "b200", "--backend", "flashinfer_trtllm")
    assert done.returncode == 2
    assert "is not a GPT-OSS MXFP4 path of SGLang 0.5.23" in done.stderr


def test_an_unknown_name_lists_sglangs_names():
    done = select("--profile", "b200", "--backend", "bogus")
    assert done.returncode == 2
    assert "valid: auto, flashinfer_mxfp4, triton_kernel, marlin, aiter" in done.stderr
