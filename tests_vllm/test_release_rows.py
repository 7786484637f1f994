"""The plugin in every vLLM release it serves for GPT-OSS MXFP4, path A = path B in each (run in the
release's thin venv: `VLLM_VERSION=X.Y.Z bash tools/vllm_env/setup.sh`; every release at once:
tools/vllm_releases/plugin_check.py, whose records tests/golden/plugin/ hold).

Path A (the installed release's own GPT-OSS weight loading and `process_weights_after_loading` of the
example checkpoint) and path B (the plugin loading the `mxconvert convert --runtime vllm==X.Y.Z`
artifact, i.e. the row that covers the release) leave the release's MoE blocks in identical state
(harness.state: every parameter, buffer and attribute, triton_kernels tensors with layout class and
arguments, precision configs, quant config, modular kernel, process-wide opt-flag constraints), for
TRITON (vLLM's pick on an H100) and MARLIN (`--backend marlin`) at TP=1 and TP=2 (both ranks); the
whole model through `--load-format mxconvert` (the release's model loader registry and
`BaseModelLoader.load_model`); an artifact of another row refused before any read, and
`on_mismatch: reconvert` loading it as the release's own conversion does. Stand-ins: harness_rows.py.

The releases: every MXFP4 release of `PLUGIN_PROVEN` (mxconvert/runtimes/vllm/dependency.py), so a
release added there is tested here in its venv, and tests/test_plugin_records.py holds the table to
the committed records of these tests' runs.
"""

from __future__ import annotations

import harness as H
import harness_rows as R
import pytest
import torch

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import release_key

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = tuple(
    sorted({r for formats in PLUGIN_PROVEN.values() for r in formats.get("mxfp4", ())}, key=release_key)
)

HOPPER = (9, 0)
#: name -> (backend the release runs, `mxconvert convert` arguments)
BACKENDS = {
    "TRITON": ("TRITON", ("h100",)),
    "MARLIN": ("MARLIN", ("h100", "--backend", "marlin")),
}
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}


def live_row() -> str:
    from mxconvert.runtimes.vllm.adapters import serving_row

    row = serving_row(R.RELEASE or "")
    assert row is not None, f"the plugin does not serve vLLM {R.RELEASE}"
    return row.name


def other_row() -> str:
    """A row whose artifacts this release's plugin refuses: vllm-0.33's bytes, or vllm-0.26's in 0.33."""
    return "vllm-0.26" if live_row() == "vllm-0.33" else "vllm-0.33"


def artifact(artifacts, profile_and_args: tuple[str, ...], tp: int, runtime: tuple[str, ...] | None = None):
    profile, *args = profile_and_args
    return artifacts.get(profile, "--tp", str(tp), *args, *(runtime or R.runtime_args()))


@pytest.fixture(scope="module", autouse=True)
def cpu_platform():
    R.use_cpu_platform()


def test_the_plugin_serves_the_release_through_its_rows_adapter():
    """The live release is served as the row `--runtime vllm==X.Y.Z` writes, through that row's adapter."""
    import vllm

    from mxconvert.runtimes.vllm.adapters import live_adapter
    from mxconvert.runtimes.vllm.loader import live_runtime
    from mxconvert.target.releases import row_for_release

    assert vllm.__version__.split("+")[0] == R.RELEASE
    assert live_adapter().row == live_row() == row_for_release(R.RELEASE, "mxfp4").name
    with H.cuda_device(HOPPER):
        live = live_runtime()
    generation = {"3.5.1": "3.5.1", "3.6": "3.6.0"}[R.vendored_triton_kernels()]  # as manifests write it
    assert (live.platform, live.capability, live.triton_kernels) == ("cuda", [9, 0], generation)


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", BACKENDS)
def test_plugin_leaves_the_state_the_release_leaves(artifacts, name, parallel):
    backend, made = BACKENDS[name]
    tp, rank = PARALLEL[parallel]
    art = artifact(artifacts, made, tp)
    target = H.Target(backend, HOPPER, tp, rank)
    H.reset_opt_flags()
    state_a = H.state(R.path_a(target))
    H.reset_opt_flags()
    model_b, installer = R.path_b(target, art)
    state_b = H.state(model_b)
    assert installer.target["runtime_revision"] == live_row() and installer.target["backend"] == backend
    assert installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)
    # the layer really holds kernel-format data (not the released checkpoint-shaped parameter)
    w13 = R.routed_experts(model_b)[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()


@pytest.mark.parametrize("name", BACKENDS)
def test_load_format_mxconvert_equals_the_default_loader(artifacts, name):
    """The whole `GptOssForCausalLM` (TP=1): `--load-format mxconvert` on the artifact versus the
    release's default loader on the checkpoint; every parameter and buffer, and each MoE module's state."""
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    backend, made = BACKENDS[name]
    target = H.Target(backend, HOPPER, 1, 0)
    art = artifact(artifacts, made, 1)
    H.reset_opt_flags()
    model_a, _ = R.load_model(H.EXAMPLE, "auto", target)
    flags_a = H.opt_flags_state()
    H.reset_opt_flags()
    model_b, loader = R.load_model(art, "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == H.NUM_LAYERS
    assert H.opt_flags_state() == flags_a
    tensors_a = {k: H.tensor_facts(v) for k, v in model_a.state_dict(keep_vars=True).items()}
    tensors_b = {k: H.tensor_facts(v) for k, v in model_b.state_dict(keep_vars=True).items()}
    assert tensors_a.keys() == tensors_b.keys()
    assert [k for k in tensors_a if tensors_a[k] != tensors_b[k]] == []
    for a, b in zip(R.routed_experts(model_a), R.routed_experts(model_b)):
        # vLLM 0.20.0-0.23.0's FusedMoE keeps the VllmConfig the loader got: it differs by the load
        # format under test (and by vLLM's process-wide custom-op counters), so it is compared by that
        for module, load_format in ((a, "auto"), (b, "mxconvert")):
            held = module.__dict__.pop("vllm_config", None)
            assert held is None or held.load_config.load_format == load_format
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)


def test_an_artifact_of_another_row_is_refused_before_any_read(artifacts, opened):
    """Another row's artifact in this release: refused by its row, naming the command that makes
    this row's artifact; nothing is read."""
    other = other_row()
    art = artifact(artifacts, BACKENDS["TRITON"][1], 1, runtime=("--runtime", other))
    with pytest.raises(MismatchError) as err:
        R.path_b(H.Target("TRITON", HOPPER, 1, 0), art)
    message = str(err.value)
    assert f"field 'runtime_revision': artifact has '{other} (vLLM " in message
    assert f"this worker has '{live_row()} (vLLM " in message
    assert f"--profile h100 --runtime {live_row()} -o OUT" in message
    assert opened == []


def test_reconvert_loads_another_rows_artifact_as_the_release_would(artifacts, caplog):
    """`on_mismatch: reconvert` restores the other row's artifact's checkpoint tensors and runs the
    release's own conversion: path A's state."""
    art = artifact(artifacts, BACKENDS["TRITON"][1], 1, runtime=("--runtime", other_row()))
    target = H.Target("TRITON", HOPPER, 1, 0)
    H.reset_opt_flags()
    state_a = H.state(R.path_a(target))
    H.reset_opt_flags()
    with caplog.at_level("WARNING", logger="mxconvert.runtimes.vllm"):
        model_b, installer = R.path_b(target, art, on_mismatch="reconvert")
    assert sorted(installer.reconverted) == [f"model.layers.{i}.mlp.experts" for i in range(H.NUM_LAYERS)]
    assert "field 'runtime_revision'" in caplog.text
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)
