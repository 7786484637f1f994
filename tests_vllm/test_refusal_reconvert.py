"""Fail closed: an artifact made for another runtime is refused, naming the field, before any
weight is read; `on_mismatch: reconvert` then loads it through mxconvert's exact inverses and
vLLM's own conversion, ending in the state of vLLM's normal load for the live backend."""

from __future__ import annotations

import json
import shutil

import harness as H
import pytest

from mxconvert.core.errors import MismatchError

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

HOPPER = H.Target("TRITON", (9, 0), 1, 0)


def refused(target, art, *, live_backend=None, on_mismatch="fail") -> str:
    with pytest.raises(MismatchError) as err:
        H.path_b(target, art, on_mismatch=on_mismatch, live_backend=live_backend)
    return str(err.value)


def test_other_backend_is_refused_before_any_read(artifacts, opened):
    art = artifacts.get("h100", "--tp", "1")
    message = refused(HOPPER, art, live_backend="MARLIN")
    assert "field 'backend': artifact has 'TRITON', this layer model.layers.0.mlp.experts has 'MARLIN'" in message
    assert "mxconvert convert" in message and "--profile h100" in message and "--backend marlin" in message
    assert opened == []


def test_other_capability_is_refused(artifacts, opened):
    art = artifacts.get("h100", "--tp", "1")
    message = refused(H.Target("TRITON", (10, 0), 1, 0), art)
    assert "field 'capability': artifact has [9, 0], this worker has [10, 0]" in message
    assert "--profile b200" in message
    assert opened == []


def test_other_rank_is_refused(artifacts, opened):
    art = artifacts.get("h100", "--tp", "2", "--rank", "0")
    message = refused(H.Target("TRITON", (9, 0), 2, 1), art)
    assert "field 'rank': artifact has [0]" in message and "has 1" in message
    assert opened == []


def test_other_tp_size_is_refused_even_with_reconvert(artifacts, opened):
    art = artifacts.get("h100", "--tp", "1")
    for mode in ("fail", "reconvert"):
        message = refused(H.Target("TRITON", (9, 0), 2, 0), art, on_mismatch=mode)
        assert "field 'tp_size': artifact has 1" in message and "--tp 2" in message
    assert opened == []


def test_other_vllm_version_is_refused(artifacts, opened, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    art = artifacts.get("h100", "--tp", "1")
    for mode in ("fail", "reconvert"):
        message = refused(HOPPER, art, on_mismatch=mode)
        assert "field 'vllm_version'" in message and "'0.34.0'" in message
    assert opened == []


def test_older_revision_artifact_is_refused(artifacts, opened):
    art = artifacts.get("h100", "--tp", "1", "--runtime", "vllm-0.20")
    message = refused(HOPPER, art)
    assert "field 'runtime_revision': artifact has 'vllm-0.20 (vLLM 0.20.0-0.20.2)'" in message
    assert opened == []


def test_tampered_manifest_is_refused(artifacts, opened, tmp_path):
    art = tmp_path / "tampered"
    shutil.copytree(artifacts.get("h100", "--tp", "1"), art)
    manifest = json.loads((art / "mxconvert.json").read_text())
    manifest["target"]["layout"]["num_warps"] = 4
    (art / "mxconvert.json").write_text(json.dumps(manifest))
    message = refused(HOPPER, art)
    assert "field 'fingerprint'" in message and "edited" in message
    assert opened == []


def test_nvfp4_artifact_is_refused_by_a_gpt_oss_model(artifacts, opened):
    art = artifacts.get("b200", source=H.REPO / "examples" / "tiny-nvfp4-modelopt-qwen3")
    message = refused(H.Target("TRITON", (10, 0), 1, 0), art)
    assert "field 'format': artifact has 'nvfp4', this layer model.layers.0.mlp.experts has 'mxfp4'" in message
    assert opened == []


@pytest.mark.parametrize(
    "made, live",
    [
        (("h100", "--tp", "1"), H.Target("MARLIN", (8, 0), 1, 0)),  # TRITON -> MARLIN
        (("b200", "--tp", "2"), H.Target("TRITON", (9, 0), 2, 1)),  # TRTLLM -> TRITON
        (("h100", "--tp", "1", "--runtime", "vllm-0.20"), H.Target("TRITON", (9, 0), 1, 0)),  # 3.6.0 -> 3.5.1
    ],
)
def test_reconvert_equals_the_normal_load_of_the_live_backend(artifacts, made, live, caplog):
    art = artifacts.get(*made)
    H.reset_opt_flags()
    state_a = H.state(H.path_a(live))
    H.reset_opt_flags()
    with caplog.at_level("WARNING", logger="mxconvert.runtimes.vllm"):
        model_b, installer = H.path_b(live, art, on_mismatch="reconvert")
    state_b = H.state(model_b)
    assert sorted(installer.reconverted) == [f"model.layers.{i}.mlp.experts" for i in range(H.NUM_LAYERS)]
    assert not installer.sources
    assert "exact inverses" in caplog.text and "field '" in caplog.text
    assert state_a == state_b, H.first_difference(state_a, state_b)
