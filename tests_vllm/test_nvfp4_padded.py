"""NVFP4 sizes that make vLLM 0.33.0 pad, through the plugin.

The Qwen3 examples need no padding (hidden 256, intermediate 128). Here a Qwen3-MoE checkpoint with
hidden 192 and moe_intermediate 64 is written on the fly by the examples' own generator
(examples/make_tiny_nvfp4_moe.py, `write_tiny_nvfp4_moe`), in both formats. vLLM 0.33.0 pads it, per
backend (vllm/model_executor/layers/quantization/utils/flashinfer_fp4_moe.py,
flashinfer_utils.py `align_fp4_moe_*`, marlin_utils_fp4.py `prepare_nvfp4_moe_layer_for_marlin`):
  * FLASHINFER_TRTLLM: hidden to a multiple of 256 (192 -> 256), the gated intermediate size to 64
    (TP=2: 32 -> 64);
  * FLASHINFER_CUTEDSL: the same (hidden 256, intermediate 64);
  * MARLIN: the intermediate size to 128 when hidden is not a multiple of 128 (64 -> 128, TP=2:
    32 -> 128), in its tensors only;
  * FLASHINFER_CUTLASS, VLLM_CUTLASS, FLASHINFER_CUTEDSL_BATCHED: the 128x4 block-scale swizzle pads
    w2's scale rows 192 -> 256 (TP=1; at TP=2 the gated 2 x 32 rows are refused by vLLM and mxconvert).
Path A = path B (every field of the blocks, `moe_config`'s padded sizes included) for each, and path A
is checked to have padded (a kernel tensor larger than the checkpoint's). The DeepSeek examples
(test_nvfp4_deepseek.py) pad with hidden 128, the other branch of Marlin's rule.

Refusal: an artifact whose padded sizes are not the ones vLLM pads the live layer to (made by a
conversion whose revision row pads hidden to 512) is refused naming `hidden_padded`, before any
weight file is opened.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import harness as H
import harness_nvfp4 as N
import pytest

from mxconvert.core.errors import MismatchError

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

HIDDEN, INTERMEDIATE = 192, 64
PADS_TP2 = ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "MARLIN")
TP1_ONLY = ("FLASHINFER_CUTLASS", "VLLM_CUTLASS", "FLASHINFER_CUTEDSL_BATCHED")
CASES = (
    [("modelopt", b, p) for b in PADS_TP2 for p in N.PARALLEL]
    + [("modelopt", b, "tp1") for b in TP1_ONLY]
    + [("ct", b, "tp2-rank1") for b in PADS_TP2]
    + [("ct", "VLLM_CUTLASS", "tp1")]
)


@pytest.fixture(scope="module")
def padded_checkpoints(tmp_path_factory) -> dict:
    """The generator's Qwen3-MoE checkpoint at hidden 192 / moe_intermediate 64, in both formats."""
    spec = importlib.util.spec_from_file_location("make_tiny_nvfp4_moe", H.REPO / "examples" / "make_tiny_nvfp4_moe.py")
    make = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, make)  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(make)
    root = tmp_path_factory.mktemp("padded")
    return {
        key: make.write_tiny_nvfp4_moe(
            root / key, fmt=fmt, arch="qwen3_moe", hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE
        )
        for key, fmt in (("modelopt", "modelopt"), ("ct", "compressed-tensors"))
    }


def padded_artifact(artifacts, target: N.Target):
    profile, args, _ = N.BACKENDS[target.backend]
    if target.backend in TP1_ONLY:
        return artifacts.in_process(target.path, profile, *args, tps=("1",))
    return N.artifact_for(artifacts, target)


def padded_tensors(layer, tp: int) -> list[str]:
    """Kernel tensors holding more bytes than the checkpoint's slice of this rank (FP4 and E4M3 bytes)."""
    e, h, i = layer.local_num_experts, HIDDEN, INTERMEDIATE // tp
    unpadded = {
        "w13_weight": e * 2 * i * h // 2,
        "w2_weight": e * h * i // 2,
        "w13_weight_scale": e * 2 * i * h // 16,
        "w2_weight_scale": e * h * i // 16,
    }
    return [n for n, size in unpadded.items() if getattr(layer, n).numel() * getattr(layer, n).element_size() > size]


@pytest.mark.parametrize("checkpoint, backend, parallel", CASES)
def test_padded_sizes_plugin_equals_vllm(artifacts, padded_checkpoints, checkpoint, backend, parallel):
    target = N.target(checkpoint, backend, parallel, source=padded_checkpoints[checkpoint])
    model_a = N.path_a(target)
    for layer in N.routed_experts(model_a):
        assert padded_tensors(layer, target.tp), "vLLM padded nothing: the checkpoint does not test padding"
    model_b, installer = N.path_b(target, padded_artifact(artifacts, target))
    assert N.padded_sizes(model_a) == N.padded_sizes(model_b)
    N.assert_same_state(target, model_a, model_b, installer)


def test_artifact_padded_otherwise_is_refused(padded_checkpoints, tmp_path, monkeypatch, opened):
    """An artifact made for vLLM 0.33.0 by a conversion whose revision row pads hidden to 512 (a valid,
    fingerprinted artifact): its tensors do not have the sizes vLLM pads this layer to."""
    from typer.testing import CliRunner

    from mxconvert.cli.main import app
    from mxconvert.target import revisions

    row = revisions.REVISIONS["vllm-0.33"]
    assert row.nvfp4_fi_padding == (256, 64)  # what vLLM 0.33.0 pads to (the path A tests above)
    monkeypatch.setitem(revisions.REVISIONS, "vllm-0.33", dataclasses.replace(row, nvfp4_fi_padding=(512, 64)))
    out = tmp_path / "art"
    done = CliRunner().invoke(
        app,
        ["convert", str(padded_checkpoints["modelopt"]), "--profile", "b200", "-o", str(out)],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output
    monkeypatch.setitem(revisions.REVISIONS, "vllm-0.33", row)
    opened.clear()
    target = N.target("modelopt", "FLASHINFER_TRTLLM", "tp1", source=padded_checkpoints["modelopt"])
    with pytest.raises(MismatchError) as err:
        N.path_b(target, out)
    assert "field 'hidden_padded': artifact has 512, this layer model.layers.0.mlp.experts has 256" in str(err.value), (
        str(err.value)
    )
    assert "intermediate_padded" not in str(err.value)
    assert opened == []
    # the same conversion under the real row loads
    art = tmp_path / "good"
    assert (
        CliRunner()
        .invoke(app, ["convert", str(padded_checkpoints["modelopt"]), "--profile", "b200", "-o", str(art)])
        .exit_code
        == 0
    )
    model, installer = N.path_b(target, art)
    assert len(installer.sources) == N.NUM_LAYERS
    assert N.padded_sizes(model) == [(256, 64, HIDDEN)] * N.NUM_LAYERS
