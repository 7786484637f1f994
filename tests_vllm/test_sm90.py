"""FLASHINFER_CUTLASS_MXFP4_BF16 on SM90 (Hopper, `mxconvert convert -p h100 --backend flashinfer_cutlass`):
path A (vLLM 0.33.0's own loading and post-processing of the example checkpoint) and path B (the
plugin loading the artifact) leave vLLM's MoE blocks in identical state, at TP=1 and TP=2 ranks 0/1.

Path A's one CUDA-only call, FlashInfer's SM90 fp4 weight interleave, is replayed from the outputs
FlashInfer's own kernel produced on a GPU for exactly those inputs (harness_sm90.py,
tests_vllm/data/sm90_interleave/); everything else is harness.py's path A and path B.
"""

from __future__ import annotations

import hashlib
import re

import harness as H
import harness_sm90 as S
import pytest
import torch

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)


@pytest.fixture(scope="module")
def replay() -> S.Sm90Interleave:
    return S.Sm90Interleave("replay", S.recorded_results())


@pytest.fixture(scope="module")
def states_a(replay) -> dict[str, tuple]:
    """Path A's state for every parallel case, all through one replaying stand-in."""
    out = {}
    for name, (tp, rank) in S.PARALLEL.items():
        H.reset_opt_flags()
        before = len(replay.used)
        out[name] = H.state(S.path_a(H.Target(S.BACKEND, S.HOPPER, tp, rank), replay))
        # w13 and w2 of each of the example's two MoE layers went through the GPU outputs
        assert len(replay.used) - before == 2 * H.NUM_LAYERS
    return out


@pytest.mark.parametrize("parallel", S.PARALLEL)
def test_plugin_leaves_the_state_vllm_leaves_sm90(artifacts, states_a, parallel):
    tp, rank = S.PARALLEL[parallel]
    art = artifacts.get("h100", "--tp", str(tp), "--backend", "flashinfer_cutlass")
    target = H.Target(S.BACKEND, S.HOPPER, tp, rank)
    H.reset_opt_flags()
    model_b, installer = H.path_b(target, art)
    assert installer.target["backend"] == S.BACKEND
    assert installer.sources and not installer.reconverted
    state_b = H.state(model_b)
    state_a = states_a[parallel]
    assert state_a == state_b, H.first_difference(state_a, state_b)
    method = H.routed_experts(model_b)[0].quant_method
    assert type(method.moe_kernel.fused_experts).__name__ == "FlashInferExperts"
    # the layer holds the interleaved kernel bytes (not the zero-filled checkpoint shape)
    assert H.routed_experts(model_b)[0].w13_weight.view(torch.uint8).any()


def test_replayed_gpu_outputs_cover_exactly_path_a(replay, states_a):
    """Every recorded output was asked for, once; none is left over (the data is path A's, all of it)."""
    assert sorted(replay.used) == sorted(replay.results)


def test_an_input_without_gpu_output_fails_path_a():
    """A key miss is an error naming the input, never a silent fallback: path A with the outputs of
    one parallel case's inputs left out stops at the first such input."""
    results = S.recorded_results()
    kept = {k: v for k, v in results.items() if not k.startswith("sm90w.4x768x")}  # TP=1's w13 inputs
    assert len(kept) < len(results)
    H.reset_opt_flags()
    with pytest.raises(S.MissingGpuResult, match=r"sm90w\.4x768x192\.[0-9a-f]{64}") as missed:
        S.path_a(H.Target(S.BACKEND, S.HOPPER, 1, 0), S.Sm90Interleave("replay", kept))
    assert re.search(r"sm90w\.4x768x192\.[0-9a-f]{64}", missed.value.args[0]).group(0) in results


def test_one_flipped_gpu_byte_makes_path_a_differ(states_a):
    """The comparison sees the interleaved bytes: one flipped bit of one replayed output differs."""
    results = S.recorded_results()
    key = sorted(k for k in results if k.startswith("sm90w.4x384x192."))[0]  # a TP=1 w2 input
    results[key].view(-1)[7] ^= 1
    H.reset_opt_flags()
    flipped = H.state(S.path_a(H.Target(S.BACKEND, S.HOPPER, 1, 0), S.Sm90Interleave("replay", results)))
    assert flipped != states_a["tp1"]
    assert "w2_weight" in H.first_difference(flipped, states_a["tp1"])


def test_gpu_outputs_are_the_ones_the_gpu_report_lists():
    """The committed bytes are what the recorded GPU run wrote, under the input each came from."""
    prov = S.provenance()
    results = S.recorded_results()
    assert prov["flashinfer"] == "0.7.2.post1" and prov["capability"] == [9, 0]
    assert prov["golden_probes_equal"] is True
    rows = {r["key"]: r for r in prov["results"]}
    assert sorted(rows) == sorted(results)
    for key, out in results.items():
        assert key.split(".")[2] == rows[key]["input_sha256"]
        assert hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest() == rows[key]["output_sha256"]
        assert rows[key]["changed"]  # the interleave moved bytes: not an identity stand-in
