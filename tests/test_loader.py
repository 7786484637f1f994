"""`load_artifact`: kernel-format tensors as the kernel holds them, fail-closed on any mismatch."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import EXAMPLE, run_cli

from mxconvert import load_artifact
from mxconvert.artifact.manifest import seal
from mxconvert.core.errors import InputError, MismatchError


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    for name, args in {
        "h100": ("--profile", "h100"),
        "h100-020": ("--profile", "h100", "--runtime", "vllm-0.20"),
        "b200": ("--profile", "b200", "--tp", "2"),
    }.items():
        assert run_cli("convert", EXAMPLE, *args, "-o", root / name).exit_code == 0
    return root


def test_triton_tensors_come_back_as_the_transposed_views_the_kernel_holds(artifacts):
    art = load_artifact(
        artifacts / "h100",
        expect={"backend": "TRITON", "runtime_revision": "vllm-0.33", "capability": [9, 0], "tp_size": 1},
    )
    w13 = art.tensors["model.layers.0.mlp.experts.w13_weight"]
    # Hopper value storage: [E, 4*Kb, N/4] with stride 1 on dim 1 (docs/layouts.md, TRITON), logical [E, K, N]
    assert tuple(w13.shape) == (4, 640, 160) and w13.stride() == (640 * 160, 1, 640)
    assert w13.stride(-2) == 1
    desc = art.layouts["model.layers.0.mlp.experts.w13_weight"]
    assert desc["layout_class"] == "HopperMXValueLayout" and desc["logical_shape"] == [4, 320, 640]
    s13 = art.tensors["model.layers.0.mlp.experts.w13_weight_scale"]
    assert s13.dtype == torch.uint8 and s13.stride(-2) == 1
    assert art.tensors["model.layers.1.mlp.experts.w2_bias"].dtype == torch.float32
    assert "model.embed_tokens.weight" in art.tensors


def test_trtllm_scales_are_labelled_e4m3_and_rank_1_is_loadable(artifacts):
    art = load_artifact(artifacts / "b200", rank=1, expect={"tp_size": 2})
    assert art.tensors["model.layers.0.mlp.experts.w13_weight_scale"].dtype == torch.float8_e4m3fn
    assert art.tensors["model.layers.0.mlp.experts.w13_weight"].is_contiguous()
    with pytest.raises(InputError, match="no rank 2"):
        load_artifact(artifacts / "b200", rank=2)


def test_vllm_020_hopper_scales_are_followed_by_64_zero_bytes(artifacts):
    art = load_artifact(artifacts / "h100-020")
    key = "model.layers.0.mlp.experts.w13_weight_scale"
    assert art.layouts[key]["overread_bytes"] == 64
    s = art.tensors[key]
    nbytes = s.untyped_storage().nbytes()
    dense = s.numel() * s.element_size()
    assert nbytes == dense + 64
    tail = torch.frombuffer(bytearray(bytes(s.untyped_storage())[dense:]), dtype=torch.uint8)
    assert int(tail.count_nonzero()) == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("backend", "FLASHINFER_TRTLLM_MXFP4_BF16"),
        ("runtime_revision", "vllm-0.20"),
        ("capability", [10, 0]),
        ("tp_size", 2),
        ("fingerprint", "sha256:" + "0" * 64),
    ],
)
def test_any_expectation_mismatch_is_refused_naming_the_field(artifacts, field, value):
    with pytest.raises(MismatchError, match=f"field '{field}'"):
        load_artifact(artifacts / "h100", expect={field: value})


def test_unknown_expectation_is_an_input_error(artifacts):
    with pytest.raises(InputError, match="cannot expect 'colour'"):
        load_artifact(artifacts / "h100", expect={"colour": "blue"})


def test_edited_manifest_and_changed_file_are_refused(artifacts, tmp_path):
    import shutil

    art = tmp_path / "a"
    shutil.copytree(artifacts / "h100", art)
    manifest = json.loads((art / "mxconvert.json").read_text())
    manifest["target"]["backend"] = "FLASHINFER_TRTLLM_MXFP4_BF16"
    (art / "mxconvert.json").write_text(json.dumps(manifest))
    with pytest.raises(MismatchError, match="field 'fingerprint'"):
        load_artifact(art)
    # a re-sealed manifest passes the fingerprint but the caller's expectation still catches it
    (art / "mxconvert.json").write_text(json.dumps(seal({k: v for k, v in manifest.items() if k != "fingerprint"})))
    with pytest.raises(MismatchError, match="field 'backend'"):
        load_artifact(art, expect={"backend": "TRITON"})
    shutil.rmtree(art)
    shutil.copytree(artifacts / "h100", art)
    shard = art / manifest["ranks"][0]["files"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(MismatchError, match="sha256"):
        load_artifact(art)


def test_not_an_artifact(tmp_path):
    with pytest.raises(InputError, match="no mxconvert.json"):
        load_artifact(tmp_path)
