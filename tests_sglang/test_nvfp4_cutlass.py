"""Path A = path B for the SGLang loader's NVFP4 FlashInfer CUTLASS install (runtimes/sglang/install_nvfp4.py
`install_nvfp4_cutlass`), on CPU: ModelOpt FLASHINFER_CUTLASS (`--moe-runner-backend flashinfer_cutlass`,
profile b200), TP 1 and TP 2, every rank and layer of examples/tiny-nvfp4-modelopt-qwen3:

* path A: SGLang's own `ModelOptNvFp4FusedMoEMethod.__init__` / `create_weights` for the
  flashinfer_cutlass runner, `FusedMoE`'s per-expert loading ([up; gate]) and
  `process_weights_after_loading`'s CUTLASS branch (tools/golden/sglang_nvfp4.py's `SglangNvfp4`,
  compiled from the installed sglang; stand-ins named there);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile b200 --backend flashinfer_cutlass --tp N` wrote.

Compared: every parameter (type, requires_grad, dtype, shape, device, bytes) but SGLang's raw
`w13/w2_weight_scale_2` and `w13/w2_input_scale` (what the loaded checkpoint put there; the CUTLASS
kernel reads the alphas and reciprocals made of them, and those are compared), and the plain
attributes `apply` reads: `_cutlass_swiglu_params`, the dispatcher's quant config, which parameter the
`*_blockscale_swizzled` names alias, `intermediate_size_per_partition`. A case whose swizzled scales
are padded (H 160: not aliased) is compared from the layout's tensors. Planted bugs fail or are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
import pytest
import torch
from test_nvfp4 import EXAMPLE, EXPERTS, HIDDEN, INTER, LAYERS, LIVE, RANKS, differences, prefix

from mxconvert.layouts import nvfp4_layout
from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import install_nvfp4
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.sglang_revisions import get_sglang_revision

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import sglang_nvfp4 as golden  # noqa: E402 - tools/golden is on sys.path (harness.py)

#: SGLang's raw parameters the CUTLASS kernel no longer reads after post-processing (not in the artifact).
RAW = {"w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"}
ATTRIBUTES = ("intermediate_size_per_partition", "_cutlass_swiglu_params", "trtllm_padded_hidden_size")


@pytest.fixture(scope="module")
def code() -> golden.SglangNvfp4:
    return golden.SglangNvfp4(harness.read_installed, "flashinfer_cutlass")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-cutlass-artifacts")
    return {
        tp: harness.convert(
            EXAMPLE, root / f"tp{tp}", "--profile", "b200", "--backend", "flashinfer_cutlass",
            "--runtime", "sglang==0.5.23", "--tp", str(tp),
        )
        for tp in (1, 2)
    }  # fmt: skip


def state(layer: Any, unread: set[str] = RAW) -> dict[str, object]:
    """The layer's state the CUTLASS kernel reads (harness.parameter_state per parameter, by every name
    it is bound under, and the attributes `apply` reads)."""
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
    return out


def path_a(code, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        method, layer = code.build(EXPERTS, HIDDEN, INTER, tp, rank)
        code.load(layer, golden.example_experts(EXAMPLE, layer_id))
        code.process(method, layer)
        states[prefix(layer_id)] = state(layer)
    return states


def path_b(code, artifact: Path, tp: int, rank: int, verify_checksums: bool = True) -> dict[str, dict]:
    installer = SglangArtifactInstaller(artifact, verify_checksums, nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    built = {prefix(i): code.build(EXPERTS, HIDDEN, INTER, tp, rank) for i in LAYERS}
    installer.prepare([(p, layer, nvfp4_layer(p, method, layer)) for p, (method, layer) in built.items()])
    for method, layer in built.values():
        installer.postprocess(layer, method)
    return {p: state(layer) for p, (_method, layer) in built.items()}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    assert differences(a, path_b(code, artifacts[tp], tp, rank)) == []
    layer = next(iter(a.values()))
    assert {"w13_weight", "w13_weight_scale", "w13_blockscale_swizzled", "w2_weight", "w2_weight_scale",
            "w2_blockscale_swizzled", "g1_alphas", "g1_alphas_up", "g2_alphas", "w13_input_scale_quant",
            "w2_input_scale_quant"} <= set(layer)  # fmt: skip
    assert layer["blockscale aliases"] == ("attribute", True, True)  # the example's scales need no padding
    assert layer["_cutlass_swiglu_params"] == ("attribute", "(None, None, None)")


def test_padded_swizzled_scales_are_bound_apart_as_sglang_binds_them(code):
    """H 160: the swizzled scales (10 -> 12 columns, w2 rows 160 -> 256) do not fit the allocated scale
    parameters, so SGLang binds them to the `*_blockscale_swizzled` parameters and leaves the raw ones
    (which no kernel reads; the artifact has no copy of them) as loaded. The installer, fed the row's
    layout of the same checkpoint, leaves everything else as SGLang does."""
    experts = golden.random_experts(1, 160, 64, seed=7)
    method, layer = code.build(1, 160, 64)
    code.load(layer, experts)
    code.process(method, layer)
    canonical = _canonical(experts)
    layout = nvfp4_layout(Nvfp4Backend.FLASHINFER_CUTLASS, get_sglang_revision("sglang-0.5.23", "nvfp4"), 160, 64, 1)
    tensors = {name: t.forward(canonical[name]) for name, t in layout.tensors.items()}
    tensors |= {name: d.compute(*(canonical[i] for i in d.inputs)) for name, d in layout.derived.items()}
    _method_b, installed = code.build(1, 160, 64)
    install_nvfp4.release_nvfp4_params(installed)
    install_nvfp4.install_nvfp4_cutlass(installed, tensors, lambda: False)
    unread = RAW | {"w13_weight_scale", "w2_weight_scale"}
    a, b = state(layer, unread), state(installed, unread)
    assert a["blockscale aliases"] == ("attribute", False, False)
    assert differences({"l": a}, {"l": b}) == []


def _canonical(experts: dict) -> dict[str, torch.Tensor]:
    """mxconvert's canonical NVFP4 tensors of `random_experts` ([gate; up], gate's global scale)."""
    ids = sorted(experts)

    def stack(proj: str, kind: str) -> torch.Tensor:
        return torch.stack([experts[e][proj][kind] for e in ids])

    return {
        "w13_weight": torch.cat([stack("gate_proj", "weight"), stack("up_proj", "weight")], 1),
        "w13_weight_scale": torch.cat([stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], 1),
        "w2_weight": stack("down_proj", "weight"),
        "w2_weight_scale": stack("down_proj", "weight_scale"),
        "w13_weight_scale_2": stack("gate_proj", "weight_scale_2").float(),
        "w13_input_scale": torch.stack([stack("gate_proj", "input_scale"), stack("up_proj", "input_scale")], 1).float(),
        "w2_weight_scale_2": stack("down_proj", "weight_scale_2").float(),
        "w2_input_scale": stack("down_proj", "input_scale").float(),
    }


# ---- planted bugs ----------------------------------------------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    assert differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_gate_first_weights_are_seen(code, artifacts, monkeypatch):
    """An install that put w13's halves back in [gate; up] order (vLLM's VLLM_CUTLASS order) differs."""
    real = install_nvfp4._rebind

    def gate_first(layer, name, value):
        real(layer, name, torch.cat(value.chunk(2, 1)[::-1], 1) if name == "w13_weight" else value)

    monkeypatch.setattr(install_nvfp4, "_rebind", gate_first)
    found = differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and all(line.endswith(".w13_weight") for line in found), found


def test_planted_unaliased_scales_are_seen(code, artifacts, monkeypatch):
    """Binding the swizzled scales apart where SGLang aliases them leaves the kernel's parameter apart."""
    monkeypatch.setattr(install_nvfp4, "_bind_swizzled", lambda layer, s, d, v: install_nvfp4._rebind(layer, d, v))
    found = differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and any("blockscale aliases" in line for line in found), found


def test_a_trtllm_layer_is_refused_for_a_cutlass_artifact(artifacts):
    """The process runs TRT-LLM (the layer's runner), the artifact holds CUTLASS bytes: refused."""
    trtllm = golden.SglangNvfp4(harness.read_installed)
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    method, layer = trtllm.build(EXPERTS, HIDDEN, INTER, 1, 0)
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_TRTLLM"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_tp2_artifact_in_a_tp1_process_is_refused(code, artifacts):
    with pytest.raises(ArtifactMismatch, match="tp_size"):
        path_b(code, artifacts[2], 1, 0)
