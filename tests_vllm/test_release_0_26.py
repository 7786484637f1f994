"""The plugin in vLLM 0.26.0 (run in .venv-vllm-0.26: `VLLM_VERSION=0.26.0 bash tools/vllm_env/setup.sh`).

Path A (vLLM 0.26.0's own GPT-OSS weight loading and `process_weights_after_loading` of the example
checkpoint) and path B (the plugin loading the `mxconvert convert --runtime vllm-0.26` artifact) leave
vLLM 0.26.0's MoE blocks in identical state (harness.state: every parameter, buffer and attribute,
triton_kernels tensors with layout class and arguments, precision configs, quant config, modular kernel,
process-wide opt-flag constraints), for the backends vLLM 0.26.0 runs on Hopper that mxconvert writes
under the vllm-0.26 row: TRITON (its pick on an H100) and MARLIN (`--backend marlin`), at TP=1 and TP=2.
The whole model goes through `--load-format mxconvert` (vLLM 0.26.0's model loader registry and
`BaseModelLoader.load_model`). Stand-ins: harness_0_26.py.

Also held: an artifact of another row (vllm-0.33) is refused in vLLM 0.26.0 before any weight is
read, naming the row and the command that makes a matching artifact (and `on_mismatch: reconvert`
loads it through vLLM 0.26.0's own conversion, ending in path A's state); and a planted bug (the
vllm-0.26 row without vLLM 0.26.0's SM90 scale pad, as 0.25 had) makes path B differ from path A.
"""

from __future__ import annotations

import dataclasses

import harness as H
import harness_0_26 as V
import pytest
import torch
from typer.testing import CliRunner

from mxconvert.core.errors import MismatchError
from mxconvert.target import revisions

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = (V.RELEASE,)

HOPPER = (9, 0)
#: name -> (backend vLLM 0.26.0 runs, `mxconvert convert` arguments)
BACKENDS = {
    "TRITON": ("TRITON", ("h100",)),
    "MARLIN": ("MARLIN", ("h100", "--backend", "marlin")),
}
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}


def artifact(artifacts, profile_and_args: tuple[str, ...], tp: int, runtime: tuple[str, ...] = V.RUNTIME):
    profile, *args = profile_and_args
    return artifacts.get(profile, "--tp", str(tp), *args, *runtime)


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", BACKENDS)
def test_plugin_leaves_the_state_vllm_0_26_leaves(artifacts, name, parallel):
    backend, made = BACKENDS[name]
    tp, rank = PARALLEL[parallel]
    art = artifact(artifacts, made, tp)
    target = H.Target(backend, HOPPER, tp, rank)
    H.reset_opt_flags()
    state_a = H.state(V.path_a(target))
    H.reset_opt_flags()
    model_b, installer = V.path_b(target, art)
    state_b = H.state(model_b)
    assert installer.target["runtime_revision"] == "vllm-0.26" and installer.target["backend"] == backend
    assert installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)
    # the layer really holds kernel-format data (not the released checkpoint-shaped parameter)
    w13 = H.routed_experts(model_b)[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()


def test_the_plugin_reads_vllm_0_26_through_its_adapter():
    """The live vLLM is 0.26.0, served as the vllm-0.26 row; what the plugin reads of it."""
    import vllm

    from mxconvert.runtimes.vllm.adapters import live_adapter, serving_row
    from mxconvert.runtimes.vllm.loader import live_runtime

    assert vllm.__version__.split("+")[0] == V.RELEASE == V.installed_release()
    assert live_adapter().row == "vllm-0.26" and serving_row(vllm.__version__).name == "vllm-0.26"
    with H.cuda_device(HOPPER):
        live = live_runtime()
    assert (live.platform, live.capability, live.triton_kernels) == ("cuda", [9, 0], "3.5.1")


def load_model(model_path, load_format: str, target: H.Target):
    """vLLM 0.26.0's model loader for `load_format` (`mxconvert` through the plugin's entry point),
    in the stood-in worker (as test_full_model.py for 0.33.0)."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_path), enforce_eager=True),
        load_config=LoadConfig(load_format=load_format),
    )
    loader = get_model_loader(config.load_config)
    with V.worker(target, target.backend, config), V.marlin_repack():
        return loader.load_model(config, config.model_config), loader


@pytest.mark.parametrize("name", BACKENDS)
def test_load_format_mxconvert_equals_the_default_loader_in_vllm_0_26(artifacts, name):
    """The whole `GptOssForCausalLM` (TP=1): `--load-format mxconvert` on the artifact versus vLLM
    0.26.0's default loader on the checkpoint; every parameter and buffer, and each MoE module's state."""
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    backend, made = BACKENDS[name]
    target = H.Target(backend, HOPPER, 1, 0)
    art = artifact(artifacts, made, 1)
    H.reset_opt_flags()
    model_a, _ = load_model(H.EXAMPLE, "auto", target)
    flags_a = H.opt_flags_state()
    H.reset_opt_flags()
    model_b, loader = load_model(art, "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == H.NUM_LAYERS
    assert H.opt_flags_state() == flags_a
    tensors_a = {k: H.tensor_facts(v) for k, v in model_a.state_dict(keep_vars=True).items()}
    tensors_b = {k: H.tensor_facts(v) for k, v in model_b.state_dict(keep_vars=True).items()}
    assert tensors_a.keys() == tensors_b.keys()
    assert [k for k in tensors_a if tensors_a[k] != tensors_b[k]] == []
    for a, b in zip(H.routed_experts(model_a), H.routed_experts(model_b)):
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)


def test_an_artifact_of_another_row_is_refused_before_any_read(artifacts, opened):
    """A vllm-0.33 artifact (vLLM 0.33.0's bytes) in vLLM 0.26.0: refused by its row, naming the
    command that makes a vllm-0.26 artifact; nothing is read."""
    art = artifact(artifacts, BACKENDS["TRITON"][1], 1, runtime=("--runtime", "vllm-0.33"))
    with pytest.raises(MismatchError) as err:
        V.path_b(H.Target("TRITON", HOPPER, 1, 0), art)
    message = str(err.value)
    assert (
        "field 'runtime_revision': artifact has 'vllm-0.33 (vLLM 0.33.0)', this worker has 'vllm-0.26 (vLLM 0.26.0)'"
        in message
    )
    assert "--profile h100 --runtime vllm-0.26 -o OUT" in message
    assert opened == []


def test_reconvert_loads_another_rows_artifact_as_vllm_0_26_would(artifacts, caplog):
    """`on_mismatch: reconvert` restores the vllm-0.33 artifact's checkpoint tensors and runs vLLM
    0.26.0's own conversion: path A's state."""
    art = artifact(artifacts, BACKENDS["TRITON"][1], 1, runtime=("--runtime", "vllm-0.33"))
    target = H.Target("TRITON", HOPPER, 1, 0)
    H.reset_opt_flags()
    state_a = H.state(V.path_a(target))
    H.reset_opt_flags()
    with caplog.at_level("WARNING", logger="mxconvert.runtimes.vllm"):
        model_b, installer = V.path_b(target, art, on_mismatch="reconvert")
    assert sorted(installer.reconverted) == [f"model.layers.{i}.mlp.experts" for i in range(H.NUM_LAYERS)]
    assert "field 'runtime_revision'" in caplog.text
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)


def test_a_wrong_hopper_scale_pad_is_caught(tmp_path, monkeypatch):
    """Planted bug: the vllm-0.26 row without the SM90 scale pad vLLM 0.26.0's `_swizzle_mxfp4` does
    (the 0.25 behaviour). mxconvert writes and the plugin checks with the same wrong row, so the
    artifact is self-consistent and loads; path A = path B is what tells: the scales differ."""
    from mxconvert.cli.main import app

    row = revisions.REVISIONS["vllm-0.26"]
    assert row.sm90_triton_scale_pad4
    monkeypatch.setitem(revisions.REVISIONS, "vllm-0.26", dataclasses.replace(row, sm90_triton_scale_pad4=False))
    out = tmp_path / "no-pad"
    done = CliRunner().invoke(
        app, ["convert", str(H.EXAMPLE), "--profile", "h100", *V.RUNTIME, "-o", str(out)], catch_exceptions=False
    )
    assert done.exit_code == 0, done.output
    target = H.Target("TRITON", HOPPER, 1, 0)
    H.reset_opt_flags()
    model_b, installer = V.path_b(target, out)
    assert installer.sources and not installer.reconverted  # the plugin's own checks pass
    state_b = H.state(model_b)
    monkeypatch.undo()
    H.reset_opt_flags()
    state_a = H.state(V.path_a(target))
    assert state_a != state_b
    # the first difference: the swizzled w13 scale's K (hidden 320 / 32 = 10 groups), padded to 12 by vLLM
    found = H.first_difference(state_a, state_b)
    assert "weight_scale/1/2/shape" in found and found.endswith(": 12 != 10"), found
