"""The plugin in every vLLM release it serves for NVFP4, path A = path B in each (run in the release's thin
venv: `VLLM_VERSION=X.Y.Z bash tools/vllm_env/setup.sh`; every release at once:
`tools/vllm_releases/plugin_check.py --format nvfp4`, whose records tests/golden/plugin/*-nvfp4.json hold).

Path A (the installed release's own loading of the ModelOpt / compressed-tensors Qwen3-MoE example and its
own `process_weights_after_loading` of `ModelOptNvFp4FusedMoE` / `CompressedTensorsW4A4Nvfp4MoEMethod`) and
path B (the plugin loading the `mxconvert convert --runtime vllm==X.Y.Z` artifact, i.e. the NVFP4 row that
covers the release) leave the release's MoE blocks in identical state (harness_nvfp4.assert_same_state:
every parameter, buffer and attribute, strides included, quant config, modular kernel, `moe_config`; the
one allowed difference is compressed-tensors' checkpoint global scales, zero-filled by the plugin), for
every NVFP4 backend the release's row writes (harness_rows_nvfp4.written_backends: MARLIN, vLLM's pick on
an H100, and the Blackwell backends of `--backend`; vLLM 0.15.0-0.19.1's FLASHINFER_CUTEDSL, their batched
kernel, in a batched deployment) at TP=1, and the row's `PRIMARY` backend (MARLIN; FLASHINFER_CUTLASS for
rows that leave MARLIN unproven) at TP=2 (rank 0 of one format, rank 1 of the other) and at EP=2
(`--tensor-parallel-size 2 --enable-expert-parallel` and the `--ep 2` artifact, both ranks, both formats);
the whole `Qwen3MoeForCausalLM` through `--load-format mxconvert` (`PRIMARY`, TP=1);
an artifact of another NVFP4 row refused before any read; and a planted bug (a changed artifact byte,
with the checksums off) that makes path B differ. Stand-ins: harness_rows_nvfp4.py.

Every NVFP4 backend `mxconvert backends` lists for the live row is named in each release's record
(`test_each_backend_of_the_row_is_run_or_refused[BACKEND-...]`): "run" where the cases above load it, else
"refused", where `convert` refuses to write it for the row with the row's reason (its `unproven_layouts`:
bytes not proven; or no layout in this version of mxconvert), "not-stood-in" where the row writes it and the
CPU cannot stand the release's kernel in (harness_rows_nvfp4.not_stood_in says why: vLLM 0.15.0-0.15.1's
FLASHINFER_CUTEDSL, built only from DeepEP low-latency). No other backend the row writes goes unrun.

The releases: every NVFP4 release of `PLUGIN_PROVEN` (mxconvert/runtimes/vllm/dependency.py), so a release
added there is tested here in its venv, and tests/test_plugin_records.py holds the table to the committed
records of these tests' runs.
"""

from __future__ import annotations

import json
import shutil
import struct

import harness as H
import harness_nvfp4 as N
import harness_rows as R
import harness_rows_nvfp4 as RN
import pytest
import torch

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import release_key

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = tuple(
    sorted({r for formats in PLUGIN_PROVEN.values() for r in formats.get("nvfp4", ())}, key=release_key)
)

#: backend -> (profile, extra convert args, capability): those the live release's row writes (every
#: backend of harness_nvfp4 where this venv's release is not one of these tests' releases: skipped there)
BACKENDS = RN.written_backends() if RN.RELEASE in VLLM_RELEASES else N.BACKENDS
#: the backend of the TP=2 cases, the whole model and the planted bug: MARLIN (what an H100 runs), or
#: FLASHINFER_CUTLASS where the row leaves MARLIN unproven (vLLM 0.19.0-0.23.0's rows)
PRIMARY = "MARLIN" if "MARLIN" in BACKENDS else "FLASHINFER_CUTLASS"
#: every written backend of both formats at TP=1; PRIMARY at TP=2 too
CASES = [(c, b, "tp1") for b in BACKENDS for c in ("modelopt", "ct")] + [
    ("modelopt", PRIMARY, "tp2-rank0"),
    ("ct", PRIMARY, "tp2-rank1"),
]


#: EP 2 (TP 2 with expert parallelism): checkpoint format x EP rank, `PRIMARY` backend
EP_CASES = [(c, rank) for c in ("modelopt", "ct") for rank in (0, 1)]


def row_backends() -> dict[str, str | None]:
    """Every NVFP4 backend `mxconvert backends` lists for the live release's row -> why `convert` does not
    write it there (None: it writes it)."""
    from mxconvert.selection.vocabulary import backend_rows
    from mxconvert.target.backends import LAID_OUT

    if RN.RELEASE not in VLLM_RELEASES:  # another release's venv: the module is skipped there
        return {}
    rows = backend_rows(laid_out=lambda fmt: {backend.value for backend in LAID_OUT[fmt]})
    name = RN.nvfp4_row().name
    return {r["backend"]: r["not_writable"] for r in rows if r["format"] == "nvfp4" and r["revision"] == name}


#: backend -> "run" (the cases above load it), "not-stood-in" (the row writes it; the CPU does not stand the
#: release's kernel in: harness_rows_nvfp4.not_stood_in says why) or "refused" (`convert` does not write it)
ROW_BACKENDS = {
    b: "run" if b in BACKENDS else "not-stood-in" if reason is None else "refused"
    for b, reason in row_backends().items()
}


def live_row() -> str:
    return RN.nvfp4_row().name


def artifact(artifacts, target: N.Target, runtime: tuple[str, ...] | None = None):
    """`mxconvert convert --runtime vllm==X.Y.Z` of the target's checkpoint, TP=1 and TP=2 at once."""
    profile, args, _ = BACKENDS[target.backend] if runtime is None else N.BACKENDS[target.backend]
    made = artifacts.in_process(target.path, profile, *args, *(runtime or RN.runtime_args()))
    return made / f"{profile}-tp{target.tp}"


@pytest.fixture
def pre_processed_calls(monkeypatch):
    """How often the plugin entered vLLM's `weights_already_processed()` (where the release has it)."""
    import vllm.model_executor.utils as utils

    calls: list[int] = []
    original = getattr(utils, "weights_already_processed", None)
    if original is not None:

        def counting():
            calls.append(1)
            return original()

        monkeypatch.setattr(utils, "weights_already_processed", counting)
    return calls


def pre_processed_layers(target: N.Target) -> int:
    """How many layers the plugin loads through vLLM's pre-processed path: those of a ModelOpt checkpoint
    whose backend the row's adapter names (`nvfp4_pre_processed`), which the release's own method must
    declare (`supports_pre_processed_weights`, modelopt.py from vLLM 0.30.0; FLASHINFER_TRTLLM only)."""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

    from mxconvert.runtimes.vllm.adapters import live_adapter

    named = live_adapter("nvfp4").nvfp4_pre_processed
    assert not named or "supports_pre_processed_weights" in vars(ModelOptNvFp4FusedMoE), named
    return N.NUM_LAYERS if not target.is_ct and target.backend in named else 0


def test_the_plugin_serves_the_release_as_its_nvfp4_row():
    """The live release is served, for NVFP4 artifacts, as the row `--runtime vllm==X.Y.Z` writes for an
    NVFP4 checkpoint, through that row's adapter."""
    import vllm

    from mxconvert.runtimes.vllm import adapters

    assert vllm.__version__.split("+")[0] == RN.RELEASE
    assert adapters.serving_row(vllm.__version__, "nvfp4").name == live_row()
    assert adapters.live_adapter("nvfp4").row == live_row()
    assert PRIMARY in BACKENDS


@pytest.mark.parametrize("checkpoint, backend, parallel", CASES)
def test_plugin_leaves_the_state_the_release_leaves(artifacts, pre_processed_calls, checkpoint, backend, parallel):
    target = N.target(checkpoint, backend, parallel)
    art = artifact(artifacts, target)
    model_a = RN.path_a(target)
    model_b, installer = RN.path_b(target, art)
    assert installer.target["runtime_revision"] == live_row() and installer.target["backend"] == backend
    N.assert_same_state(target, model_a, model_b, installer)
    assert len(pre_processed_calls) == pre_processed_layers(target)


def load_model(model_path, load_format: str, target: N.Target):
    """The release's model loader for `load_format` (`mxconvert` through the plugin's entry point)."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = R.same_instance(
        VllmConfig(
            model_config=ModelConfig(model=str(model_path), enforce_eager=True),
            load_config=LoadConfig(load_format=load_format),
        )
    )
    loader = get_model_loader(config.load_config)
    R.fresh_process_counters()
    with (
        RN.release(),
        H.process_groups(target.tp, target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        H.cuda_only_ops(),
        set_current_vllm_config(config),
    ):
        return loader.load_model(config, config.model_config), loader


def test_load_format_mxconvert_equals_the_default_loader(artifacts):
    """The whole `Qwen3MoeForCausalLM` (compressed-tensors, TP=1, `PRIMARY`): every parameter and buffer, and
    each MoE module's state (less compressed-tensors' zero-filled global scales, as `assert_same_state`)."""
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    target = N.target("ct", PRIMARY, "tp1")
    model_a, _ = load_model(target.path, "auto", target)
    model_b, loader = load_model(artifact(artifacts, target), "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == N.NUM_LAYERS
    for layer_a, layer_b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        for name in N.CT_LEFTOVER_SCALES:
            assert not getattr(layer_b, name).any()
            getattr(layer_a, name).data.zero_()
    tensors_a = {k: H.tensor_facts(v) for k, v in model_a.state_dict(keep_vars=True).items()}
    tensors_b = {k: H.tensor_facts(v) for k, v in model_b.state_dict(keep_vars=True).items()}
    assert tensors_a.keys() == tensors_b.keys()
    assert [k for k in tensors_a if tensors_a[k] != tensors_b[k]] == []
    for a, b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        # vLLM 0.20.0-0.23.0's FusedMoE keeps the VllmConfig the loader got: it differs by the load format
        # under test, so it is compared by that (as test_release_rows.py)
        for module, load_format in ((a, "auto"), (b, "mxconvert")):
            held = module.__dict__.pop("vllm_config", None)
            assert held is None or held.load_config.load_format == load_format
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8)
    )


def test_a_changed_artifact_byte_is_caught(artifacts, tmp_path):
    """Planted bug: one byte of a rank file's layer-1 w2 block scales. Refused by the checksums; with them
    off, it loads and path B differs from path A in exactly that layer's tensor."""
    target = N.target("modelopt", PRIMARY, "tp1")
    art = tmp_path / "changed"
    shutil.copytree(artifact(artifacts, target), art)
    rank_file = next((art / "rank-00000").glob("*.safetensors"))
    raw = bytearray(rank_file.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    begin = 8 + header_len + header["model.layers.1.mlp.experts.w2_weight_scale"]["data_offsets"][0]
    raw[begin + 7] ^= 0x01
    rank_file.write_bytes(bytes(raw))
    with pytest.raises(MismatchError, match="sha256|checksum|digest"):
        RN.path_b(target, art)
    model_a = RN.path_a(target)
    model_b, installer = RN.path_b(target, art, verify_checksums=False)
    assert installer.sources and not installer.reconverted
    with pytest.raises(AssertionError):
        N.assert_same_state(target, model_a, model_b, installer)
    layers_a, layers_b = N.routed_experts(model_a), N.routed_experts(model_b)
    assert not same_bytes(layers_a[1].w2_weight_scale, layers_b[1].w2_weight_scale)
    assert same_bytes(layers_a[0].w2_weight_scale, layers_b[0].w2_weight_scale)  # layer 0 untouched


def test_an_artifact_of_another_nvfp4_row_is_refused_before_any_read(artifacts, opened):
    """Another NVFP4 row's artifact in this release (vllm-0.33's; vllm-0.25-nvfp4's where the live row is
    vllm-0.33): refused by its row, naming the command that makes this row's artifact; nothing is read."""
    other = "vllm-0.25-nvfp4" if live_row() == "vllm-0.33" else "vllm-0.33"
    target = N.target("modelopt", PRIMARY, "tp1")
    art = artifact(artifacts, target, runtime=("--runtime", other))
    opened.clear()
    with pytest.raises(MismatchError) as err:
        RN.path_b(target, art)
    message = str(err.value)
    assert f"field 'runtime_revision': artifact has '{other} (vLLM " in message
    assert f"this worker has '{live_row()} (vLLM " in message
    profile = N.BACKENDS[PRIMARY][0]
    assert f"--profile {profile} --runtime {live_row()}" in message
    assert opened == []


@pytest.mark.parametrize("rank", (0, 1))
@pytest.mark.parametrize("checkpoint", ("modelopt", "ct"))
def test_expert_parallel_loads_the_state_the_release_loads(artifacts, checkpoint, rank):
    """EP 2 at TP 2 (`PRIMARY`): each rank's MoE blocks (its half of the experts, the expert map) as the
    release leaves them from the checkpoint, from the `--ep 2` artifact's rank."""
    target = N.target(checkpoint, PRIMARY, f"tp2-rank{rank}")
    profile, args, _ = BACKENDS[PRIMARY]
    art = artifacts.in_process(target.path, profile, *args, "--ep", "2", *RN.runtime_args(), tps=())
    model_a = RN.ep_path_a(target)
    model_b, installer = RN.ep_path_b(target, art)
    assert (installer.target["ep_size"], installer.target["tp_size"], installer.target["backend"]) == (2, 1, PRIMARY)
    N.assert_same_state(target, model_a, model_b, installer)
    for layer in N.routed_experts(model_b):
        num_experts = layer.global_num_experts
        per = num_experts // 2
        assert layer.local_num_experts == per and layer.w13_weight.shape[0] == per
        expected = torch.full((num_experts,), -1, dtype=torch.int32)
        expected[rank * per : (rank + 1) * per] = torch.arange(per, dtype=torch.int32)
        assert torch.equal(layer.expert_map.cpu(), expected)


@pytest.mark.parametrize("backend", [pytest.param(b, id=f"{b}-{how}") for b, how in ROW_BACKENDS.items()])
def test_each_backend_of_the_row_is_run_or_refused(backend):
    """A backend the row writes is run above, at TP 1 for both formats, unless the CPU cannot stand the
    release's kernel in (harness_rows_nvfp4.not_stood_in, with the reason: vLLM 0.15.0-0.15.1's CuteDSL); any
    other is refused by `convert` (layouts/registry.py `build_layout`, exit 2) naming the backend and the
    row's reason."""
    from mxconvert.core.errors import UnsupportedError
    from mxconvert.layouts import LayoutTarget, build_layout  # the package: every layout registered
    from mxconvert.target.backends import Nvfp4Backend

    reason = row_backends()[backend]
    if backend in BACKENDS:
        assert reason is None, reason
        assert {(c, b) for c, b, p in CASES if p == "tp1"} >= {("modelopt", backend), ("ct", backend)}
        return
    if reason is None:  # written by the row, not run: only where the CPU cannot stand the release's kernel in
        assert backend in RN.not_stood_in(), f"{backend} is written for {live_row()} but not run here"
        return
    with pytest.raises(UnsupportedError) as err:
        build_layout("nvfp4", LayoutTarget(Nvfp4Backend(backend), RN.nvfp4_row()))
    assert err.value.exit_code == 2 and backend in str(err.value)
    shown = reason.removeprefix("bytes not proven yet: ")
    assert (shown in str(err.value)) or (reason.startswith("no layout") and "not laid out" in str(err.value))
