"""Path A = path B for the SGLang loader under expert parallelism (`--tp-size 2 --ep-size 2`: MoE TP 1,
MoE EP 2), on CPU, both ranks and every layer of examples/tiny-gpt-oss, for the MXFP4 backends SGLang
0.5.23 runs with ep_size > 1 (docs/sglang.md, "Expert parallelism"): FLASHINFER_TRTLLM_MXFP4_MXFP8
(profile b200), MARLIN (profile h100, `--backend marlin`) and FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM120,
profile rtx-pro-6000; SM90's is not compared: its weight-interleave stand-in replays GPU outputs
recorded for the TP inputs only).

* path A: SGLang's own `create_weights` for the rank's E / ep local experts, its
  `_load_mxfp4_experts_weights` of the checkpoint (which picks the rank's experts by `moe_ep_rank`,
  models/gpt_oss.py:1009) and `process_weights_after_loading` (harness.py; the MARLIN functions from
  tools/golden/sglang_mxfp4_marlin.py, as test_marlin.py);
* path B: the same `create_weights`, then the installer on the artifact `convert --runtime
  sglang==0.5.23 --ep 2` wrote.

Also: an EP artifact in a TP process and a TP artifact in an EP process are refused (ep_size named,
the convert command carries the process's sizes). Planted bugs (rank 1 handed rank 0's experts; the
experts placed in another order) fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import harness
import pytest
import torch

from mxconvert.runtimes.sglang import checks, installer
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

flashinfer = pytest.importorskip("flashinfer")
import sglang_mxfp4_cutlass as golden_cutlass  # noqa: E402 - tools/golden, put on sys.path by harness
import sglang_mxfp4_marlin as golden_marlin  # noqa: E402

LAYERS = range(harness.config()["num_hidden_layers"])
EXPERTS = harness.config()["num_local_experts"]
EP = 2
B200 = LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__)
H100 = LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__)
RTX_PRO_6000 = LiveSglang("0.5.23", "cuda", [12, 0], flashinfer.__version__)


@pytest.fixture(scope="module")
def code() -> harness.SglangCode:
    return harness.SglangCode()


@pytest.fixture(scope="module")
def marlin_fns() -> dict:
    compiled = golden_marlin.functions(harness.read_installed)
    example = golden_marlin.example
    compiled["_load_mxfp4_experts_weights"] = example.expert_loader(harness.read_installed, example.loader_namespace())
    return compiled


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sglang-ep")
    sglang = ("--runtime", "sglang==0.5.23")
    return {
        "trtllm-ep2": harness.convert(harness.EXAMPLE, root / "trtllm-ep2", "--profile", "b200", *sglang, "--ep", "2"),
        "trtllm-tp2": harness.convert(harness.EXAMPLE, root / "trtllm-tp2", "--profile", "b200", *sglang, "--tp", "2"),
        "marlin-ep2": harness.convert(
            harness.EXAMPLE, root / "marlin-ep2", "--profile", "h100", *sglang, "--backend", "marlin", "--ep", "2"
        ),
        "cutlass-sm120-ep2": harness.convert(
            harness.EXAMPLE, root / "cutlass-sm120-ep2", "--profile", "rtx-pro-6000", *sglang, "--ep", "2"
        ),
    }


# ---- TRT-LLM --------------------------------------------------------------------------------------


def trtllm_a(code: harness.SglangCode, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        built = harness.build_layer(code, layer_id, 1, rank, ep=EP)
        harness.load_checkpoint(code, built)
        built.method.process_weights_after_loading(built.layer)
        states[built.prefix] = harness.layer_state(built.layer)
    return states


def trtllm_b(code: harness.SglangCode, art: Path, rank: int, ep: int = EP, tp: int = 1) -> dict[str, dict]:
    inst = SglangArtifactInstaller(art)
    inst.check_runtime(B200)
    built = [harness.build_layer(code, layer_id, tp, rank, ep=ep) for layer_id in LAYERS]
    inst.prepare([(b.prefix, b.layer, sglang_layer(b.prefix, b.method, b.layer)) for b in built])
    for b in built:
        inst.postprocess(b.layer, b.method)
    return {b.prefix: harness.layer_state(b.layer) for b in built}


@pytest.mark.parametrize("rank", range(EP))
def test_trtllm_path_a_equals_path_b(code, artifacts, rank):
    a = trtllm_a(code, rank)
    assert harness.all_differences(a, trtllm_b(code, artifacts["trtllm-ep2"], rank)) == []
    # the rank's local experts only: E / ep of every per-expert tensor and per-expert scalar
    for state in a.values():
        assert state["w13_weight"][3][0] == state["gemm1_alpha"][3][0] == EXPERTS // EP


# ---- MARLIN ---------------------------------------------------------------------------------------


def marlin_layer(fns: dict, layer_id: int, rank: int):
    cfg = harness.config()
    method, layer = golden_marlin.new_layer(fns, EXPERTS // EP, cfg["hidden_size"], cfg["intermediate_size"])
    harness.expert_parallel(layer, EXPERTS, EP, rank)
    layer.num_fused_shared_experts = 0
    return f"model.layers.{layer_id}.mlp.experts", method, layer


def marlin_state(layer: torch.nn.Module) -> dict[str, object]:
    out = harness.layer_state(layer)
    out.pop("_situ_routing_bias_bf16")  # a TRT-LLM attribute: unset on both paths
    workspace: torch.Tensor = getattr(layer, "workspace")  # noqa: B009 - a plain tensor attribute SGLang sets
    out["workspace"] = (str(workspace.dtype), tuple(workspace.shape), workspace.numpy().tobytes())
    out["_mxfp4_backend"] = ("attribute", getattr(layer, "_mxfp4_backend", "<unset>"))
    return out


@pytest.mark.parametrize("rank", range(EP))
def test_marlin_path_a_equals_path_b(marlin_fns, artifacts, rank):
    a: dict[str, dict] = {}
    for layer_id in LAYERS:
        prefix, method, layer = marlin_layer(marlin_fns, layer_id, rank)
        golden_marlin.example.load_example_layer(
            marlin_fns["_load_mxfp4_experts_weights"], layer, layer_id, harness.config()
        )
        golden_marlin.post_process(marlin_fns, method, layer)
        a[prefix] = marlin_state(layer)
    inst = SglangArtifactInstaller(artifacts["marlin-ep2"], True, golden_marlin.marlin_make_workspace)
    inst.check_runtime(H100)
    built = [marlin_layer(marlin_fns, layer_id, rank) for layer_id in LAYERS]
    inst.prepare([(p, layer, sglang_layer(p, m, layer)) for p, m, layer in built])
    for _prefix, method, layer in built:
        inst.postprocess(layer, method)
    b = {prefix: marlin_state(layer) for prefix, _method, layer in built}
    assert harness.all_differences(a, b) == []
    assert all(state["w13_weight"][3][0] == EXPERTS // EP for state in a.values())


# ---- FLASHINFER_CUTLASS, SM120 (SM90's weight interleave stand-in replays recorded GPU outputs of the
# TP inputs only, so its EP install is not compared here) ---------------------------------------------


def cutlass_layer(fns: dict, layer_id: int, rank: int):
    cfg = harness.config()
    method, layer = golden_cutlass.build_layer(
        fns, "cutlass_sm120", EXPERTS // EP, cfg["hidden_size"], cfg["intermediate_size"], 1, 0
    )
    harness.expert_parallel(layer, EXPERTS, EP, rank)
    return f"model.layers.{layer_id}.mlp.experts", method, layer


def cutlass_state(layer: torch.nn.Module) -> dict[str, object]:
    out = harness.layer_state(layer)
    out.pop("_situ_routing_bias_bf16")  # a TRT-LLM attribute: unset on both paths
    out["_mxfp4_backend"] = ("attribute", getattr(layer, "_mxfp4_backend", "<unset>"))
    return out


@pytest.mark.parametrize("rank", range(EP))
def test_cutlass_sm120_path_a_equals_path_b(artifacts, rank):
    fns = golden_cutlass.compile_cutlass(
        harness.read_installed, golden_cutlass.cutlass_namespace("cutlass_sm120", golden_cutlass.no_sm90_interleave)
    )
    a: dict[str, dict] = {}
    for layer_id in LAYERS:
        prefix, method, layer = cutlass_layer(fns, layer_id, rank)
        golden_cutlass.golden_example.load_example_layer(
            fns["_load_mxfp4_experts_weights"], layer, layer_id, harness.config()
        )
        golden_cutlass.post_process(fns, method, layer)
        a[prefix] = cutlass_state(layer)
    inst = SglangArtifactInstaller(artifacts["cutlass-sm120-ep2"], True)
    inst.check_runtime(RTX_PRO_6000)
    built = [cutlass_layer(fns, layer_id, rank) for layer_id in LAYERS]
    inst.prepare([(p, layer, sglang_layer(p, m, layer)) for p, m, layer in built])
    for _prefix, method, layer in built:
        inst.postprocess(layer, method)
    b = {prefix: cutlass_state(layer) for prefix, _method, layer in built}
    assert harness.all_differences(a, b) == []
    assert all(state["swiglu_alpha"][3] == (EXPERTS // EP,) for state in a.values())


# ---- refusals: EP artifact in a TP process, and the other way -----------------------------------


def test_an_ep_artifact_in_a_tp_process_is_refused(code, artifacts):
    with pytest.raises(checks.ArtifactMismatch) as err:
        trtllm_b(code, artifacts["trtllm-ep2"], 1, ep=1, tp=2)
    fields = {m.field: m for m in err.value.mismatches}
    assert (fields["ep_size"].artifact, fields["ep_size"].live) == (2, 1)
    assert (fields["tp_size"].artifact, fields["tp_size"].live) == (1, 2)
    assert "--tp 2" in str(err.value) and "--ep" not in str(err.value).split("make a matching artifact:")[1]


def test_a_tp_artifact_in_an_ep_process_is_refused(code, artifacts):
    with pytest.raises(checks.ArtifactMismatch) as err:
        trtllm_b(code, artifacts["trtllm-tp2"], 1)
    fields = {m.field: m for m in err.value.mismatches}
    assert (fields["ep_size"].artifact, fields["ep_size"].live) == (1, 2)
    assert "--ep 2" in str(err.value)


# ---- planted bugs ---------------------------------------------------------------------------------


def test_planted_rank_one_given_rank_zeros_experts_is_seen(code, artifacts, monkeypatch):
    """The installer reads rank 0's files for the EP rank-1 process: the checks pass (same sizes), the
    states differ in every expert tensor."""
    real = installer.rank_entry
    monkeypatch.setattr(installer, "rank_entry", lambda manifest, rank, root: real(manifest, 0, root))
    found = harness.all_differences(trtllm_a(code, 1), trtllm_b(code, artifacts["trtllm-ep2"], 1))
    assert {line.split(": ")[1] for line in found} >= {"w13_weight", "w2_weight", "w13_weight_bias"}, found


def test_planted_other_expert_placement_is_refused_and_seen(code, artifacts, monkeypatch):
    """A process that placed the experts otherwise (EP rank r holding the experts of rank ep - 1 - r):
    the loader refuses it by the expert ids; with that check planted away, the states differ."""
    other = sglang_layer

    def mirrored(prefix, method, module, *args, **kwargs):
        live = other(prefix, method, module, *args, **kwargs)
        first = (EP - 1 - int(module.moe_ep_rank)) * live.num_experts
        return dataclasses.replace(live, first_expert=first)

    inst = SglangArtifactInstaller(artifacts["trtllm-ep2"])
    inst.check_runtime(B200)
    built = [harness.build_layer(code, layer_id, 1, 0, ep=EP) for layer_id in LAYERS]
    with pytest.raises(checks.ArtifactMismatch, match="experts") as err:
        inst.prepare([(b.prefix, b.layer, mirrored(b.prefix, b.method, b.layer)) for b in built])
    experts = next(m for m in err.value.mismatches if m.field == "experts")
    assert (experts.artifact, experts.live) == ("0..1", "2..3")
    # SGLang's loader placing rank 0's slot with rank 1's experts: path A of that placement != path B
    assert harness.all_differences(trtllm_a(code, 1), trtllm_b(code, artifacts["trtllm-ep2"], 0)) != []
