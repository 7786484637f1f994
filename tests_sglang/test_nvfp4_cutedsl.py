"""Path A = path B for the SGLang loader's NVFP4 CuTe DSL install (runtimes/sglang/install_nvfp4.py
`install_nvfp4_cutedsl`), on CPU: ModelOpt FLASHINFER_CUTEDSL (`--moe-runner-backend flashinfer_cutedsl`,
a2a none: the v2 standard path; profile b200), TP 1 and TP 2, every rank and layer of
examples/tiny-nvfp4-modelopt-qwen3:

* path A: SGLang's own `ModelOptNvFp4FusedMoEMethod.__init__` / `create_weights` for the
  flashinfer_cutedsl runner, `FusedMoE`'s per-expert loading ([up; gate]) and
  `process_weights_after_loading`'s CuTe DSL v2 branches (`interleave_w13_halves`, `swizzle_blockscale`,
  FlashInfer's `convert_sf_to_mma_layout`; tools/golden/sglang_nvfp4.py's `SglangNvfp4`, compiled from the
  installed sglang and FlashInfer; stand-ins named there);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile b200 --backend flashinfer_cutedsl --tp N` wrote.

Compared: every parameter (type, requires_grad, dtype, shape, device, bytes), the raw
`w13/w2_weight_scale_2` included (the runner divides them), but SGLang's raw `w13/w2_input_scale` (what
the loaded checkpoint put there; no kernel reads them, the reciprocals made of them are compared); the
MMA views' strides and that they view the swizzled scales' storage; which parameter the
`*_blockscale_swizzled` names alias; the dispatcher's quant config, `_cutedsl_wrapper`; and the four
scalars SGLang's own `resolve_cutedsl_standard_scales` gives the runner at its first forward, run on
both layers. A case whose swizzled scales are padded (H 160: not aliased) is compared from the layout's
tensors. Planted bugs fail or are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
import pytest
import torch
from test_nvfp4 import EXAMPLE, EXPERTS, HIDDEN, INTER, LAYERS, LIVE, RANKS, differences, prefix
from test_nvfp4_cutlass import _canonical

from mxconvert.layouts import nvfp4_layout
from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import install_nvfp4
from mxconvert.runtimes.sglang import installer as installer_module
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.sglang_revisions import get_sglang_revision

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import sglang_nvfp4 as golden  # noqa: E402 - tools/golden is on sys.path (harness.py)

#: SGLang's raw input-scale parameters, which no kernel reads after post-processing (not in the artifact).
RAW = {"w13_input_scale", "w2_input_scale"}
ATTRIBUTES = ("intermediate_size_per_partition", "_cutedsl_wrapper", "trtllm_padded_hidden_size")


@pytest.fixture(scope="module")
def code() -> golden.SglangNvfp4:
    return golden.SglangNvfp4(harness.read_installed, "flashinfer_cutedsl")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-cutedsl-artifacts")
    return {
        tp: harness.convert(
            EXAMPLE, root / f"tp{tp}", "--profile", "b200", "--backend", "flashinfer_cutedsl",
            "--runtime", "sglang==0.5.23", "--tp", str(tp),
        )
        for tp in (1, 2)
    }  # fmt: skip


def state(code, layer: Any, unread: set[str] = RAW) -> dict[str, object]:
    """The layer's state the CuTe DSL runner reads (harness.parameter_state per parameter, by every name it is
    bound under; the MMA views' layout over the swizzled storage; the attributes; SGLang's resolved scalars)."""
    out: dict[str, object] = {}
    for name, param in layer.named_parameters(remove_duplicate=False):
        if name not in unread:
            out[name] = harness.parameter_state(param)
    for name in ATTRIBUTES:
        out[name] = ("attribute", repr(getattr(layer, name, "<unset>")))
    out["dispatcher"] = ("attribute", repr(layer.dispatcher.quant_config))
    out["blockscale aliases"] = (
        "attribute",
        layer.w13_blockscale_swizzled is layer.w13_weight_scale,
        layer.w2_blockscale_swizzled is layer.w2_weight_scale,
    )
    for name in ("w13", "w2"):
        mma, swizzled = getattr(layer, f"{name}_blockscale_mma"), getattr(layer, f"{name}_blockscale_swizzled")
        out[f"{name} mma view"] = ("view", mma.stride(), mma.data_ptr() == swizzled.data_ptr())
    with golden.sglang_imports(code.ns):
        resolved = code.ns["resolve_cutedsl_standard_scales"](layer)
    for name, value in zip(golden.CUTEDSL_RESOLVED, resolved, strict=True):
        out[f"cutedsl.{name}"] = harness.parameter_state(torch.nn.Parameter(value, requires_grad=False))
    return out


def path_a(code, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        method, layer = code.build(EXPERTS, HIDDEN, INTER, tp, rank)
        code.load(layer, golden.example_experts(EXAMPLE, layer_id))
        code.process(method, layer)
        states[prefix(layer_id)] = state(code, layer)
    return states


def path_b(code, artifact: Path, tp: int, rank: int, verify_checksums: bool = True) -> dict[str, dict]:
    installer = SglangArtifactInstaller(artifact, verify_checksums, nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    built = {prefix(i): code.build(EXPERTS, HIDDEN, INTER, tp, rank) for i in LAYERS}
    installer.prepare([(p, layer, nvfp4_layer(p, method, layer)) for p, (method, layer) in built.items()])
    for method, layer in built.values():
        installer.postprocess(layer, method)
    return {p: state(code, layer) for p, (_method, layer) in built.items()}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    assert differences(a, path_b(code, artifacts[tp], tp, rank)) == []
    layer = next(iter(a.values()))
    assert {"w13_weight", "w13_weight_scale", "w13_blockscale_swizzled", "w13_blockscale_mma", "w2_weight",
            "w2_weight_scale", "w2_blockscale_swizzled", "w2_blockscale_mma", "w13_weight_scale_2",
            "w2_weight_scale_2", "g1_alphas", "g1_alphas_up", "g2_alphas", "w13_input_scale_quant",
            "w2_input_scale_quant", "cutedsl.w1_alpha", "cutedsl.fc2_input_scale", "cutedsl.w2_alpha",
            "cutedsl.used_input_scale"} <= set(layer)  # fmt: skip
    assert layer["blockscale aliases"] == ("attribute", True, True)  # the example's scales need no padding
    assert layer["w13 mma view"][2] and layer["w2 mma view"][2]  # views of the swizzled storage, as FlashInfer's
    assert layer["_cutedsl_wrapper"] == ("attribute", "None")


def test_padded_swizzled_scales_are_bound_apart_as_sglang_binds_them(code):
    """H 160: the swizzled scales do not fit the allocated scale parameters, so SGLang binds them to the
    `*_blockscale_swizzled` parameters (and the MMA views over those) and leaves the raw ones as loaded.
    The installer, fed the row's layout of the same checkpoint (per-expert w2 input scales that differ),
    leaves everything else as SGLang does."""
    experts = golden.random_experts(1, 160, 64, seed=7)
    method, layer = code.build(1, 160, 64)
    code.load(layer, experts)
    code.process(method, layer)
    tensors = _layout_tensors(experts, 160, 64)
    _method_b, installed = code.build(1, 160, 64)
    install_nvfp4.release_nvfp4_params(installed)
    install_nvfp4.install_nvfp4_cutedsl(installed, tensors, lambda: False)
    unread = RAW | {"w13_weight_scale", "w2_weight_scale"}
    a, b = state(code, layer, unread), state(code, installed, unread)
    assert a["blockscale aliases"] == ("attribute", False, False)
    assert differences({"l": a}, {"l": b}) == []


def test_per_expert_w2_input_scales_are_kept_per_expert(code):
    """Two experts whose w2 input scales differ: SGLang keeps `g2_alphas` and `w2_input_scale_quant` per
    expert (its runner reduces them itself); so does the row's layout, and the install equals SGLang's."""
    experts = golden.random_experts(2, 256, 128, seed=3)
    assert experts[0]["down_proj"]["input_scale"] != experts[1]["down_proj"]["input_scale"]
    method, layer = code.build(2, 256, 128)
    code.load(layer, experts)
    code.process(method, layer)
    _method_b, installed = code.build(2, 256, 128)
    install_nvfp4.release_nvfp4_params(installed)
    install_nvfp4.install_nvfp4_cutedsl(installed, _layout_tensors(experts, 256, 128), lambda: False)
    assert differences({"l": state(code, layer)}, {"l": state(code, installed)}) == []


def _layout_tensors(experts: dict, hidden: int, inter: int) -> dict[str, torch.Tensor]:
    canonical = _canonical(experts)
    row = get_sglang_revision("sglang-0.5.23", "nvfp4")
    layout = nvfp4_layout(Nvfp4Backend.FLASHINFER_CUTEDSL, row, hidden, inter, len(experts))
    tensors = {name: t.forward(canonical[name]) for name, t in layout.tensors.items()}
    return tensors | {name: d.compute(*(canonical[i] for i in d.inputs)) for name, d in layout.derived.items()}


# ---- planted bugs ----------------------------------------------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    assert differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_uninterleaved_weights_are_seen(code, artifacts, monkeypatch):
    """An install that left w13's [up; gate] halves contiguous (the CUTLASS order, no 64-row interleave) differs."""
    real = install_nvfp4._rebind

    def halves(layer, name, value):
        if name == "w13_weight":
            e, m, k = value.shape
            value = value.reshape(e, m // 128, 2, 64, k).transpose(1, 2).reshape(e, m, k)
        real(layer, name, value)

    monkeypatch.setattr(install_nvfp4, "_rebind", halves)
    found = differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and all(line.endswith(".w13_weight") for line in found), found


def test_planted_folded_alphas_are_seen(code, artifacts, monkeypatch):
    """Handing the runner folded global scales (vLLM 0.33's `w * max(a)`) in place of the raw ones: the raw
    parameter and the resolved `w2_alpha` differ."""
    real = installer_module.install_nvfp4_cutedsl

    def folded(layer, tensors, dispatch):
        tensors = {**tensors, "w2_weight_scale_2": tensors["w2_weight_scale_2"] * tensors["w2_input_scale"].max()}
        real(layer, tensors, dispatch)

    monkeypatch.setattr(installer_module, "install_nvfp4_cutedsl", folded)
    found = differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and any(line.endswith("cutedsl.w2_alpha") for line in found), found
    assert all(line.endswith(("cutedsl.w2_alpha", "w2_weight_scale_2")) for line in found), found


def test_a_cutlass_layer_is_refused_for_a_cutedsl_artifact(artifacts):
    """The process runs FlashInfer CUTLASS (the layer's runner), the artifact holds CuTe DSL bytes: refused."""
    cutlass = golden.SglangNvfp4(harness.read_installed, "flashinfer_cutlass")
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    method, layer = cutlass.build(EXPERTS, HIDDEN, INTER, 1, 0)
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_CUTLASS"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


@pytest.mark.parametrize("value", ["1", "y", "maybe"])
def test_the_w4a16_mode_is_refused(code, artifacts, monkeypatch, value):
    """SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16 on (or a value SGLang's EnvBool raises on) in the serving
    process: SGLang would hand the runner input scales of one and BF16 activations; refused."""
    monkeypatch.setenv("SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16", value)
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    method, layer = code.build(EXPERTS, HIDDEN, INTER, 1, 0)
    with pytest.raises(ArtifactMismatch, match="SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_tp2_artifact_in_a_tp1_process_is_refused(code, artifacts):
    with pytest.raises(ArtifactMismatch, match="tp_size"):
        path_b(code, artifacts[2], 1, 0)
