"""The SGLang loader's checks, installer and launcher without SGLang (runtimes/sglang/: checks.py,
installer.py, install.py, layer_state.py, hook.py, launcher.py). The same installer against SGLang's
own code: tests_sglang/ (path A = path B).

The layers here are stand-ins with the parameters SGLang 0.5.23's `Mxfp4MoEMethod.create_weights`
allocates (shapes and dtypes), and the facts `SglangLayer` the loader reads from SGLang's layer.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, run_cli

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import hook, install, launcher
from mxconvert.runtimes.sglang.checks import LiveSglang, SglangLayer, method_backend
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

LIVE = LiveSglang("0.5.23", "cuda", [10, 0], "0.7.2")
CONFIG = json.loads((EXAMPLE / "config.json").read_text())
EXPERTS, HIDDEN, INTERMEDIATE = CONFIG["num_local_experts"], CONFIG["hidden_size"], CONFIG["intermediate_size"]
LAYERS = CONFIG["num_hidden_layers"]


def _convert(out: Path, *args: str) -> Path:
    result = run_cli("convert", EXAMPLE, "--profile", "b200", *args, "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-checks")
    return {tp: _convert(root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--tp", str(tp)) for tp in (1, 2)}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def stand_in_layer(tp: int = 1, hidden_padded: int | None = None) -> torch.nn.Module:
    """The expert parameters SGLang 0.5.23 allocates on SM100 with flashinfer_mxfp4 (H -> 256, I -> 128)."""
    hp = hidden_padded or _round_up(HIDDEN, 256)
    ip = _round_up(INTERMEDIATE // tp, 128)
    layer = torch.nn.Module()
    shapes = {
        "w13_weight": ((EXPERTS, 2 * ip, hp // 2), torch.uint8),
        "w13_weight_scale": ((EXPERTS, 2 * ip, hp // 32), torch.uint8),
        "w13_weight_bias": ((EXPERTS, 2 * ip), torch.bfloat16),
        "w2_weight": ((EXPERTS, hp, ip // 2), torch.uint8),
        "w2_weight_scale": ((EXPERTS, hp, ip // 32), torch.uint8),
        "w2_weight_bias": ((EXPERTS, hp), torch.bfloat16),
    }
    for name, (shape, dtype) in shapes.items():
        layer.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False))
    layer.num_local_experts = EXPERTS
    layer.moe_runner_config = types.SimpleNamespace(gemm1_alpha=None, gemm1_clamp_limit=None, gate_up_interleaved=True)
    return layer


def facts(layer_id: int, tp: int = 1, rank: int = 0, **changes) -> SglangLayer:
    live = SglangLayer(
        prefix=f"model.layers.{layer_id}.mlp.experts",
        backend="FLASHINFER_TRTLLM_MXFP4_MXFP8",
        hidden_size_padded=_round_up(HIDDEN, 256),
        intermediate_size_padded=_round_up(INTERMEDIATE // tp, 128),
        tp_size=tp,
        ep_size=1,
        rank=rank,
        num_experts=EXPERTS,
    )
    return dataclasses.replace(live, **changes)


def layers(tp: int = 1, rank: int = 0, **changes) -> list[tuple[str, torch.nn.Module, SglangLayer]]:
    out = []
    for layer_id in range(LAYERS):
        live = facts(layer_id, tp, rank, **changes)
        out.append((live.prefix, stand_in_layer(tp), live))
    return out


def refused(installer: SglangArtifactInstaller, live_layers=None, live: LiveSglang = LIVE) -> ArtifactMismatch:
    with pytest.raises(ArtifactMismatch) as info:
        installer.check_runtime(live)
        installer.prepare(live_layers if live_layers is not None else layers())
    return info.value


# ---- runtime ---------------------------------------------------------------------------------


def test_a_fitting_artifact_passes_and_installs_sglangs_state(artifacts):
    installer = SglangArtifactInstaller(artifacts[1])
    installer.check_runtime(LIVE)
    live_layers = layers()
    installer.prepare(live_layers)
    prefix, module, _ = live_layers[0]
    assert installer.holds(module)
    assert module.w13_weight.data.untyped_storage().nbytes() == 1  # released, not filled
    installer.postprocess(module, method=None)  # a held layer never reaches SGLang's method
    assert module.w13_weight.dtype == torch.uint8 and module.w13_weight_scale.dtype == torch.float8_e4m3fn
    assert module.w13_weight_bias.dtype == torch.float32
    assert torch.equal(module.gemm1_alpha, torch.full((EXPERTS,), 1.702, dtype=torch.float32))
    assert torch.equal(module.gemm1_beta, torch.ones(EXPERTS))
    assert torch.equal(module.gemm1_clamp_limit, torch.full((EXPERTS,), 7.0))
    assert module._situ_routing_bias_bf16 is None
    assert not any(p.requires_grad for p in module.parameters())


def test_a_layer_the_artifact_does_not_hold_goes_through_sglangs_own_postprocessing(artifacts):
    installer = SglangArtifactInstaller(artifacts[1])
    other = torch.nn.Module()
    calls = []
    installer.postprocess(other, types.SimpleNamespace(process_weights_after_loading=calls.append))
    assert calls == [other]


@pytest.mark.parametrize(
    ("live", "field", "artifact_value", "live_value", "command"),
    [
        (
            dataclasses.replace(LIVE, sglang_version="0.5.22"),
            "runtime_revision",
            "sglang-0.5.23",
            "0.5.22",
            "sglang==0.5.23",
        ),
        (dataclasses.replace(LIVE, capability=[9, 0]), "capability", "[10, 0]", "[9, 0]", "--profile h100"),
        (dataclasses.replace(LIVE, platform="rocm"), "platform", "'cuda'", "'rocm'", "--runtime sglang==0.5.23"),
        (dataclasses.replace(LIVE, flashinfer="0.6.14"), "flashinfer", "'0.7.2'", "'0.6.14'", "--profile b200"),
        (dataclasses.replace(LIVE, flashinfer=None), "flashinfer", "'0.7.2'", "None", "--profile b200"),
    ],
    ids=["release", "capability", "platform", "flashinfer", "no-flashinfer"],
)
def test_runtime_mismatch_is_refused_naming_field_values_and_command(
    artifacts, live, field, artifact_value, live_value, command
):
    error = refused(SglangArtifactInstaller(artifacts[1]), live=live)
    assert field in {m.field for m in error.mismatches}
    line = next(line for line in str(error).splitlines() if f"field '{field}'" in line)
    assert artifact_value in line and live_value in line
    assert "nothing was loaded" in str(error)
    assert "make a matching artifact: mxconvert convert" in str(error) and command in str(error)


def test_a_local_build_label_is_the_same_release(artifacts):
    SglangArtifactInstaller(artifacts[1]).check_runtime(dataclasses.replace(LIVE, sglang_version="0.5.23+cu130"))


def test_a_vllm_artifact_is_refused(tmp_path):
    art = _convert(tmp_path / "vllm", "--runtime", "vllm==0.33.0", "--backend", "FLASHINFER_TRTLLM_MXFP4_MXFP8")
    error = refused(SglangArtifactInstaller(art))
    assert [m.field for m in error.mismatches] == ["runtime_revision", "flashinfer"]  # vLLM 0.33 pins 0.7.2.post1
    assert "vllm-0.33" in str(error) and "--runtime sglang==0.5.23" in str(error)


# ---- layers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "command"),
    [
        ({"backend": "TRITON"}, "backend", "--backend triton_kernel"),
        ({"backend": "MARLIN"}, "backend", "--backend marlin"),
        ({"hidden_size_padded": 384}, "hidden_size_padded", "--tp 1"),
        ({"intermediate_size_padded": 512}, "intermediate_size_padded", "--tp 1"),
        ({"a2a_backend": "deepep"}, "moe_a2a_backend", "--tp 1"),
        ({"gate_up_interleaved": False}, "gate_up_interleaved", "--tp 1"),
        ({"fused_shared_experts": 1}, "fused shared experts", "--tp 1"),
        ({"ep_size": 2}, "ep_size", "mxconvert convert"),
    ],
)
def test_layer_mismatch_is_refused_before_anything_is_released(artifacts, changes, field, command):
    live_layers = layers(**changes)
    error = refused(SglangArtifactInstaller(artifacts[1]), live_layers)
    assert field in {m.field for m in error.mismatches}
    assert command in str(error)
    assert all(module.w13_weight.data.untyped_storage().nbytes() > 1 for _, module, _ in live_layers)


def test_tp_size_mismatch_names_the_tp_to_convert_for(artifacts):
    error = refused(SglangArtifactInstaller(artifacts[1]), layers(tp=2, rank=1))
    fields = {m.field: m for m in error.mismatches}
    assert (fields["tp_size"].artifact, fields["tp_size"].live) == (1, 2)
    assert "--tp 2" in str(error)


def test_a_rank_the_artifact_does_not_hold_is_refused(artifacts):
    error = refused(SglangArtifactInstaller(artifacts[2]), layers(tp=2, rank=2))
    rank = next(m for m in error.mismatches if m.field == "rank")
    assert (rank.artifact, rank.live) == ([0, 1], 2)


def test_the_layer_sets_must_be_equal(artifacts):
    error = refused(SglangArtifactInstaller(artifacts[1]), layers()[:1])
    assert "MoE layers differ" in str(error) and "model.layers.1.mlp.experts" in str(error)


def test_parameter_shapes_must_be_what_sglang_allocated(artifacts):
    live_layers = [(prefix, stand_in_layer(hidden_padded=768), live) for prefix, _, live in layers()]
    error = refused(SglangArtifactInstaller(artifacts[1]), live_layers)
    assert "w13_weight dtype, shape" in {m.field for m in error.mismatches}


def test_no_layer_is_refused(artifacts):
    with pytest.raises(ArtifactMismatch, match="no GPT-OSS MXFP4 MoE layer"):
        installer = SglangArtifactInstaller(artifacts[1])
        installer.check_runtime(LIVE)
        installer.prepare([])


# ---- artifact integrity ------------------------------------------------------------------------


def test_an_edited_manifest_is_refused(artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(artifacts[1], art)
    manifest = json.loads((art / "mxconvert.json").read_text())
    manifest["target"]["tp_size"] = 2
    (art / "mxconvert.json").write_text(json.dumps(manifest))
    with pytest.raises(MismatchError, match="fingerprint"):
        SglangArtifactInstaller(art)


def test_a_changed_byte_is_refused_with_checksums_and_passes_without(artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(artifacts[1], art)
    manifest = json.loads((art / "mxconvert.json").read_text())
    key = "model.layers.0.mlp.experts.w2_weight"
    flip_stored_bits(art / manifest["ranks"][0]["tensors"][key]["file"], key, 0, 0x01)
    installer = SglangArtifactInstaller(art)
    installer.check_runtime(LIVE)
    with pytest.raises(MismatchError, match="sha256"):
        installer.prepare(layers())
    unchecked = SglangArtifactInstaller(art, verify_checksums=False)
    unchecked.check_runtime(LIVE)
    unchecked.prepare(layers())


# ---- what the loader reads of SGLang's method --------------------------------------------------


@pytest.mark.parametrize(
    ("state", "backend"),
    [
        ({"use_flashinfer": True, "fi_kernel": "trtllm_sm100"}, "FLASHINFER_TRTLLM_MXFP4_MXFP8"),
        ({"use_flashinfer": True, "fi_kernel": "cutlass_sm120"}, "FLASHINFER_CUTLASS_MXFP4_MXFP8"),
        ({"use_flashinfer": True, "fi_kernel": "cutlass_sm90"}, "FLASHINFER_CUTLASS_MXFP4_BF16"),
        ({"use_marlin": True}, "MARLIN"),
        ({"use_triton_kernels": True}, "TRITON"),
        ({"use_deep_gemm": True}, "DEEP_GEMM (SGLang's DeepGEMM fp8 x fp4; no mxconvert layout)"),
        ({}, "SGLang's own fallback (XPU / CPU / bf16 upcast)"),
    ],
)
def test_method_backend_follows_sglangs_dispatch_order(state, backend):
    kwargs = {
        "use_flashinfer": False,
        "fi_kernel": None,
        "use_marlin": False,
        "use_deep_gemm": False,
        "use_mega_moe": False,
        "use_triton_kernels": False,
    }
    assert method_backend(**(kwargs | state)) == backend


def test_sglang_layer_reads_the_ep_rank_under_expert_parallelism():
    method = types.SimpleNamespace(
        use_flashinfer=True, _fi_kernel="trtllm_sm100", hidden_size=512, intermediate_size_per_partition=256
    )
    module = types.SimpleNamespace(
        moe_tp_size=1,
        moe_tp_rank=0,
        moe_ep_size=2,
        moe_ep_rank=1,
        num_local_experts=2,
        moe_runner_config=types.SimpleNamespace(gate_up_interleaved=True),
    )
    live = sglang_layer("p", method, module, "NONE")
    assert (live.ep_size, live.rank, live.tp_size, live.a2a_backend) == (2, 1, 1, "none")


# ---- the load format hook and the launcher -------------------------------------------------------


def test_the_hook_turns_mxconvert_into_the_loader_class(monkeypatch):
    class Loader:
        pass

    monkeypatch.setattr(hook, "loader_class", lambda: Loader)
    calls = []
    for value in ("mxconvert", "MXCONVERT"):
        config = types.SimpleNamespace(load_format=value)
        assert hook.resolve_load_format(lambda c: calls.append(c), config) is None
        assert config.load_format is Loader
    other = types.SimpleNamespace(load_format="auto")
    hook.resolve_load_format(lambda c: calls.append(c), other)
    assert calls == [other] and other.load_format == "auto"


def test_hook_registration_and_entry_point_are_recognised():
    assert hook.is_registered({hook.VERIFY_TARGET: [("around", hook.resolve_load_format, None)]})
    assert not hook.is_registered({hook.VERIFY_TARGET: [("around", print, None)]})
    ours = types.SimpleNamespace(value="mxconvert.runtimes.sglang:register")
    assert hook.plugin_installed(lambda group: [ours] if group == "sglang.srt.plugins" else [])
    assert not hook.plugin_installed(lambda group: [])


def test_launcher_arguments():
    assert launcher.launch_argv(["--model-path", "ART"]) == ["--model-path", "ART", "--load-format", "mxconvert"]
    assert launcher.launch_argv(["--load-format", "mxconvert", "--tp", "2"]) == [
        "--load-format",
        "mxconvert",
        "--tp",
        "2",
    ]
    assert launcher.launch_argv(["--load-format=MXCONVERT"]) == ["--load-format=MXCONVERT"]
    for other in (["--load-format", "auto"], ["--load-format=safetensors"], ["--load-format"]):
        with pytest.raises(ValueError, match="serves mxconvert artifacts"):
            launcher.launch_argv(other)


def test_launcher_refuses_without_the_entry_point(monkeypatch, capsys):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    assert launcher.main(["--model-path", "ART"]) == launcher.REFUSED
    assert "sglang.srt.plugins: mxconvert = mxconvert.runtimes.sglang:register" in capsys.readouterr().err


def test_launcher_refuses_another_load_format(capsys):
    assert launcher.main(["--model-path", "ART", "--load-format", "gguf"]) == launcher.REFUSED
    assert "serves mxconvert artifacts" in capsys.readouterr().err


def test_install_defaults_are_sglangs():
    """SGLang 0.5.23 mxfp4.py: `getattr(..., "gemm1_alpha", None) or 1.702`, beta 1.0, `... or 7.0`."""
    assert (install.GEMM1_ALPHA_DEFAULT, install.GEMM1_BETA, install.GEMM1_CLAMP_LIMIT_DEFAULT) == (1.702, 1.0, 7.0)
