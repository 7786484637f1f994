"""Path A = path B for the SGLang loader's MARLIN install (`--moe-runner-backend marlin`, profile
h100), on CPU, TP 1 and TP 2, every rank and layer of examples/tiny-gpt-oss:

* path A: SGLang 0.5.23's own `create_weights` (marlin branch), `_load_mxfp4_experts_weights` of the
  checkpoint and `process_weights_after_loading` (marlin branch: `check_moe_marlin_supports_layer`,
  `deinterleave_moe_mxfp4_w13_for_marlin`, `prepare_moe_mxfp4_layer_for_marlin`), compiled from the
  installed package by tools/golden/sglang_mxfp4_marlin.py's `functions` (stand-ins named there:
  `gptq_marlin_repack` -> vLLM's test reference, checked against a transcription of SGLang's kernel;
  `marlin_make_workspace` -> zeros for 132 SMs; SM90 platform; `Tensor.cuda` -> identity);
* path B: the same `create_weights`, then the installer on the artifact `convert --runtime
  sglang==0.5.23 --profile h100 --backend marlin --tp N` wrote, with the same workspace function.

The whole layer state must be equal: every parameter (type, requires_grad, dtype, shape, device,
bytes), `workspace` and `_mxfp4_backend`. Planted bugs make the comparison fail or the install refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import harness
import pytest
import torch

from mxconvert.runtimes.sglang import checks, install
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

flashinfer = pytest.importorskip("flashinfer")
import sglang_mxfp4_marlin as golden_marlin  # noqa: E402 - tools/golden, put on sys.path by harness

#: The H100 scheduler process SGLang 0.5.23 would be.
LIVE = LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__)
LAYERS = range(harness.config()["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
DIGESTS = harness.REPO / "tests" / "golden" / "sglang" / "marlin_sglang-0.5.23_example_digests.json"
UTILS = "sglang.srt.layers.quantization.marlin_utils"


def convert(out: Path, *args: str) -> Path:
    return harness.convert(harness.EXAMPLE, out, *args)


def marlin_artifact(out: Path, tp: int, runtime: str = "sglang==0.5.23") -> Path:
    return convert(out, "--profile", "h100", "--runtime", runtime, "--backend", "marlin", "--tp", str(tp))


@pytest.fixture(scope="module")
def fns() -> dict:
    """SGLang's code from the installed package (the golden tool reads the same files from the wheel)."""
    compiled = golden_marlin.functions(harness.read_installed)
    example = golden_marlin.example
    compiled["_load_mxfp4_experts_weights"] = example.expert_loader(harness.read_installed, example.loader_namespace())
    return compiled


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-marlin")
    return {tp: marlin_artifact(root / f"tp{tp}", tp) for tp in (1, 2)}


def build(fns: dict, layer_id: int, tp: int, rank: int):
    cfg = harness.config()
    method, layer = golden_marlin.new_layer(
        fns, cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"], tp, rank
    )
    layer.num_fused_shared_experts = 0
    return f"model.layers.{layer_id}.mlp.experts", method, layer


def load_checkpoint(fns: dict, prefix: str, layer: torch.nn.Module) -> None:
    load_experts = fns["_load_mxfp4_experts_weights"]
    golden_marlin.example.load_example_layer(load_experts, layer, int(prefix.split(".")[2]), harness.config())


def state(layer: torch.nn.Module) -> dict[str, object]:
    out = harness.layer_state(layer)
    out.pop("_situ_routing_bias_bf16")  # a TRT-LLM attribute: unset on both paths
    workspace: torch.Tensor = getattr(layer, "workspace")  # noqa: B009 - a plain tensor attribute SGLang sets
    out["workspace"] = (str(workspace.dtype), tuple(workspace.shape), workspace.numpy().tobytes())
    out["_mxfp4_backend"] = ("attribute", getattr(layer, "_mxfp4_backend", "<unset>"))
    return out


def path_a(fns: dict, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        prefix, method, layer = build(fns, layer_id, tp, rank)
        load_checkpoint(fns, prefix, layer)
        golden_marlin.post_process(fns, method, layer)
        states[prefix] = state(layer)
    return states


def supported(fns: dict, layer: torch.nn.Module) -> bool:
    """SGLang's own check_moe_marlin_supports_layer, as loader.py asks it."""
    check = fns["marlin_modules"][UTILS].check_moe_marlin_supports_layer
    return bool(check(layer, 32, allow_tile_padding=True))


def path_b(fns: dict, artifact: Path, tp: int, rank: int, verify_checksums: bool = True) -> dict[str, dict]:
    installer = SglangArtifactInstaller(artifact, verify_checksums, golden_marlin.marlin_make_workspace)
    installer.check_runtime(LIVE)
    built = [build(fns, layer_id, tp, rank) for layer_id in LAYERS]
    installer.prepare(
        [(p, layer, sglang_layer(p, m, layer, marlin_supported=supported(fns, layer))) for p, m, layer in built]
    )
    for _prefix, method, layer in built:
        assert installer.holds(layer)
        installer.postprocess(layer, method)
    return {prefix: state(layer) for prefix, _method, layer in built}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(fns, artifacts, tp, rank):
    a = path_a(fns, tp, rank)
    b = path_b(fns, artifacts[tp], tp, rank)
    assert harness.all_differences(a, b) == []
    assert set(next(iter(a.values()))) == set(install.SGLANG_NAMES) | {"workspace", "_mxfp4_backend"}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(fns, tp, rank):
    golden = json.loads(DIGESTS.read_text())["digests"][f"tp{tp}"][f"rank{rank}"]
    for layer_id in LAYERS:
        prefix, method, layer = build(fns, layer_id, tp, rank)
        load_checkpoint(fns, prefix, layer)
        tensors = golden_marlin.post_process(fns, method, layer)
        for name, want in golden[f"layer{layer_id}"].items():
            harness.assert_matches_digest(tensors[name], want, f"layer{layer_id}.{name}")


# ---- planted bugs -------------------------------------------------------------------------------


def test_planted_wrong_workspace_size_is_seen(fns, artifacts, monkeypatch):
    monkeypatch.setattr(install, "MARLIN_WORKSPACE_BLOCKS_PER_SM", 1)
    found = harness.all_differences(path_a(fns, 1, 0), path_b(fns, artifacts[1], 1, 0))
    assert found and all("workspace" in line for line in found), found


def test_planted_vllm_row_artifact_is_seen(fns, tmp_path, monkeypatch):
    """vLLM 0.33's MARLIN artifact has SGLang's dtypes and shapes but keeps w13 gate/up interleaved
    and pads scales with 0: refused by the runtime row; with that check planted away, it installs
    and exactly the three w13 tensors and w2's scales (padded I 320 -> 384) differ."""
    vllm_art = marlin_artifact(tmp_path / "vllm", 1, runtime="vllm==0.33.0")
    with pytest.raises(checks.ArtifactMismatch, match="runtime_revision"):
        path_b(fns, vllm_art, 1, 0)
    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.runtime_mismatches", lambda target, live: [])
    found = harness.all_differences(path_a(fns, 1, 0), path_b(fns, vllm_art, 1, 0))
    want = {"w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight_scale"}
    assert sorted(found) == sorted(f"{p}: {name}: bytes differ" for p in path_a(fns, 1, 0) for name in want)


def test_a_trtllm_artifact_is_refused_by_a_marlin_layer(fns, tmp_path):
    trtllm = convert(tmp_path / "trtllm", "--profile", "b200", "--runtime", "sglang==0.5.23")
    installer = SglangArtifactInstaller(trtllm, True, golden_marlin.marlin_make_workspace)
    installer.check_runtime(LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__))
    built = [build(fns, layer_id, 1, 0) for layer_id in LAYERS]
    with pytest.raises(checks.ArtifactMismatch) as refused:
        installer.prepare([(p, layer, sglang_layer(p, m, layer)) for p, m, layer in built])
    assert "field 'backend': artifact has 'FLASHINFER_TRTLLM_MXFP4_MXFP8'" in str(refused.value)
    assert "has 'MARLIN'" in str(refused.value)
    assert "--runtime sglang==0.5.23 --backend marlin --tp 1" in str(refused.value)


def test_a_layer_sglang_marlin_cannot_run_is_refused(fns, artifacts):
    """SGLang's post-processing raises on a layer check_moe_marlin_supports_layer rejects; the loader
    skips that post-processing, so it refuses the layer itself."""
    installer = SglangArtifactInstaller(artifacts[1], True, golden_marlin.marlin_make_workspace)
    installer.check_runtime(LIVE)
    built = [build(fns, layer_id, 1, 0) for layer_id in LAYERS]
    with pytest.raises(checks.ArtifactMismatch, match="check_moe_marlin_supports_layer"):
        installer.prepare([(p, layer, sglang_layer(p, m, layer, marlin_supported=False)) for p, m, layer in built])
    assert all(supported(fns, layer) for _p, _m, layer in built)  # the example itself is supported
