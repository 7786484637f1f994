"""The vLLM plugin's runtime checks are plain data comparisons: they run without vLLM installed.

(The plugin against vLLM 0.33.0 itself is tested in tests_vllm/, run in .venv-vllm by `make test`.)
"""

from __future__ import annotations

import importlib
import json
import sys

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.runtimes.vllm.checks import (
    LiveLayer,
    LiveRuntime,
    convert_command,
    layer_mismatches,
    rank_mismatch,
    refusal,
    runtime_mismatches,
    version_in_range,
)

H100 = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.5.1")


@pytest.fixture(scope="module")
def gpt_oss_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("plugin") / "h100"
    result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out)
    assert result.exit_code == 0, result.output
    return out


def _layer(**kw) -> LiveLayer:
    base = dict(
        prefix="model.layers.0.mlp.experts",
        backend="TRITON",
        hidden_size_padded=320,
        intermediate_size_padded=320,
        tp_size=1,
        ep_size=1,
        rank=0,
        num_experts=4,
    )
    return LiveLayer(**(base | kw))


def test_core_and_plugin_checks_import_without_vllm():
    assert "vllm" not in sys.modules
    importlib.import_module("mxconvert.runtimes.vllm")
    importlib.import_module("mxconvert.runtimes.vllm.checks")
    assert "vllm" not in sys.modules


def test_version_ranges():
    assert version_in_range("0.33.0", "0.33.0")
    assert not version_in_range("0.33.1", "0.33.0")
    assert version_in_range("0.20.0", "0.19.0-0.20.0") and not version_in_range("0.21.0", "0.19.0-0.20.0")
    assert version_in_range("0.15.1", "~0.15.0") and not version_in_range("0.16.0", "~0.15.0")
    assert version_in_range("0.33.0+cpu", "0.33.0")


def test_matching_artifact_has_no_mismatch(gpt_oss_artifact):
    manifest = json.loads((gpt_oss_artifact / "mxconvert.json").read_text())
    target = manifest["target"]
    assert runtime_mismatches(target, H100) == []
    assert layer_mismatches(target, _layer(), H100) == []
    assert rank_mismatch(manifest, _layer()) is None


@pytest.mark.parametrize(
    "live, field",
    [
        (LiveRuntime("0.34.0", "cuda", [9, 0], None, "3.5.1"), "vllm_version"),
        (LiveRuntime("0.33.0", "cuda", [10, 0], None, "3.5.1"), "capability"),
        (LiveRuntime("0.33.0", "rocm", [9, 5], "gfx950", "3.5.1"), "platform"),
    ],
)
def test_runtime_refusals_name_the_field(gpt_oss_artifact, live, field):
    manifest = json.loads((gpt_oss_artifact / "mxconvert.json").read_text())
    found = runtime_mismatches(manifest["target"], live)
    assert [m.field for m in found] == [field]
    message = str(refusal("ART/mxconvert.json", found, manifest, live, None))
    assert f"field '{field}'" in message and "mxconvert convert" in message and "reconvert" in message


@pytest.mark.parametrize(
    "change, field",
    [
        ({"backend": "FLASHINFER_TRTLLM_MXFP4_BF16"}, "backend"),
        ({"tp_size": 2}, "tp_size"),
        ({"ep_size": 2, "tp_size": 1}, "ep_size"),
        ({"intermediate_size_padded": 384}, "intermediate_size_padded"),
        ({"hidden_size_padded": 512}, "hidden_size_padded"),
    ],
)
def test_layer_refusals_name_the_field(gpt_oss_artifact, change, field):
    manifest = json.loads((gpt_oss_artifact / "mxconvert.json").read_text())
    found = layer_mismatches(manifest["target"], _layer(**change), H100)
    assert field in [m.field for m in found]
    line = next(m for m in found if m.field == field).line()
    assert repr(manifest["target"][field]) in line and repr(change[field]) in line


def test_triton_kernels_generation_and_rank(gpt_oss_artifact):
    manifest = json.loads((gpt_oss_artifact / "mxconvert.json").read_text())
    other_tk = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.6.0")
    assert [m.field for m in layer_mismatches(manifest["target"], _layer(), other_tk)] == ["triton_kernels"]
    bad = rank_mismatch(manifest, _layer(rank=1))
    assert bad is not None and bad.field == "rank" and bad.artifact == [0] and bad.live == 1


def test_convert_command_targets_the_live_worker(gpt_oss_artifact):
    manifest = json.loads((gpt_oss_artifact / "mxconvert.json").read_text())
    b200 = LiveRuntime("0.33.0", "cuda", [10, 0], None, "3.5.1")
    cmd = convert_command(manifest, b200, _layer(backend="FLASHINFER_TRTLLM_MXFP4_BF16", tp_size=2))
    assert "--profile b200" in cmd and "--backend flashinfer_trtllm " in cmd and "--tp 2" in cmd
    assert cmd.startswith("mxconvert convert ") and "--runtime vllm-0.33" in cmd
