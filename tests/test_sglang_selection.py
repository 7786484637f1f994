"""SGLang 0.5.23's GPT-OSS MXFP4 runner choice (selection/sglang/mxfp4_0_5_23.py) and
`--runtime sglang==X.Y.Z` (target/releases.py, target/sglang_revisions.py). docs/sglang.md."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.mxfp4 import moe_backend_names, select_backend
from mxconvert.selection.report import SelectionRefused
from mxconvert.target.backends import Mxfp4Backend as B
from mxconvert.target.profiles import get_profile
from mxconvert.target.releases import resolve_runtime
from mxconvert.target.revisions import REVISIONS

ROW = resolve_runtime("sglang==0.5.23", "mxfp4").revision


def _select(profile, backend="auto", **deployment):
    p = get_profile(profile) if isinstance(profile, str) else profile
    return select_backend(p, ROW, Deployment(**deployment), backend)


def test_runtime_pin_resolves_to_the_sglang_row():
    resolved = resolve_runtime("sglang==0.5.23", "mxfp4")
    assert (resolved.revision.name, resolved.revision.runtime, resolved.release) == (
        "sglang-0.5.23",
        "sglang",
        "0.5.23",
    )
    assert resolve_runtime("sglang-0.5.23", "mxfp4").revision is resolved.revision
    assert "sglang-0.5.23" not in REVISIONS  # vLLM's rows stay as they were


@pytest.mark.parametrize("spec", ["sglang==0.5.22", "sglang==0.5", "sglang==x"])
def test_other_sglang_releases_are_refused(spec):
    with pytest.raises(InputError, match="0.5.23"):
        resolve_runtime(spec, "mxfp4")


def test_vllm_pins_do_not_reach_the_sglang_row():
    with pytest.raises(InputError, match="vLLM 0.5.23 is not covered"):
        resolve_runtime("vllm==0.5.23", "mxfp4")


def test_sm100_auto_is_flashinfer_trtllm_with_mxfp8_activations():
    s = _select("b200")
    assert (s.backend, s.activation, s.revision) == (B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "mxfp8", "sglang-0.5.23")
    assert [c.chosen for c in s.considered] == [True]


def test_hopper_auto_is_triton_kernel_and_reports_what_it_passed_over():
    s = _select("h100")
    assert s.backend == B.TRITON
    passed = {c.backend: c.reason for c in s.considered if not c.chosen}
    assert set(passed) == {B.FLASHINFER_TRTLLM_MXFP4_MXFP8, B.FLASHINFER_CUTLASS_MXFP4_MXFP8, B.AITER_MXFP4_BF16}
    assert "SM100 only" in passed[B.FLASHINFER_TRTLLM_MXFP4_MXFP8]
    assert "SGLANG_USE_AITER" in passed[B.AITER_MXFP4_BF16]
    assert s.considered[-1].chosen and s.considered[-1].backend == B.TRITON


def test_hopper_with_expert_parallelism_dequantizes_so_it_is_refused():
    with pytest.raises(SelectionRefused, match="upcast_from_mxfp") as err:
        _select("h100", ep=2)
    assert any("ep_size == 1" in c.reason for c in err.value.considered)


def test_hopper_without_triton_kernels_is_refused():
    with pytest.raises(SelectionRefused, match="bfloat16"):
        _select(replace(get_profile("h100"), has_triton_kernels=False))


def test_blackwell_driver_595_takes_the_bf16_triton_runner():
    profile = replace(get_profile("h100"), name="sm110", capability=(11, 0), extra={"nvidia_driver": "595.10"})
    with pytest.raises(SelectionRefused, match="bf16 triton runner"):
        _select(profile)
    assert _select(replace(profile, extra={"nvidia_driver": "580.1"})).backend == B.TRITON


def test_rocm_with_sglang_use_aiter_is_aiter():
    s = _select("mi355x", env={"SGLANG_USE_AITER": "1"})
    assert s.backend == B.AITER_MXFP4_BF16
    assert _select("mi355x").backend == B.TRITON


def test_requested_flashinfer_mxfp4_follows_the_device():
    assert _select("h100", "flashinfer_mxfp4").backend == B.FLASHINFER_CUTLASS_MXFP4_BF16
    assert _select("b200", "flashinfer_mxfp4").backend == B.FLASHINFER_TRTLLM_MXFP4_MXFP8
    with pytest.raises(SelectionRefused, match="requires SM90, SM100, or SM120"):
        _select("mi355x", "flashinfer_mxfp4")


def test_requested_marlin_needs_sm90_or_newer():
    assert _select("h100", "marlin").backend == B.MARLIN
    with pytest.raises(SelectionRefused, match="SM90"):
        _select(replace(get_profile("h100"), capability=(8, 0)), "marlin")


def test_requested_triton_kernel_with_ep_is_refused():
    with pytest.raises(SelectionRefused, match="ep_size == 1"):
        _select("h100", "triton_kernel", ep=2)


def test_names():
    assert moe_backend_names(ROW)[0] == "auto"
    with pytest.raises(InputError, match="unknown SGLang --moe-runner-backend"):
        _select("h100", "flashinfer_trtllm_mxfp8")
    with pytest.raises(SelectionRefused, match="not a GPT-OSS MXFP4 path"):
        _select("h100", "flashinfer_cutedsl")


# ---- `mxconvert select` under the SGLang row -----------------------------------------------------------------------
def test_select_reports_the_choice_even_where_convert_refuses_its_layout():
    """H100: SGLang's auto choice is its triton_kernel runner (TRITON), whose bytes are not proven:
    select prints the whole report (every passed-over backend with SGLang's reason), then refuses."""
    result = run_cli("select", EXAMPLE, "--runtime", "sglang==0.5.23", "--profile", "h100", env={"COLUMNS": "200"})
    assert result.exit_code == 2
    out = result.stdout
    assert "runtime sglang-0.5.23 (SGLang 0.5.23)" in out
    assert "auto picks flashinfer_mxfp4 on SM100 only, profile h100 is 9.0" in out
    assert "needs ROCm with SGLANG_USE_AITER=1" in out
    assert "TRITON (Mxfp4MoEMethod), activation bf16" in out
    assert "TRITON under sglang-0.5.23: its bytes are not proven yet" in result.stderr


def test_select_of_a_proven_sglang_backend_succeeds():
    result = run_cli("select", EXAMPLE, "--runtime", "sglang==0.5.23", "--profile", "b200", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "FLASHINFER_TRTLLM_MXFP4_MXFP8 (Mxfp4MoEMethod), activation mxfp8, padded hidden 512" in result.stdout


def test_select_json_of_a_refused_layout_prints_no_report():
    """--json prints one document: a refused layout is the error alone, of the kind it always had."""
    result = run_cli("select", EXAMPLE, "--runtime", "sglang==0.5.23", "--profile", "h100", "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "UnsupportedError" and "not proven yet" in error["message"]


def test_a_vllm_row_with_an_unproven_layout_reports_the_same_way():
    # vllm-0.24 selects NVFP4 FLASHINFER_TRTLLM on B200, whose bytes 0.24.0 lays out otherwise
    # (tests/golden/tensors/vllm-0.24.0-nvfp4.json): the report, then the refusal
    request = ("--runtime", "vllm-0.24", "--profile", "b200", "--backend", "flashinfer_trtllm")
    result = run_cli("select", EXAMPLE.parent / "tiny-nvfp4-modelopt-qwen3", *request, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "FLASHINFER_TRTLLM" in result.stdout and "chosen" in result.stdout
    assert "not proven yet" in result.stderr


# ---- `mxconvert runtimes` and `mxconvert backends` show the SGLang row ---------------------------------------------
def test_backends_lists_the_sglang_row_with_its_runner_names():
    rows = [r for r in json.loads(run_cli("backends", "--json").stdout)["backends"] if r["revision"] == "sglang-0.5.23"]
    by_backend = {r["backend"]: r for r in rows}
    assert by_backend["FLASHINFER_TRTLLM_MXFP4_MXFP8"]["moe_backend"] == "flashinfer_mxfp4"
    assert "b200" in by_backend["FLASHINFER_TRTLLM_MXFP4_MXFP8"]["selected_on"]
    assert by_backend["TRITON"]["moe_backend"] == "triton_kernel" and "h100" in by_backend["TRITON"]["selected_on"]
    assert all(r["sglang"] == "0.5.23" and "vllm" not in r for r in rows)
    text = run_cli("backends", env={"COLUMNS": "200"}).stdout
    assert "MXFP4, sglang-0.5.23 (SGLang 0.5.23)" in text and "--moe-runner-backend (SGLang)" in text


def test_runtimes_lists_the_sglang_row_after_vllms():
    doc = json.loads(run_cli("runtimes", "--json").stdout)
    names = [r["name"] for r in doc["rows"]]
    assert names[: len(REVISIONS)] == list(REVISIONS) and names[len(REVISIONS) :] == ["sglang-0.5.23"]
    row = doc["rows"][-1]
    assert row["runtime"] == "sglang" and row["releases"] == {"mxfp4": ["0.5.23"], "nvfp4": ["0.5.23"]}
    assert "FLASHINFER_TRTLLM_MXFP4_MXFP8" not in row["unproven_layouts"] and "TRITON" in row["unproven_layouts"]
    assert row["backends"]["mxfp4"][0] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    text = run_cli("runtimes", env={"COLUMNS": "200"}).stdout
    assert "sglang-0.5.23: SGLang releases MXFP4 0.5.23" in text
    unwritten = next(line for line in text.splitlines() if "sglang-0.5.23 selects but does not write" in line)
    assert "(bytes not proven yet): " in unwritten and "TRITON" in unwritten
    assert "FLASHINFER_CUTLASS_MXFP4_MXFP8" not in unwritten  # proven: tests/test_sglang_cutlass.py
