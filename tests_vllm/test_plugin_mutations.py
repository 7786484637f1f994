"""The plugin's checks, each held by a test that fails when the check is taken out (issue 20, item 10).

Mutation testing of the plugin had found four checks that no test held: a plugin that ignored
`verify_checksums`, skipped the `g1_scale_c` cross-check, skipped the artifact/model MoE layer-set
check, or kept the checkpoint-shaped parameters vLLM allocated, passed every test. Here each check
has a test of its own, and beside it the same case run against the plugin with that check taken out
(a monkeypatch turning it into a no-op: the mutation), asserting that the bad artifact then loads, or
fails only later and unclearly. So each test is shown, inside the suite, to catch its mutation.

Also held here: the copied files vLLM reads (config, tokenizer, chat template) are checked at load,
and the NVFP4 padded sizes are compared with what vLLM pads the live layer to, not with mxconvert's
own padding rule.

`verify_checksums` (`--model-loader-extra-config '{"verify_checksums": false}'`), as held here: on
(the default), the size of every weight file of the worker's rank and of shared/ is checked against
the manifest before any tensor is read and its digest while the tensors are read, before the load
returns, and a damaged file is refused naming it;
off, that hashing is skipped, and nothing else (the manifest's fingerprint, the copied files and
every runtime check still apply): a flipped byte in a weight file then loads as it is.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import harness as H
import harness_nvfp4 as N
import pytest
import torch

import mxconvert.runtimes.vllm.install_nvfp4 as install_nvfp4
import mxconvert.runtimes.vllm.installer as installer_module
from mxconvert.artifact.manifest import MANIFEST_NAME, seal, write_manifest
from mxconvert.core.digest import CHUNKED_KEY, file_digests
from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.checks import ArtifactMismatch
from mxconvert.runtimes.vllm.install import EXPERT_NAMES
from mxconvert.runtimes.vllm.install_nvfp4 import CHECKPOINT_PARAMS
from mxconvert.runtimes.vllm.installer import ArtifactInstaller

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

sys.path.insert(0, str(H.REPO / "tests"))
from helpers import flip_stored_bits, rank_tensor  # noqa: E402  (tests/helpers.py)

HOPPER = H.Target("TRITON", (9, 0), 1, 0)
TRTLLM = {name: N.target(name, "FLASHINFER_TRTLLM", "tp1") for name in ("modelopt", "ct")}


# ---- artifacts made wrong on purpose ----------------------------------------------------------------
def copy_of(art: Path, tmp_path: Path, name: str = "art") -> Path:
    out = tmp_path / name
    shutil.copytree(art, out)
    return out


def reseal(art: Path, edit=None) -> None:
    """Re-record every listed file's size and digests, apply `edit` to the manifest and seal it again:
    a well-formed artifact whose manifest agrees with its files (what a buggy or hostile writer makes),
    so only the check under test can tell."""
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    entries = [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]
    for entry in entries + manifest.get("aux_files", []):
        path = art / entry["file"]
        entry["size"] = path.stat().st_size
        entry["sha256"], chunked = file_digests(path)
        if CHUNKED_KEY in entry:
            entry[CHUNKED_KEY] = chunked
    if edit is not None:
        edit(manifest)
    write_manifest(art, seal({k: v for k, v in manifest.items() if k != "fingerprint"}))


def w13_bytes(model, layer: int) -> torch.Tensor:
    """The bytes of a GPT-OSS layer's installed w13 (a torch tensor, or triton_kernels' storage)."""
    w13 = H.routed_experts(model)[layer].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    return data.detach().contiguous().view(torch.uint8).flatten().clone()


@pytest.fixture
def flipped(artifacts, tmp_path):
    """The H100 artifact with bit 0 of the first byte of layer 0's w13_weight flipped in its rank file."""
    art = copy_of(artifacts.get("h100", "--tp", "1"), tmp_path)
    key, file = rank_tensor(art, "w13_weight")
    assert key == "model.layers.0.mlp.experts.w13_weight"
    flip_stored_bits(file, key, 0, 0x01)
    return art, file


# ---- (i) verify_checksums ---------------------------------------------------------------------------
def test_flipped_expert_byte_is_refused_naming_the_file(flipped):
    """Refused when the conversion bypass ends, before the load returns a model; the digests are
    computed while the tensors are read (issue 26 item 4), no longer before any tensor is read."""
    art, file = flipped
    with pytest.raises(MismatchError) as err:
        H.path_b(HOPPER, art)
    assert f"{file}: sha256 " in str(err.value) and "does not match the manifest" in str(err.value)


def test_mutation_ignoring_verify_checksums_loads_the_flipped_byte(flipped, artifacts, monkeypatch):
    """The same artifact through a plugin that never hashes the files: it loads the flipped byte."""
    art, _ = flipped
    monkeypatch.setattr(installer_module.FileChecks, "check", lambda self: None)
    model, installer = H.path_b(HOPPER, art)
    clean, _ = H.path_b(HOPPER, artifacts.get("h100", "--tp", "1"))
    assert int((w13_bytes(model, 0) != w13_bytes(clean, 0)).sum()) == 1


def test_verify_checksums_false_skips_the_hashing_only(flipped, artifacts, opened):
    """Off, as documented: the flipped byte loads as it is (nothing else changes)."""
    art, _ = flipped
    model, installer = H.path_b(HOPPER, art, verify_checksums=False)
    assert len(installer.sources) == H.NUM_LAYERS
    clean, _ = H.path_b(HOPPER, artifacts.get("h100", "--tp", "1"), verify_checksums=False)
    assert int((w13_bytes(model, 0) != w13_bytes(clean, 0)).sum()) == 1
    assert int((w13_bytes(model, 1) != w13_bytes(clean, 1)).sum()) == 0


def test_the_loader_passes_verify_checksums_through():
    from vllm.config.load import LoadConfig

    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    assert MxconvertModelLoader(LoadConfig(load_format="mxconvert")).verify_checksums is True
    off = MxconvertModelLoader(
        LoadConfig(load_format="mxconvert", model_loader_extra_config={"verify_checksums": False})
    )
    assert off.verify_checksums is False
    assert off.load_config.model_loader_extra_config == {}  # vLLM's default loader never sees it


# ---- (ii) g1_scale_c --------------------------------------------------------------------------------
@pytest.fixture(params=sorted(TRTLLM))
def wrong_scale_c(request, artifacts, tmp_path):
    """A sealed TRTLLM artifact whose layer 1 `g1_scale_c` is not what vLLM computes from its scales."""
    target = TRTLLM[request.param]
    art = copy_of(N.artifact_for(artifacts, target), tmp_path)
    key = "model.layers.1.mlp.experts.g1_scale_c"
    rank = json.loads((art / MANIFEST_NAME).read_text())["ranks"][0]
    flip_stored_bits(art / rank["tensors"][key]["file"], key, 0, 0x01)  # the lowest mantissa bit
    reseal(art)
    return target, art


def test_g1_scale_c_other_than_vllm_computes_is_refused(wrong_scale_c):
    target, art = wrong_scale_c
    with pytest.raises(MismatchError, match=r"model\.layers\.1\.mlp\.experts\.g1_scale_c: vLLM computed other bytes"):
        N.path_b(target, art)


def test_mutation_without_the_g1_scale_c_check_loads_it(wrong_scale_c, monkeypatch):
    target, art = wrong_scale_c
    monkeypatch.setattr(install_nvfp4, "check_scale_c", lambda layer, source: None)
    model, installer = N.path_b(target, art)
    assert len(installer.sources) == N.NUM_LAYERS


# ---- (iii) the MoE layer set ------------------------------------------------------------------------
def _without_layer(layer: int):
    def edit(manifest: dict) -> None:
        tensors = manifest["ranks"][0]["tensors"]
        for key in [k for k in tensors if k.startswith(f"model.layers.{layer}.mlp.experts.")]:
            del tensors[key]

    return edit


def _with_extra_layer(manifest: dict) -> None:
    """Layer 1's entries again under layer 2 (which the model does not have)."""
    tensors = manifest["ranks"][0]["tensors"]
    for key in [k for k in tensors if k.startswith("model.layers.1.mlp.experts.")]:
        tensors[key.replace("layers.1.", "layers.2.")] = {**tensors[key], "layer": 2}


@pytest.fixture
def missing_layer(artifacts, tmp_path):
    art = copy_of(artifacts.get("h100", "--tp", "1"), tmp_path)
    reseal(art, _without_layer(1))
    return art


@pytest.fixture
def extra_layer(artifacts, tmp_path):
    art = copy_of(artifacts.get("h100", "--tp", "1"), tmp_path)
    reseal(art, _with_extra_layer)
    return art


def test_artifact_missing_a_moe_layer_is_refused(missing_layer, opened):
    with pytest.raises(ArtifactMismatch) as err:
        H.path_b(HOPPER, missing_layer)
    assert (
        "MoE layers differ: only in the artifact [], only in the model vLLM built ['model.layers.1.mlp.experts']"
    ) in str(err.value)
    assert opened == []


def test_artifact_with_an_extra_moe_layer_is_refused(extra_layer, opened):
    with pytest.raises(ArtifactMismatch) as err:
        H.path_b(HOPPER, extra_layer)
    assert (
        "MoE layers differ: only in the artifact ['model.layers.2.mlp.experts'], only in the model vLLM built []"
    ) in str(err.value)
    assert opened == []


@pytest.fixture
def without_layer_set_check(monkeypatch):
    monkeypatch.setattr(installer_module, "check_layer_set", lambda where, entry, prefixes, engine: None)


def test_mutation_without_the_layer_set_check_loads_an_extra_layer(extra_layer, without_layer_set_check):
    model, installer = H.path_b(HOPPER, extra_layer)
    assert len(installer.sources) == H.NUM_LAYERS  # layer 2 of the artifact silently ignored


def test_mutation_without_the_layer_set_check_fails_late_on_a_missing_layer(
    missing_layer, without_layer_set_check, opened
):
    """No refusal before loading: weight files are read, then the load breaks on the missing tensors."""
    with pytest.raises(Exception) as err:
        H.path_b(HOPPER, missing_layer)
    assert not isinstance(err.value, ArtifactMismatch) and "MoE layers differ" not in str(err.value)
    assert opened != []


# ---- (iv) the checkpoint-shaped parameters are released ----------------------------------------------
def prepared_gpt_oss(art: Path):
    """The plugin's steps on vLLM's GPT-OSS blocks up to `prepare` (checks passed, nothing read yet):
    (model, {layer: (name, shape, dtype, bytes) of each checkpoint-shaped parameter before prepare})."""
    from vllm.config import set_current_vllm_config

    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = H.vllm_config()
    with (
        H.process_groups(1, 0),
        H.oracle_picks(HOPPER.backend),
        H.cuda_device(HOPPER.cap),
        set_current_vllm_config(config),
    ):
        installer = ArtifactInstaller(art)
        installer.check_runtime(live_runtime())
        model = H.build_model(config)
        before = allocated(H.routed_experts(model), lambda layer: EXPERT_NAMES)
        prepare_only(installer, moe_layers(model))
    return H.routed_experts(model), before


def prepared_nvfp4(target: N.Target, art: Path):
    from vllm.config import set_current_vllm_config

    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = N.vllm_config(target)
    with (
        H.process_groups(target.tp, target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
        N.nvfp4_linear_kernels_on_cpu(),
    ):
        installer = ArtifactInstaller(art)
        installer.check_runtime(live_runtime())
        model = N.build_model(config)
        before = allocated(N.routed_experts(model), nvfp4_params)
        prepare_only(installer, moe_layers(model))
    return N.routed_experts(model), before


def prepare_only(installer, layers) -> None:
    """`prepare` alone (what it releases and allocates is the question), then `finish`: prepare starts
    reading the layers' tensors ahead on background threads, which no install here consumes; left
    running, they would open artifact files during later tests (whose `opened` lists must stay empty)."""
    try:
        installer.prepare(layers)
    finally:
        installer.finish()


def nvfp4_params(layer) -> tuple[str, ...]:
    return CHECKPOINT_PARAMS[type(layer.quant_method).__name__]


def allocated(layers, names) -> list[dict[str, tuple]]:
    out = []
    for layer in layers:
        params = dict(layer.named_parameters(recurse=False))
        out.append(
            {
                n: (tuple(params[n].shape), params[n].dtype, params[n].untyped_storage().nbytes())
                for n in names(layer)
                if n in params
            }
        )
    return out


def unreleased(layers, before: list[dict[str, tuple]]) -> list[str]:
    """Checkpoint-shaped parameters still holding their memory after `prepare`. A released one is the
    same registered parameter (vLLM's shape assertions and `replace_parameter` still find it), of the
    same shape and dtype, backed by a single element."""
    found = []
    for i, (layer, was) in enumerate(zip(layers, before)):
        params = dict(layer.named_parameters(recurse=False))
        for name, (shape, dtype, nbytes) in was.items():
            assert nbytes == math.prod(shape) * params[name].element_size(), name  # in full before prepare
            param = params.get(name)
            assert param is not None and (tuple(param.shape), param.dtype) == (shape, dtype), name
            if param.untyped_storage().nbytes() > param.element_size():
                found.append(f"layer {i}: {name}")
    return found


def test_gpt_oss_checkpoint_parameters_are_released(artifacts):
    layers, before = prepared_gpt_oss(artifacts.get("h100", "--tp", "1"))
    assert all(len(was) == len(EXPERT_NAMES) for was in before)
    assert unreleased(layers, before) == []


def test_mutation_keeping_the_gpt_oss_parameters_is_seen(artifacts, monkeypatch):
    row = installer_module.INSTALLS["mxfp4"]
    monkeypatch.setitem(installer_module.INSTALLS, "mxfp4", dataclasses.replace(row, release=lambda layer: None))
    layers, before = prepared_gpt_oss(artifacts.get("h100", "--tp", "1"))
    assert len(unreleased(layers, before)) == H.NUM_LAYERS * len(EXPERT_NAMES)


@pytest.mark.parametrize("checkpoint", ["modelopt", "ct"])
def test_nvfp4_checkpoint_parameters_are_released(artifacts, checkpoint):
    target = TRTLLM[checkpoint]
    layers, before = prepared_nvfp4(target, N.artifact_for(artifacts, target))
    assert all(len(was) == len(nvfp4_params(layer)) for layer, was in zip(layers, before))
    assert unreleased(layers, before) == []
    for layer in layers:  # compressed-tensors' leftover global scales: zero-filled (harness_nvfp4.py)
        for name in N.CT_LEFTOVER_SCALES if target.is_ct else ():
            assert not getattr(layer, name).any()


def test_mutation_keeping_the_nvfp4_parameters_is_seen(artifacts, monkeypatch):
    row = installer_module.INSTALLS["nvfp4"]
    monkeypatch.setitem(installer_module.INSTALLS, "nvfp4", dataclasses.replace(row, release=lambda layer: None))
    target = TRTLLM["modelopt"]
    layers, before = prepared_nvfp4(target, N.artifact_for(artifacts, target))
    assert len(unreleased(layers, before)) == N.NUM_LAYERS * len(CHECKPOINT_PARAMS["ModelOptNvFp4FusedMoE"])


# ---- the copied files vLLM reads --------------------------------------------------------------------
@pytest.fixture
def edited_config(artifacts, tmp_path):
    """The artifact with one byte of its copied config.json changed (same size, still JSON)."""
    art = copy_of(artifacts.get("h100", "--tp", "1"), tmp_path)
    config = art / "config.json"
    text = config.read_text()
    assert '"num_local_experts": 4' in text
    config.write_text(text.replace('"num_local_experts": 4', '"num_local_experts": 8'))
    return art


@pytest.mark.parametrize("verify_checksums", [True, False])
def test_edited_copied_file_is_refused(edited_config, opened, verify_checksums):
    with pytest.raises(MismatchError) as err:
        H.path_b(HOPPER, edited_config, verify_checksums=verify_checksums)
    assert f"{edited_config / 'config.json'}: sha256 " in str(err.value)
    assert opened == []


def test_mutation_without_the_copied_file_check_loads(edited_config, monkeypatch):
    monkeypatch.setattr(installer_module, "check_copied_files", lambda root, manifest: None)
    model, installer = H.path_b(HOPPER, edited_config)
    assert len(installer.sources) == H.NUM_LAYERS


# ---- the NVFP4 padded sizes follow the live vLLM layer ------------------------------------------------
@pytest.fixture(scope="module")
def padded_checkpoint(tmp_path_factory) -> Path:
    """A ModelOpt Qwen3-MoE checkpoint vLLM pads (hidden 192, moe_intermediate 64; test_nvfp4_padded.py)."""
    spec = importlib.util.spec_from_file_location("make_tiny_nvfp4_moe", H.REPO / "examples" / "make_tiny_nvfp4_moe.py")
    make = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, make)
    spec.loader.exec_module(make)
    return make.write_tiny_nvfp4_moe(
        tmp_path_factory.mktemp("padded") / "modelopt",
        fmt="modelopt",
        arch="qwen3_moe",
        hidden_size=192,
        moe_intermediate_size=64,
    )


@pytest.fixture
def padded(artifacts, padded_checkpoint):
    target = N.target("modelopt", "FLASHINFER_TRTLLM", "tp1", source=padded_checkpoint)
    return target, N.artifact_for(artifacts, target)


def test_padding_check_ignores_mxconvert_rule(padded, monkeypatch):
    """mxconvert's rule changed after the artifact was made (hidden to 512): vLLM still pads this layer
    to 256, as the artifact holds, so it loads."""
    from mxconvert.target import revisions

    target, art = padded
    row = revisions.REVISIONS["vllm-0.33"]
    assert row.nvfp4_fi_padding == (256, 64)
    monkeypatch.setitem(revisions.REVISIONS, "vllm-0.33", dataclasses.replace(row, nvfp4_fi_padding=(512, 64)))
    # The installer also re-derives each tensor's descriptor from the sealed target with mxconvert's
    # rules (`check_rank_layouts`, the artifact's self-consistency), which the patched row breaks on
    # purpose here; this test isolates the padding check against the live layer.
    monkeypatch.setattr("mxconvert.runtimes.vllm.installer.check_rank_layouts", lambda *args: None)
    model, installer = N.path_b(target, art)
    assert N.padded_sizes(model) == [(256, 64, 192)] * N.NUM_LAYERS


def test_padding_check_follows_the_live_vllm_layer(padded, monkeypatch, opened):
    """A vLLM whose TRTLLM preparation aligns hidden to 512 (its own `trtllm_nvfp4_hidden_alignment`):
    the artifact, padded to 256, is refused naming `hidden_padded`, before any weight file is opened."""
    from vllm.model_executor.layers.quantization.utils import flashinfer_utils

    target, art = padded
    monkeypatch.setattr(flashinfer_utils, "trtllm_nvfp4_hidden_alignment", lambda **kwargs: 512)
    opened.clear()
    with pytest.raises(ArtifactMismatch) as err:
        N.path_b(target, art)
    assert "field 'hidden_padded': artifact has 256, this layer model.layers.0.mlp.experts has 512" in str(err.value), (
        str(err.value)
    )
    assert "intermediate_padded" not in str(err.value)
    assert opened == []
