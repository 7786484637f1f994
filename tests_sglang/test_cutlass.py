"""Path A = path B for the SGLang loader's FlashInfer CUTLASS installs (`--moe-runner-backend
flashinfer_mxfp4` on SM90: FLASHINFER_CUTLASS_MXFP4_BF16, profile h100; on SM120:
FLASHINFER_CUTLASS_MXFP4_MXFP8, profile rtx-pro-6000), on CPU, TP 1 and TP 2, every rank and layer of
examples/tiny-gpt-oss:

* path A: SGLang 0.5.23's own `create_weights` (cutlass branch), `_load_mxfp4_experts_weights` of the
  checkpoint and `process_weights_after_loading` (`_process_weights_for_sm90_cutlass` /
  `_process_weights_for_sm120_cutlass`), compiled from the installed package by
  tools/golden/sglang_mxfp4_cutlass.py (stand-ins named there: FlashInfer's CUDA-only SM90 weight
  interleave -> its GPU outputs for exactly these inputs, replayed from tests_sglang/data/sm90_interleave/;
  `block_scale_interleave` -> FlashInfer's pure-torch 128x4 swizzle; `Tensor.cuda` -> identity);
* path B: the same `create_weights`, then the installer on the artifact `convert --runtime
  sglang==0.5.23 --profile PROFILE --backend flashinfer_mxfp4 --tp N` wrote.

The whole layer state must be equal: every parameter (type, requires_grad, dtype, shape, device,
bytes; the six expert tensors and SGLang's `swiglu_*` / `mxfp4_weight_global_scale`) and
`_mxfp4_backend`. Planted bugs make the comparison fail or the install refuse.
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
import sglang_mxfp4_cutlass as golden_cutlass  # noqa: E402 - tools/golden, put on sys.path by harness

LAYERS = range(harness.config()["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
#: kernel -> (profile, live capability, golden tag)
KERNELS = {
    "cutlass_sm90": ("h100", [9, 0], "cutlass-sm90"),
    "cutlass_sm120": ("rtx-pro-6000", [12, 0], "cutlass-sm120"),
}
SM120_ONLY = {"cutlass_sm120": ["_mxfp4_backend", "mxfp4_weight_global_scale"]}


def live(kernel: str) -> LiveSglang:
    """The scheduler process SGLang 0.5.23 would be on the kernel's device."""
    return LiveSglang("0.5.23", "cuda", KERNELS[kernel][1], flashinfer.__version__)


def artifact(out: Path, kernel: str, tp: int, runtime: str = "sglang==0.5.23") -> Path:
    profile = KERNELS[kernel][0]
    backend = "flashinfer_mxfp4" if runtime.startswith("sglang") else golden_cutlass.BACKENDS[kernel]
    return harness.convert(
        harness.EXAMPLE,
        out,
        "--profile",
        profile,
        "--runtime",
        runtime,
        "--backend",
        backend,
        "--tp",
        str(tp),
    )


def sm90_weights(kernel: str):
    """The SM90 weight interleave stand-in: the GPU's outputs replayed (SM120 never calls it)."""
    return golden_cutlass.sm90_stand_in() if kernel == "cutlass_sm90" else golden_cutlass.no_sm90_interleave


@pytest.fixture(scope="module", params=list(KERNELS))
def kernel(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def fns(kernel) -> dict:
    """SGLang's code from the installed package (the golden tool reads the same files from the wheel)."""
    namespace = golden_cutlass.cutlass_namespace(kernel, sm90_weights(kernel))
    return golden_cutlass.compile_cutlass(harness.read_installed, namespace)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, kernel) -> dict[int, Path]:
    root = tmp_path_factory.mktemp(f"sglang-{kernel}")
    return {tp: artifact(root / f"tp{tp}", kernel, tp) for tp in (1, 2)}


def build(fns: dict, kernel: str, layer_id: int, tp: int, rank: int):
    cfg = harness.config()
    method, layer = golden_cutlass.build_layer(
        fns, kernel, cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"], tp, rank
    )
    return f"model.layers.{layer_id}.mlp.experts", method, layer


def state(layer: torch.nn.Module) -> dict[str, object]:
    out = harness.layer_state(layer)
    out.pop("_situ_routing_bias_bf16")  # a TRT-LLM attribute: unset on both paths
    out["_mxfp4_backend"] = ("attribute", getattr(layer, "_mxfp4_backend", "<unset>"))
    return out


def path_a(fns: dict, kernel: str, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        prefix, method, layer = build(fns, kernel, layer_id, tp, rank)
        golden_cutlass.golden_example.load_example_layer(
            fns["_load_mxfp4_experts_weights"], layer, layer_id, harness.config()
        )
        golden_cutlass.post_process(fns, method, layer)
        states[prefix] = state(layer)
    return states


def path_b(fns: dict, kernel: str, art: Path, tp: int, rank: int) -> dict[str, dict]:
    installer = SglangArtifactInstaller(art, True)
    installer.check_runtime(live(kernel))
    built = [build(fns, kernel, layer_id, tp, rank) for layer_id in LAYERS]
    installer.prepare([(p, layer, sglang_layer(p, m, layer)) for p, m, layer in built])
    for _prefix, method, layer in built:
        assert installer.holds(layer)
        installer.postprocess(layer, method)
    return {prefix: state(layer) for prefix, _method, layer in built}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(fns, artifacts, kernel, tp, rank):
    a = path_a(fns, kernel, tp, rank)
    b = path_b(fns, kernel, artifacts[tp], tp, rank)
    assert harness.all_differences(a, b) == []
    names = set(install.SGLANG_NAMES) | {"swiglu_alpha", "swiglu_beta", "swiglu_limit", "_mxfp4_backend"}
    if kernel == "cutlass_sm120":
        names.add("mxfp4_weight_global_scale")
        assert next(iter(a.values()))["_mxfp4_backend"] == ("attribute", "flashinfer_cutlass_sm120")
    assert set(next(iter(a.values()))) == names


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(fns, kernel, tp, rank):
    """The installed SGLang's code gives the digests the golden tool made from the wheel."""
    digests = harness.REPO / "tests" / "golden" / "sglang" / f"{KERNELS[kernel][2]}_sglang-0.5.23_example_digests.json"
    golden = json.loads(digests.read_text())["digests"][f"tp{tp}"][f"rank{rank}"]
    for layer_id in LAYERS:
        tensors = golden_cutlass.rank_layer(fns, kernel, harness.config(), layer_id, tp, rank)
        for name, want in golden[f"layer{layer_id}"].items():
            harness.assert_matches_digest(tensors[name], want, f"layer{layer_id}.{name}")


# ---- planted bugs -------------------------------------------------------------------------------


def test_planted_wrong_swiglu_limit_is_seen(fns, artifacts, kernel, monkeypatch):
    monkeypatch.setattr(install, "GEMM1_CLAMP_LIMIT_DEFAULT", 8.0)
    found = harness.all_differences(path_a(fns, kernel, 1, 0), path_b(fns, kernel, artifacts[1], 1, 0))
    assert found and all("swiglu_limit: bytes differ" in line for line in found), found


def test_planted_vllm_row_artifact_is_seen(fns, tmp_path, kernel, monkeypatch):
    """vLLM 0.33's CUTLASS artifact (I padded before the moves to vLLM's sizes, scales padded with 0)
    is refused by the runtime row; with that check planted away, by the shape check."""
    vllm_art = artifact(tmp_path / "vllm", kernel, 1, runtime="vllm==0.33.0")
    with pytest.raises(checks.ArtifactMismatch, match="runtime_revision"):
        path_b(fns, kernel, vllm_art, 1, 0)
    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.runtime_mismatches", lambda target, live: [])
    with pytest.raises(checks.ArtifactMismatch, match="padded|dtype, shape"):
        path_b(fns, kernel, vllm_art, 1, 0)


def test_a_trtllm_artifact_is_refused_by_a_cutlass_layer(fns, tmp_path, kernel):
    trtllm = harness.convert(harness.EXAMPLE, tmp_path / "trtllm", "--profile", "b200", "--runtime", "sglang==0.5.23")
    installer = SglangArtifactInstaller(trtllm, True)
    installer.check_runtime(LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__))
    built = [build(fns, kernel, layer_id, 1, 0) for layer_id in LAYERS]
    with pytest.raises(checks.ArtifactMismatch) as refused:
        installer.prepare([(p, layer, sglang_layer(p, m, layer)) for p, m, layer in built])
    backend = golden_cutlass.BACKENDS[kernel]
    assert "field 'backend': artifact has 'FLASHINFER_TRTLLM_MXFP4_MXFP8'" in str(refused.value)
    assert f"has '{backend}'" in str(refused.value)
    assert "--backend flashinfer_mxfp4 --tp 1" in str(refused.value)
