"""Path A = path B for the SGLang loader's NVFP4 install (runtimes/sglang/install_nvfp4.py), on CPU, for
the NVFP4 backends mxconvert writes for SGLang 0.5.23 (ModelOpt FLASHINFER_TRTLLM, profile b200, and
MARLIN, profile h100), TP 1 and TP 2, every rank and layer of examples/tiny-nvfp4-modelopt-qwen3:

* path A: SGLang's own `ModelOptNvFp4FusedMoEMethod.__init__` / `create_weights`, `FusedMoE`'s
  per-expert loading of the checkpoint and `process_weights_after_loading`
  (tools/golden/sglang_nvfp4.py's `SglangNvfp4`, compiled from the installed sglang; stand-ins named
  there);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile b200 --tp N` wrote: the runtime and layer checks (install_nvfp4.py
  `nvfp4_layer`), `prepare` (layer set, dtypes / shapes, checksums, release of the parameters) and
  `postprocess` in place of SGLang's post-processing.

Compared: every parameter (type, requires_grad, dtype, shape, device, bytes) but SGLang's raw
`w13/w2_input_scale` (and, for TRT-LLM, `w13/w2_weight_scale_2`: what the loaded checkpoint put there;
the TRT-LLM kernel reads the alphas made of them, and those are compared; for Marlin the
`w13/w2_blockscale_swizzled` placeholders `create_weights` swizzled from uninitialized memory, which no
Marlin code reads), and the plain attributes the kernel reads (TRT-LLM: `trtllm_padded_hidden_size`,
`intermediate_size_per_partition`, the dispatcher's quant config; Marlin: `workspace`).
Planted bugs make the comparison fail or the loader refuse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import harness
import pytest
import torch

from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import install_nvfp4
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import sglang_common  # noqa: E402 - tools/golden is on sys.path (harness.py)
import sglang_nvfp4 as golden  # noqa: E402

EXAMPLE = harness.REPO / "examples" / "tiny-nvfp4-modelopt-qwen3"
CONFIG = json.loads((EXAMPLE / "config.json").read_text())
HIDDEN, INTER, EXPERTS = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"], CONFIG["num_experts"]
LAYERS = range(CONFIG["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
LIVE = LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__)
LIVE_H100 = LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__)
#: SGLang's raw parameters the TRT-LLM kernel no longer reads after post-processing (not in the artifact).
RAW = {"w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"}
#: What a Marlin layer holds that no Marlin code reads (input scales; create_weights' swizzled placeholders).
MARLIN_UNREAD = {"w13_input_scale", "w2_input_scale", "w13_blockscale_swizzled", "w2_blockscale_swizzled"}
ATTRIBUTES = ("trtllm_padded_hidden_size", "intermediate_size_per_partition")


def convert(out: Path, *args: str, profile: str = "b200") -> Path:
    return harness.convert(EXAMPLE, out, "--profile", profile, *args)


@pytest.fixture(scope="module")
def code() -> golden.SglangNvfp4:
    return golden.SglangNvfp4(harness.read_installed)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-artifacts")
    return {tp: convert(root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--tp", str(tp)) for tp in (1, 2)}


@pytest.fixture(scope="module")
def marlin_code() -> golden.SglangNvfp4:
    return golden.SglangNvfp4(harness.read_installed, "marlin")


@pytest.fixture(scope="module")
def marlin_artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-marlin-artifacts")
    return {
        tp: convert(root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--tp", str(tp), profile="h100") for tp in (1, 2)
    }


def prefix(layer_id: int) -> str:
    return f"model.layers.{layer_id}.mlp.experts"


def state(layer: Any) -> dict[str, object]:
    """The layer's state the kernel reads (harness.parameter_state per parameter, and its attributes)."""
    marlin = hasattr(layer, "workspace")
    out: dict[str, object] = {}
    for name, param in layer.named_parameters():
        if name in (MARLIN_UNREAD if marlin else RAW):
            continue
        out[name] = harness.parameter_state(param)
    if marlin:
        out["workspace"] = ("attribute", layer.workspace.dtype, tuple(layer.workspace.shape), layer.workspace.tolist())
        return out
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


def path_b(
    code, artifact: Path, tp: int, rank: int, verify_checksums: bool = True, live: LiveSglang = LIVE
) -> dict[str, dict]:
    installer = SglangArtifactInstaller(
        artifact, verify_checksums, golden.marlin_tool.marlin_make_workspace, nvfp4_dispatch=lambda: False
    )
    installer.check_runtime(live)
    built = {prefix(i): code.build(EXPERTS, HIDDEN, INTER, tp, rank) for i in LAYERS}
    installer.prepare([(p, layer, nvfp4_layer(p, method, layer)) for p, (method, layer) in built.items()])
    for method, layer in built.values():
        installer.postprocess(layer, method)
    return {p: state(layer) for p, (_method, layer) in built.items()}


def differences(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    assert set(a) == set(b)
    out = []
    for p in a:
        for key in sorted(set(a[p]) | set(b[p])):
            if a[p].get(key) != b[p].get(key):
                out.append(f"{p}.{key}")
    return out


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    assert differences(a, path_b(code, artifacts[tp], tp, rank)) == []
    names = set(next(iter(a.values())))
    assert {"w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "g1_alphas", "g1_alphas_up",
            "g2_alphas", "g1_scale_c", "w13_input_scale_quant", "w2_input_scale_quant"} <= names  # fmt: skip


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_marlin_path_a_equals_path_b(marlin_code, marlin_artifacts, tp, rank):
    a = path_a(marlin_code, tp, rank)
    assert differences(a, path_b(marlin_code, marlin_artifacts[tp], tp, rank, live=LIVE_H100)) == []
    assert set(next(iter(a.values()))) == {
        "w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
        "workspace",
    }  # fmt: skip


def test_marlin_planted_wrong_global_scale_dtype_is_refused(marlin_code, marlin_artifacts, monkeypatch):
    """A specs table that wanted float32 global scales (vLLM 0.33's rescaled Marlin) refuses SGLang's."""
    real = install_nvfp4.nvfp4_marlin_specs

    def float32_globals(layer):
        return real(layer) | {"w13_weight_scale_2": (torch.float32, real(layer)["w13_weight_scale_2"][1])}

    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.nvfp4_marlin_specs", float32_globals)
    with pytest.raises(ArtifactMismatch, match="w13_weight_scale_2 dtype, shape"):
        path_b(marlin_code, marlin_artifacts[1], 1, 0, live=LIVE_H100)


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(code, tp, rank):
    """Path A reproduces tools/golden/sglang_nvfp4.py's recorded run (same code, same stand-ins)."""
    want = json.loads(sglang_common.OUT.joinpath("nvfp4-trtllm_sglang-0.5.23_example_digests.json").read_text())
    for layer_id in LAYERS:
        got = golden.run_sglang(code, golden.example_experts(EXAMPLE, layer_id), HIDDEN, INTER, tp, rank)
        digests = {name: sglang_common.digest(t) for name, t in got.items()}
        assert digests == want["digests"][f"tp{tp}"][f"rank{rank}"][f"layer{layer_id}"]


# ---- planted bugs ----------------------------------------------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    assert differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_missing_reciprocal_is_seen(code, artifacts, monkeypatch):
    """An install that hands SGLang a13 instead of 1 / a13 differs exactly in the input-scale quants."""
    real = install_nvfp4._rebind

    def wrong(layer, name, value):
        real(layer, name, 1 / value if name.endswith("_input_scale_quant") else value)

    monkeypatch.setattr(install_nvfp4, "_rebind", wrong)
    found = differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and all("input_scale_quant" in line for line in found), found


def test_a_swiglu_clamp_layer_is_refused(code, artifacts):
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE)
    method, layer = code.build(EXPERTS, HIDDEN, INTER, 1, 0)
    layer.moe_runner_config.swiglu_limit = 7.0
    with pytest.raises(ArtifactMismatch, match="swiglu_limit"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_tp2_artifact_in_a_tp1_process_is_refused(code, artifacts):
    with pytest.raises(ArtifactMismatch, match="tp_size"):
        path_b(code, artifacts[2], 1, 0)


def test_other_nvfp4_backends_are_refused_before_the_model_is_built(artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(artifacts[1], art)
    installer = SglangArtifactInstaller(art)
    installer.target = {**installer.target, "backend": "VLLM_CUTLASS"}
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_CUTLASS / FLASHINFER_CUTEDSL artifacts only"):
        installer.check_runtime(LIVE)
