"""Path A = path B for the SGLang loader's AITER_MXFP4_BF16 install (ROCm gfx95x with
SGLANG_USE_AITER=1, profile mi355x), on CPU, TP 1 and TP 2, every rank and layer of examples/tiny-gpt-oss:

* path A: SGLang 0.5.23's own `create_weights` (`_use_aiter` branch: I and H padded to 256, scales
  filled 0x7F), `_load_mxfp4_experts_weights` of the checkpoint and `process_weights_after_loading`
  (`_use_aiter` branch), compiled from the installed package by tools/golden/sglang_mxfp4_aiter.py
  (stand-ins named there: AITER's own pure-torch `aiter/ops/shuffle.py` for the ROCm-only import,
  mxfp4.py's module flags `_is_hip` / `_use_aiter` True and `_aiter_k3_opt` False, the env defaults);
* path B: the same `create_weights`, then the installer on the artifact `convert --runtime
  sglang==0.5.23 --profile mi355x --env SGLANG_USE_AITER=1 --tp N` wrote.

The whole layer state must be equal: every parameter (type, requires_grad, dtype, shape, device,
bytes) and the weights' `is_shuffled` tag. Planted bugs make the comparison fail or the install refuse.

Not run here: SGLang's ROCm process itself. The loader reads mxfp4.py's module-level `_use_aiter`
(SGLANG_USE_AITER on ROCm, False on this CPU import) and hands it to the layer facts (loader.py
`moe_layers` -> layer_state.py `sglang_layer` -> checks.py `method_backend`); path B here passes it as
an AITER process would (`aiter_layer`), and tests/test_sglang_aiter_live.py holds the order of that
decision.
"""

from __future__ import annotations

import json
from pathlib import Path

import harness
import pytest
import sglang_mxfp4_aiter as golden_aiter  # tools/golden, put on sys.path by harness (imported above)
import torch

from mxconvert.runtimes.sglang import checks, install
from mxconvert.runtimes.sglang.checks import LiveSglang, SglangLayer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

LAYERS = range(harness.config()["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
#: What torch on an MI355X reports (target/profiles.py ROCM_CAPABILITY: gfx950 -> (9, 5)); no FlashInfer.
LIVE = LiveSglang("0.5.23", "rocm", [9, 5], None)


def artifact(out: Path, tp: int, *env: str) -> Path:
    args = [a for e in ("SGLANG_USE_AITER=1", *env) for a in ("--env", e)]
    return harness.convert(
        harness.EXAMPLE, out, "--profile", "mi355x", "--runtime", "sglang==0.5.23", *args, "--tp", str(tp)
    )


@pytest.fixture(scope="module")
def fns() -> dict:
    """SGLang's code from the installed package (the golden tool reads the same files from the wheel)."""
    return golden_aiter.compile_aiter(harness.read_installed)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-aiter")
    return {tp: artifact(root / f"tp{tp}", tp) for tp in (1, 2)}


def build(fns: dict, layer_id: int, tp: int, rank: int):
    cfg = harness.config()
    method, layer = golden_aiter.build_layer(
        fns, cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"], tp, rank, cfg["hidden_act"]
    )
    return f"model.layers.{layer_id}.mlp.experts", method, layer


def aiter_layer(prefix: str, method, layer) -> SglangLayer:
    """`sglang_layer`'s facts for a layer SGLang runs through its `_use_aiter` branch (loader.py passes
    mxfp4.py's module-level `_use_aiter`, which the CPU import leaves False)."""
    facts = sglang_layer(prefix, method, layer, use_aiter=True)
    assert facts.backend == install.AITER, facts.backend
    return facts


def state(layer: torch.nn.Module) -> dict[str, object]:
    out = harness.layer_state(layer)
    out.pop("_situ_routing_bias_bf16")  # a TRT-LLM attribute: unset on both paths
    for name in ("w13_weight", "w2_weight"):
        out[f"{name}.is_shuffled"] = ("attribute", getattr(getattr(layer, name), "is_shuffled", "<unset>"))
    return out


def path_a(fns: dict, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        prefix, method, layer = build(fns, layer_id, tp, rank)
        golden_aiter.golden_example.load_example_layer(
            fns["_load_mxfp4_experts_weights"], layer, layer_id, harness.config()
        )
        golden_aiter.post_process(fns, method, layer)
        states[prefix] = state(layer)
    return states


def path_b(fns: dict, art: Path, tp: int, rank: int, gu_interleave: bool = True) -> dict[str, dict]:
    installer = SglangArtifactInstaller(art, True, aiter_gu_interleave=lambda: gu_interleave)
    installer.check_runtime(LIVE)
    built = [build(fns, layer_id, tp, rank) for layer_id in LAYERS]
    installer.prepare([(p, layer, aiter_layer(p, m, layer)) for p, m, layer in built])
    for _prefix, method, layer in built:
        assert installer.holds(layer)
        installer.postprocess(layer, method)
    return {prefix: state(layer) for prefix, _method, layer in built}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(fns, artifacts, tp, rank):
    a = path_a(fns, tp, rank)
    b = path_b(fns, artifacts[tp], tp, rank)
    assert harness.all_differences(a, b) == []
    first = next(iter(a.values()))
    assert set(first) == set(install.SGLANG_NAMES) | {"w13_weight.is_shuffled", "w2_weight.is_shuffled"}
    assert first["w13_weight.is_shuffled"] == ("attribute", True)


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(fns, tp, rank):
    """The installed SGLang's code gives the digests the golden tool made from the wheel."""
    digests = harness.REPO / "tests" / "golden" / "sglang" / f"{golden_aiter.TAG}_sglang-0.5.23_example_digests.json"
    golden = json.loads(digests.read_text())["digests"][f"tp{tp}"][f"rank{rank}"]
    for layer_id in LAYERS:
        tensors = golden_aiter.rank_layer(fns, harness.config(), layer_id, tp, rank)
        for name, want in golden[f"layer{layer_id}"].items():
            harness.assert_matches_digest(tensors[name], want, f"layer{layer_id}.{name}")


# ---- planted bugs -------------------------------------------------------------------------------


def test_planted_missing_is_shuffled_tag_is_seen(fns, artifacts, monkeypatch):
    """SGLang's apply hands `is_shuffled` to aiter's fused_moe: an install without it differs."""
    real = install.install_aiter

    def untagged(layer, tensors, gu_interleave):
        real(layer, tensors, gu_interleave)
        del layer.w2_weight.is_shuffled

    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.install_aiter", untagged)
    found = harness.all_differences(path_a(fns, 1, 0), path_b(fns, artifacts[1], 1, 0))
    assert found and all("w2_weight.is_shuffled" in line for line in found), found


def test_planted_flipped_byte_is_seen(fns, artifacts, monkeypatch):
    real = install.install_aiter

    def flipped(layer, tensors, gu_interleave):
        tensors = dict(tensors)
        scale = tensors["w13_weight_scale"].clone()
        scale.view(-1)[0] ^= 1
        tensors["w13_weight_scale"] = scale
        real(layer, tensors, gu_interleave)

    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.install_aiter", flipped)
    found = harness.all_differences(path_a(fns, 1, 0), path_b(fns, artifacts[1], 1, 0))
    assert found and all("w13_weight_scale: bytes differ" in line for line in found), found


def test_gu_interleave_off_is_refused_before_any_weight_is_released(fns, artifacts):
    """SGLANG_USE_AITER_MOE_GU_ITLV=0 in the serving process: SGLang would run aiter's shuffle_weight."""
    with pytest.raises(checks.ArtifactMismatch, match="SGLANG_USE_AITER_MOE_GU_ITLV is off"):
        path_b(fns, artifacts[1], 1, 0, gu_interleave=False)


def test_a_tp2_artifact_in_a_tp1_process_is_refused(fns, artifacts):
    with pytest.raises(checks.ArtifactMismatch, match="tp_size"):
        path_b(fns, artifacts[2], 1, 0)


def test_k3_opt_padding_is_refused_by_the_padded_size(fns, artifacts, monkeypatch):
    """SGLANG_AITER_K3_OPT=1 in the serving process pads I to 128: the layer's padded size differs."""
    monkeypatch.setitem(fns, "_aiter_k3_opt", True)
    built = [build(fns, layer_id, 1, 0) for layer_id in LAYERS]
    installer = SglangArtifactInstaller(artifacts[1], True, aiter_gu_interleave=lambda: True)
    installer.check_runtime(LIVE)
    padded = built[0][1].intermediate_size_per_partition
    if padded % 256 == 0:
        pytest.fail(f"the example's intermediate size pads to {padded} either way; this case cannot show K3_OPT")
    with pytest.raises(checks.ArtifactMismatch, match="intermediate_size_padded"):
        installer.prepare([(p, layer, aiter_layer(p, m, layer)) for p, m, layer in built])


def test_a_vllm_aiter_artifact_is_refused_by_the_runtime_row(fns, tmp_path):
    vllm = harness.convert(harness.EXAMPLE, tmp_path / "vllm", "--profile", "mi355x-aiter", "--runtime", "vllm==0.33.0")
    installer = SglangArtifactInstaller(vllm, True)
    with pytest.raises(checks.ArtifactMismatch, match="runtime_revision"):
        installer.check_runtime(LIVE)
