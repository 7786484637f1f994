"""NVFP4 through the plugin in vLLM 0.26.0 (run in .venv-vllm-0.26: `VLLM_VERSION=0.26.0 bash tools/vllm_env/setup.sh`).

`mxconvert convert --runtime vllm==0.26.0` of an NVFP4 checkpoint writes runtime row vllm-0.25-nvfp4;
the plugin serves vLLM 0.26.0 as that row for NVFP4 artifacts (dependency.PLUGIN_PROVEN). For every
NVFP4 backend the row writes for a built-in profile (MARLIN: h100, vLLM 0.26.0's pick on sm90;
FLASHINFER_CUTLASS, VLLM_CUTLASS and FLASHINFER_CUTEDSL_BATCHED: b200 with `--backend`; the row does not
write FLASHINFER_TRTLLM or FLASHINFER_CUTEDSL, whose 0.26.0 bytes are unproven), for the ModelOpt and
the compressed-tensors Qwen3-MoE examples, at TP=1 and TP=2: path A (vLLM 0.26.0's own loading of the
checkpoint and its own `process_weights_after_loading` of `ModelOptNvFp4FusedMoE` /
`CompressedTensorsW4A4Nvfp4MoEMethod`) and path B (the artifact through the plugin) leave vLLM 0.26.0's
MoE blocks in identical state (harness_nvfp4.assert_same_state: every parameter, buffer and attribute,
strides included, quant config, modular kernel, `moe_config`), with the one allowed difference of the
0.33.0 tests (compressed-tensors' checkpoint global scales, zero-filled by the plugin). Also a checkpoint
Marlin pads (hidden 192, intermediate 64 -> 128), and the whole `Qwen3MoeForCausalLM` through
`--load-format mxconvert` against vLLM 0.26.0's default loader. Stand-ins: harness_0_26_nvfp4.py.

Planted bugs that must make path B differ from path A: a changed byte of an artifact tensor (with the
checksums off; with them on, the plugin refuses the file), a skipped unfold of the folded global scales,
and the vllm-0.25-nvfp4 adapter with vLLM 0.33.0's form of the shared activation scales or without
0.26.0's Marlin workspace. Refusals: an NVFP4 artifact of row vllm-0.33 in vLLM 0.26.0 is refused before
any weight is read, naming the row and the command that makes a vllm-0.25-nvfp4 artifact; so is a MARLIN
artifact where vLLM picks FLASHINFER_TRTLLM (naming the backend). The sizes the plugin expects vLLM 0.26.0
to pad a layer to are checked for the backends the row does not write too (TRTLLM, CuteDSL).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import harness as H
import harness_0_26 as V
import harness_0_26_nvfp4 as W
import harness_nvfp4 as N
import pytest
import torch

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm import adapters

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = (V.RELEASE,)

#: `mxconvert convert` arguments: the release, whose NVFP4 row is vllm-0.25-nvfp4.
RUNTIME = ("--runtime", "vllm==0.26.0")
ROW = "vllm-0.25-nvfp4"
#: backend vLLM 0.26.0's oracle picks -> (profile, extra convert args, capability), the backends the
#: row writes (harness_nvfp4.BACKENDS less those the row leaves unproven)
BACKENDS = {b: N.BACKENDS[b] for b in ("MARLIN", "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "FLASHINFER_CUTEDSL_BATCHED")}
#: TP=2 rank 0 for every backend of one format (ModelOpt) and Marlin of the other, as the 0.33.0 tests
PARALLEL_CASES = [("modelopt", b, p) for b in BACKENDS for p in N.PARALLEL] + [
    ("ct", b, p) for b in BACKENDS for p in N.PARALLEL if p != "tp2-rank0" or b == "MARLIN"
]


def artifact(artifacts, target: N.Target, *extra: str):
    """`mxconvert convert --runtime vllm==0.26.0` of the target's checkpoint, TP=1 and TP=2 at once."""
    profile, args, _ = BACKENDS[target.backend]
    return artifacts.in_process(target.path, profile, *args, *RUNTIME, *extra) / f"{profile}-tp{target.tp}"


def same_state(target: N.Target, art) -> None:
    model_a = W.path_a(target)
    model_b, installer = W.path_b(target, art)
    assert installer.target["runtime_revision"] == ROW and installer.target["backend"] == target.backend
    N.assert_same_state(target, model_a, model_b, installer)


@pytest.mark.parametrize("checkpoint, backend, parallel", PARALLEL_CASES)
def test_plugin_leaves_the_state_vllm_0_26_leaves(artifacts, checkpoint, backend, parallel):
    target = N.target(checkpoint, backend, parallel)
    same_state(target, artifact(artifacts, target))


def test_vllm_0_26_is_the_nvfp4_row_for_nvfp4_and_vllm_0_26_for_mxfp4():
    import vllm

    assert adapters.serving_row(vllm.__version__, "nvfp4").name == ROW
    assert adapters.serving_row(vllm.__version__, "mxfp4").name == "vllm-0.26"
    assert adapters.serving_row(vllm.__version__).name == "vllm-0.26"
    assert adapters.live_adapter("nvfp4").row == ROW and adapters.live_adapter().row == "vllm-0.26"
    nvfp4 = adapters.live_adapter("nvfp4")
    assert not nvfp4.nvfp4_pre_processed and nvfp4.nvfp4_pads_moe_config == {"FLASHINFER_TRTLLM"}


# ---- a checkpoint vLLM 0.26.0 pads ------------------------------------------------------------------
HIDDEN, INTERMEDIATE = 192, 64


@pytest.fixture(scope="module")
def padded_checkpoints(tmp_path_factory) -> dict:
    """The examples' generator at hidden 192 / moe_intermediate 64 (Marlin: hidden % 128 != 0, so the
    intermediate size is padded to a multiple of 128), in both formats."""
    spec = importlib.util.spec_from_file_location("make_tiny_nvfp4_moe", H.REPO / "examples" / "make_tiny_nvfp4_moe.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, make)  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(make)
    root = tmp_path_factory.mktemp("padded026")
    return {
        key: make.write_tiny_nvfp4_moe(
            root / key, fmt=fmt, arch="qwen3_moe", hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE
        )
        for key, fmt in (("modelopt", "modelopt"), ("ct", "compressed-tensors"))
    }


@pytest.mark.parametrize(
    "checkpoint, backend, parallel",
    [("modelopt", "MARLIN", "tp1"), ("ct", "MARLIN", "tp2-rank1"), ("modelopt", "VLLM_CUTLASS", "tp1")],
)
def test_padded_sizes_as_vllm_0_26_pads_them(artifacts, padded_checkpoints, checkpoint, backend, parallel):
    target = N.target(checkpoint, backend, parallel, source=padded_checkpoints[checkpoint])
    profile, args, _ = BACKENDS[backend]
    tps = ("1",) if backend == "VLLM_CUTLASS" else ("1", "2")  # CUTLASS refuses 2 x 32 gated rows at TP=2
    art = artifacts.in_process(target.path, profile, *args, *RUNTIME, tps=tps)
    art = art / f"{profile}-tp{target.tp}" if len(tps) > 1 else art  # one TP size: OUT itself
    model_a = W.path_a(target)
    if backend == "MARLIN":  # path A padded: more w2 bytes than the rank's checkpoint slice
        layer = N.routed_experts(model_a)[0]
        unpadded = layer.local_num_experts * HIDDEN * (INTERMEDIATE // target.tp) // 2
        assert layer.w2_weight.numel() * layer.w2_weight.element_size() > unpadded
        assert json.loads((art / "mxconvert.json").read_text())["target"]["layout"]["intermediate_padded"] == 128
    model_b, installer = W.path_b(target, art)
    N.assert_same_state(target, model_a, model_b, installer)


def live_layers(target: N.Target) -> list:
    """The plugin's `LiveLayer`s of vLLM 0.26.0's blocks built for `target` (create_weights only)."""
    from vllm.config import set_current_vllm_config

    from mxconvert.runtimes.vllm.loader import moe_layers

    config = N.vllm_config(target)
    with (
        W.release_0_26(),
        H.process_groups(target.tp, target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        set_current_vllm_config(config),
    ):
        return [live for _, _, live in moe_layers(N.build_model(config))]


@pytest.mark.parametrize(
    "checkpoint, backend, parallel, padded",
    [
        # align_trtllm_fp4_moe_hidden_dim_for_fi: 192 -> 256; align_fp4_moe_weights_for_fi (gated: 64s): 64, 32 -> 64
        ("modelopt", "FLASHINFER_TRTLLM", "tp1", (("hidden_padded", 256), ("intermediate_padded", 64))),
        ("ct", "FLASHINFER_TRTLLM", "tp2-rank1", (("hidden_padded", 256), ("intermediate_padded", 64))),
        # 0.26.0's prepare_nvfp4_moe_layer_for_flashinfer_cutedsl pads nothing (0.33.0's pads as TRTLLM)
        ("modelopt", "FLASHINFER_CUTEDSL", "tp1", ()),
        # prepare_nvfp4_moe_layer_for_marlin: hidden 192 is no multiple of 128, so I to 128s
        ("ct", "MARLIN", "tp2-rank1", (("intermediate_padded", 128),)),
    ],
)
def test_the_padding_the_plugin_reads_of_vllm_0_26(padded_checkpoints, checkpoint, backend, parallel, padded):
    """The sizes the plugin expects vLLM 0.26.0's conversion to pad a layer to (nvfp4_padding.PADDING_0_26,
    by vLLM 0.26.0's own round-up helpers), also for the backends the row does not write (the plugin reads
    them for every layer, before it compares the backend)."""
    target = N.target(checkpoint, "MARLIN", parallel, source=padded_checkpoints[checkpoint])
    target = dataclasses.replace(target, backend=backend, cap=(10, 0) if backend != "MARLIN" else (9, 0))
    layers = live_layers(target)
    assert [(layer.backend, layer.padded) for layer in layers] == [(backend, padded)] * N.NUM_LAYERS


def test_an_artifact_for_another_backend_is_refused_by_backend(artifacts, opened):
    """A MARLIN artifact where vLLM 0.26.0 picks FLASHINFER_TRTLLM (a backend the row does not write):
    refused naming the backend, before any weight is read."""
    target = N.target("modelopt", "MARLIN", "tp1")
    art = artifact(artifacts, target)
    opened.clear()
    with pytest.raises(MismatchError) as err:
        W.path_b(target, art, live_backend="FLASHINFER_TRTLLM")  # the stood-in oracle's pick, on sm90
    message = str(err.value)
    assert (
        "field 'backend': artifact has 'MARLIN', this layer model.layers.0.mlp.experts has 'FLASHINFER_TRTLLM'"
        in message
    )
    assert f"--runtime {ROW} --backend flashinfer_trtllm --tp 1" in message
    assert opened == []


# ---- the whole model through vLLM 0.26.0's loaders --------------------------------------------------
def load_model(model_path, load_format: str, target: N.Target):
    """vLLM 0.26.0's model loader for `load_format` (`mxconvert` through the plugin's entry point)."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_path), enforce_eager=True),
        load_config=LoadConfig(load_format=load_format),
    )
    loader = get_model_loader(config.load_config)
    with (
        W.release_0_26(),
        H.process_groups(target.tp, target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        H.cuda_only_ops(),
        set_current_vllm_config(config),
    ):
        return loader.load_model(config, config.model_config), loader


@pytest.mark.parametrize("checkpoint", ["modelopt", "ct"])
def test_load_format_mxconvert_equals_the_default_loader_in_vllm_0_26(artifacts, checkpoint):
    """The whole `Qwen3MoeForCausalLM` (TP=1, MARLIN): every parameter and buffer, and each MoE module's
    state (less compressed-tensors' zero-filled global scales, as `assert_same_state`)."""
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    target = N.target(checkpoint, "MARLIN", "tp1")
    model_a, _ = load_model(target.path, "auto", target)
    model_b, loader = load_model(artifact(artifacts, target), "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == N.NUM_LAYERS
    for layer_a, layer_b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        for name in N.CT_LEFTOVER_SCALES if target.is_ct else ():
            assert not getattr(layer_b, name).any()
            getattr(layer_a, name).data.zero_()
    tensors_a = {k: H.tensor_facts(v) for k, v in model_a.state_dict(keep_vars=True).items()}
    tensors_b = {k: H.tensor_facts(v) for k, v in model_b.state_dict(keep_vars=True).items()}
    assert tensors_a.keys() == tensors_b.keys()
    assert [k for k in tensors_a if tensors_a[k] != tensors_b[k]] == []
    for a, b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)


# ---- planted bugs -----------------------------------------------------------------------------------
def differs(target: N.Target, art, **kwargs) -> tuple[str, list, list]:
    """Path B of `art` loads (the plugin's own checks pass) and differs from path A: the first difference,
    and both paths' routed-expert layers."""
    model_a = W.path_a(target)
    model_b, installer = W.path_b(target, art, **kwargs)
    assert installer.sources and not installer.reconverted
    with pytest.raises(AssertionError) as err:
        N.assert_same_state(target, model_a, model_b, installer)
    return str(err.value), N.routed_experts(model_a), N.routed_experts(model_b)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8)
    )


def test_a_changed_artifact_byte_is_caught(artifacts, tmp_path):
    """One byte of a rank file's w2 block scales: refused by the checksums; with them off, it loads and
    path B differs from path A."""
    import shutil
    import struct

    target = N.target("modelopt", "MARLIN", "tp1")
    art = tmp_path / "changed"
    shutil.copytree(artifact(artifacts, target), art)
    rank_file = next((art / "rank-00000").glob("*.safetensors"))
    raw = bytearray(rank_file.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    name = "model.layers.1.mlp.experts.w2_weight_scale"
    begin = 8 + header_len + header[name]["data_offsets"][0]
    raw[begin + 7] ^= 0x01
    rank_file.write_bytes(bytes(raw))
    with pytest.raises(MismatchError, match="sha256|checksum|digest"):
        W.path_b(target, art)
    _, layers_a, layers_b = differs(target, art, verify_checksums=False)
    assert not same_bytes(layers_a[1].w2_weight_scale, layers_b[1].w2_weight_scale)
    assert same_bytes(layers_a[0].w2_weight_scale, layers_b[0].w2_weight_scale)  # layer 0 untouched


def test_a_skipped_unfold_is_caught(artifacts, monkeypatch):
    """Planted bug: the plugin hands vLLM the artifact's folded global scales (no unfold), and the
    expert class folds the activation scale in again."""
    import mxconvert.runtimes.vllm.install_nvfp4 as inst

    target = N.target("modelopt", "FLASHINFER_CUTLASS", "tp1")
    art = artifact(artifacts, target)
    monkeypatch.setattr(inst, "unfold", lambda folded, scale, what: folded)
    _, layers_a, layers_b = differs(target, art)
    for a, b in zip(layers_a, layers_b):
        assert not same_bytes(a.w13_weight_scale_2, b.w13_weight_scale_2)
        assert same_bytes(a.w13_weight, b.w13_weight)


@pytest.mark.parametrize(
    "field, backend, where",
    [("nvfp4_input_scale", "FLASHINFER_CUTLASS", "input_scale"), ("nvfp4_conversion_effects", "MARLIN", "attrs")],
)
def test_the_adapters_0_26_fields_are_needed(artifacts, monkeypatch, field, backend, where):
    """Planted bug: the vllm-0.25-nvfp4 adapter with vLLM 0.33.0's value of one field (the contiguous
    shared activation scales; no Marlin workspace). The artifact loads, and path B differs."""
    target = N.target("ct", backend, "tp1")
    art = artifact(artifacts, target)
    wrong = dataclasses.replace(adapters.ADAPTERS[ROW], **{field: getattr(adapters.ADAPTERS["vllm-0.33"], field)})
    monkeypatch.setitem(adapters.ADAPTERS, ROW, wrong)
    found, _, _ = differs(target, art)
    assert where in found, found


# ---- refusals ---------------------------------------------------------------------------------------
def test_an_nvfp4_artifact_of_another_row_is_refused_before_any_read(artifacts, opened):
    """A vllm-0.33 NVFP4 artifact in vLLM 0.26.0: refused by its row, naming the command that makes a
    vllm-0.25-nvfp4 artifact; nothing is read."""
    target = N.target("modelopt", "MARLIN", "tp1")
    profile, args, _ = BACKENDS["MARLIN"]
    art = artifacts.in_process(target.path, profile, *args, "--runtime", "vllm-0.33", tps=("1",))
    opened.clear()
    with pytest.raises(MismatchError) as err:
        W.path_b(target, art)
    message = str(err.value)
    assert (
        "field 'runtime_revision': artifact has 'vllm-0.33 (vLLM 0.33.0)', this worker has "
        f"'{ROW} (vLLM {V.RELEASE})'" in message
    )
    assert f"--profile h100 --runtime {ROW} -o OUT" in message
    assert opened == []


def test_a_mixed_up_shared_scale_is_refused():
    """The 0.26.0 form of a FlashInfer activation scale needs one value for all experts (fail closed)."""
    scale = torch.tensor([0.5, 0.5, 0.25], dtype=torch.float32)
    with pytest.raises(MismatchError, match="shares one activation scale"):
        adapters.ADAPTERS[ROW].nvfp4_input_scale("FLASHINFER_CUTLASS", scale, "t")
    same = adapters.ADAPTERS[ROW].nvfp4_input_scale("FLASHINFER_CUTLASS", torch.full((3,), 0.5), "t")
    assert same.stride() == (0,) and same.tolist() == [0.5, 0.5, 0.5]
    assert adapters.ADAPTERS[ROW].nvfp4_input_scale("VLLM_CUTLASS", scale, "t") is scale
