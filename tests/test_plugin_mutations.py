"""The plugin's file and layer-set checks and the release of checkpoint-shaped parameters, without vLLM
(issue 20, item 10): `ArtifactInstaller` on plain torch modules standing in for the layers vLLM builds.

Each check is held by a test, and the same case run with the check taken out (the mutation, a
monkeypatch) shows that the test would see it go. tests_vllm/test_plugin_mutations.py holds the same
checks (and the g1_scale_c and NVFP4 padding checks) against vLLM 0.33.0's own layers.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, rank_tensor, run_cli

import mxconvert.runtimes.vllm.installer as installer_module
from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.checks import ArtifactMismatch, LiveLayer, LiveRuntime
from mxconvert.runtimes.vllm.install import EXPERT_NAMES
from mxconvert.runtimes.vllm.installer import ArtifactInstaller

H100 = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.5.1")
PREFIXES = ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("mutations") / "h100"
    result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def art(made, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(made, copy)
    return copy


def layers(art, prefixes=PREFIXES) -> list[tuple[str, torch.nn.Module, LiveLayer]]:
    """Modules holding checkpoint-shaped expert parameters, and what vLLM would report for them."""
    target = json.loads((art / "mxconvert.json").read_text())["target"]
    out = []
    for prefix in prefixes:
        module = torch.nn.Module()
        for name in EXPERT_NAMES:
            module.register_parameter(name, torch.nn.Parameter(torch.ones(4, 8, 16), requires_grad=False))
        live = LiveLayer(
            prefix=prefix,
            backend=target["backend"],
            hidden_size_padded=target["hidden_size_padded"],
            intermediate_size_padded=target["intermediate_size_padded"],
            tp_size=1,
            ep_size=1,
            rank=0,
            num_experts=4,
        )
        out.append((prefix, module, live))
    return out


def prepare(art, verify_checksums: bool = True, prefixes=PREFIXES) -> list[torch.nn.Module]:
    installer = ArtifactInstaller(art, verify_checksums=verify_checksums)
    installer.check_runtime(H100)
    found = layers(art, prefixes)
    try:
        installer.prepare(found)
    finally:  # the digests, computed from prepare on beside the reads, are checked when the install ends
        installer.finish()
    return [module for _, module, _ in found]


def flip_w13(art):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)
    return file


# ---- verify_checksums ---------------------------------------------------------------------------------
def test_flipped_byte_is_refused_naming_the_file(art):
    file = flip_w13(art)
    with pytest.raises(MismatchError, match=f"{file}: sha256 .* does not match the manifest"):
        prepare(art)


def test_mutation_ignoring_verify_checksums_passes_the_flipped_byte(art, monkeypatch):
    flip_w13(art)
    monkeypatch.setattr(installer_module.FileChecks, "check", lambda self: None)
    assert len(prepare(art)) == 2


def test_verify_checksums_false_skips_the_hashing(art):
    flip_w13(art)
    assert len(prepare(art, verify_checksums=False)) == 2


# ---- the MoE layer set ------------------------------------------------------------------------------------
def test_model_with_fewer_moe_layers_is_refused(art):
    with pytest.raises(ArtifactMismatch, match=r"only in the artifact \['model\.layers\.1\.mlp\.experts'\]"):
        prepare(art, prefixes=PREFIXES[:1])


def test_model_with_more_moe_layers_is_refused(art):
    more = [*PREFIXES, "model.layers.2.mlp.experts"]
    with pytest.raises(ArtifactMismatch, match=r"only in the model vLLM built \['model\.layers\.2\.mlp\.experts'\]"):
        prepare(art, prefixes=more)


def test_mutation_without_the_layer_set_check_passes(art, monkeypatch):
    monkeypatch.setattr(installer_module, "check_layer_set", lambda where, entry, prefixes, engine: None)
    assert len(prepare(art, prefixes=PREFIXES[:1])) == 1


# ---- release of the checkpoint-shaped parameters ------------------------------------------------------
def held_bytes(module: torch.nn.Module) -> dict[str, int]:
    return {name: getattr(module, name).untyped_storage().nbytes() for name in EXPERT_NAMES}


def test_checkpoint_parameters_are_released(art):
    for module in prepare(art):
        for name in EXPERT_NAMES:
            param = getattr(module, name)
            assert isinstance(param, torch.nn.Parameter) and tuple(param.shape) == (4, 8, 16)
        assert held_bytes(module) == {name: 4 for name in EXPERT_NAMES}  # one float32 element each


def test_mutation_keeping_the_parameters_is_seen(art, monkeypatch):
    row = installer_module.INSTALLS["mxfp4"]
    monkeypatch.setitem(installer_module.INSTALLS, "mxfp4", dataclasses.replace(row, release=lambda layer: None))
    for module in prepare(art):
        assert held_bytes(module) == {name: 4 * 8 * 16 * 4 for name in EXPERT_NAMES}


# ---- the copied files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("verify_checksums", [True, False])
def test_edited_copied_file_is_refused_before_the_model_is_built(art, verify_checksums):
    config = art / "config.json"
    config.write_text(config.read_text().replace('"num_local_experts": 4', '"num_local_experts": 8'))
    installer = ArtifactInstaller(art, verify_checksums=verify_checksums)
    with pytest.raises(MismatchError, match=f"{config}: sha256 "):
        installer.check_runtime(H100)


def test_missing_copied_file_is_refused(art):
    (art / "tokenizer.json").unlink()
    with pytest.raises(MismatchError, match="tokenizer.json: missing"):
        ArtifactInstaller(art).check_runtime(H100)


def test_mutation_without_the_copied_file_check_passes(art, monkeypatch):
    config = art / "config.json"
    config.write_text(config.read_text().replace('"num_local_experts": 4', '"num_local_experts": 8'))
    monkeypatch.setattr(installer_module, "check_copied_files", lambda root, manifest: None)
    ArtifactInstaller(art).check_runtime(H100)
