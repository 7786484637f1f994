"""The plugin in every vLLM release it serves for GPT-OSS MXFP4, for every other MXFP4 backend the release's
row writes and the CPU can stand in, and with expert parallelism: path A = path B in each release's thin venv
(test_release_rows.py proves TRITON (Hopper) and MARLIN at TP 1 and 2 there; tools/vllm_releases/plugin_check.py
runs both modules and records them in tests/golden/plugin/).

Path A (the installed release's own GPT-OSS weight loading and `process_weights_after_loading` of the example
checkpoint) and path B (the plugin loading `mxconvert convert --runtime vllm==X.Y.Z`) leave the release's MoE
blocks in identical state (harness.state), at TP 1 and TP 2 (rank 1), for (as test_equivalence.py and
test_sm90.py run them in 0.33.0):
  * TRITON on Blackwell (SM100 opt flags) and TRITON_UNFUSED on Hopper;
  * FLASHINFER_TRTLLM_MXFP4_BF16 / _MXFP8 and FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM100);
  * FLASHINFER_CUTLASS_MXFP4_BF16 (SM90), where the CPU can run or replay the release's weight interleave;
  * MARLIN on Ampere and with fp8 activations (`--marlin-input-dtype fp8`, SM89), and BATCHED_MARLIN;
  * on harness_rocm.py's stand-in ROCm device, where the release's own oracle picks them: AITER_MXFP4_BF16 (CK,
    gfx950) and AITER_TRITON_MXFP4_BF16 (gfx942) with VLLM_ROCM_USE_AITER=1, and OAI TRITON (gfx950, gfx942) without;
and EP 2 (`--tensor-parallel-size 2 --enable-expert-parallel`, the `--ep 2` artifact) for TRITON (Hopper) and
MARLIN, both ranks.

Stand-ins, beyond harness_rows.py's (process groups, CUDA capability, the oracle's pick, Marlin's repack):
  * FlashInfer's CUDA-only 128x4 scale swizzle -> FlashInfer 0.7.2.post1's pure-torch `_swizzle_sf_128x4`
    (harness_rows.flashinfer_ops);
  * FLASHINFER_CUTLASS_MXFP4_BF16 in rows whose `cutlass_sm90_layout` is "sm90-mixed-gemm" (0.29.0-0.32.0):
    FlashInfer's CUDA-only `interleave_moe_weights_for_sm90_mixed_gemm` -> the replay of FlashInfer
    0.7.2.post1's GPU outputs for exactly these inputs (harness_sm90.py; the row lays out those bytes,
    tests/golden/tensors/); in rows with "sm90-interleave-0.6" (0.22.0-0.28.0, FlashInfer 0.6.11.post2-
    0.6.16.post3, one kernel source): the kernel's transcription, each output held to the sha256 FlashInfer
    0.6.14's kernel gave on a GPU for exactly that input (harness_sm90 "transcribe",
    tests_vllm/data/sm90_interleave_0_6/); rows with "sm90-scale-interleave" (0.19.0-0.21.0) need none
    (vLLM's own torch scale interleave, weights unchanged);
  * BATCHED_MARLIN: the batched deployment (harness.batched_deployment).
Not run, each with its reason in the skip: AITER_TRITON_MXFP4_BF16 before 0.30.0 (vLLM has none; the row
does not write it).
"""

from __future__ import annotations

import contextlib

import harness as H
import harness_rocm as ROCM
import harness_rows as R
import harness_sm90 as S
import pytest
import torch

from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import release_key

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = tuple(
    sorted({r for formats in PLUGIN_PROVEN.values() for r in formats.get("mxfp4", ())}, key=release_key)
)

#: name -> (backend the release runs, profile, extra `mxconvert convert` arguments, capability)
BACKENDS = {
    "TRITON-blackwell": ("TRITON", "b200", ("--backend", "triton"), (10, 0)),
    "TRITON_UNFUSED-hopper": ("TRITON_UNFUSED", "h100", ("--backend", "triton_unfused"), (9, 0)),
    "TRTLLM_BF16": ("FLASHINFER_TRTLLM_MXFP4_BF16", "b200", (), (10, 0)),
    "TRTLLM_MXFP8": ("FLASHINFER_TRTLLM_MXFP4_MXFP8", "b200", ("--backend", "flashinfer_trtllm_afp8"), (10, 0)),
    "CUTLASS_MXFP8": ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "b200", ("--backend", "flashinfer_cutlass_afp8"), (10, 0)),
    "CUTLASS_BF16-hopper": ("FLASHINFER_CUTLASS_MXFP4_BF16", "h100", ("--backend", "flashinfer_cutlass"), (9, 0)),
    "MARLIN-ampere": ("MARLIN", "a100", (), (8, 0)),
    "MARLIN-fp8": ("MARLIN", "l40s", ("--marlin-input-dtype", "fp8"), (8, 9)),
    "BATCHED_MARLIN": ("BATCHED_MARLIN", "a100", ("--batched",), (8, 0)),
}
#: The live worker's environment for a case (vLLM reads VLLM_MARLIN_INPUT_DTYPE at load time).
ENV = {"MARLIN-fp8": {"VLLM_MARLIN_INPUT_DTYPE": "fp8"}}
PARALLEL = {"tp1": (1, 0), "tp2-rank1": (2, 1)}
#: EP 2 for the main backends: name -> (backend, profile, capability)
EP_BACKENDS = {"TRITON-hopper": ("TRITON", "h100", (9, 0)), "MARLIN": ("MARLIN", "a100", (8, 0))}
#: The ROCm backends on harness_rocm.py's stand-in device: name -> (backend, gfx, VLLM_ROCM_USE_AITER, profile).
#: The AITER ones with AITER on; OAI TRITON with it off (gfx950: CDNA4 scale swizzle, gfx942: StridedLayout).
ROCM_BACKENDS = {
    "AITER_MXFP4_BF16-gfx950": ("AITER_MXFP4_BF16", "gfx950", True, "mi355x-aiter"),
    "AITER_TRITON_MXFP4_BF16-gfx942": ("AITER_TRITON_MXFP4_BF16", "gfx942", True, "mi300x-aiter"),
    "TRITON-gfx950": ("TRITON", "gfx950", False, "mi355x"),
    "TRITON-gfx942": ("TRITON", "gfx942", False, "mi300x"),
}


def live_row():
    from mxconvert.runtimes.vllm.adapters import serving_row

    row = serving_row(R.RELEASE or "", "mxfp4")
    assert row is not None, f"the plugin does not serve vLLM {R.RELEASE}"
    return row


def sm90_stand_in():
    """The stand-in FLASHINFER_CUTLASS_MXFP4_BF16's conversion needs in this release (None: none)."""
    layout = live_row().cutlass_sm90_layout
    if layout == "sm90-mixed-gemm":
        return S.Sm90Interleave("replay", S.recorded_results())
    if layout == "sm90-interleave-0.6":
        return S.Sm90Interleave("transcribe", digests=S.recorded_digests_0_6())
    if layout == "sm90-scale-interleave":
        return None
    raise AssertionError(f"vLLM {R.RELEASE} ({live_row().name}): no SM90 stand-in for `cutlass_sm90_layout` {layout!r}")


def moe_backend_name(backend: str) -> str | None:
    """The `--moe-backend` name that reaches `backend` in the live row's selection (None: only its automatic pick)."""
    from mxconvert.selection.vocabulary import moe_backend_name_for

    return moe_backend_name_for(backend, "mxfp4", live_row().selection)


def artifact(artifacts, profile: str, args: tuple[str, ...], tp: int):
    return artifacts.in_process(H.EXAMPLE, profile, *args, *R.runtime_args()) / f"{profile}-tp{tp}"


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", BACKENDS)
def test_plugin_leaves_the_state_the_release_leaves(artifacts, name, parallel, monkeypatch):
    backend, profile, args, cap = BACKENDS[name]
    for key, value in ENV.get(name, {}).items():
        monkeypatch.setenv(key, value)
    stand_in = sm90_stand_in() if backend == "FLASHINFER_CUTLASS_MXFP4_BF16" else None
    if backend == "TRITON_UNFUSED" and not moe_backend_name(backend):
        pytest.skip(
            f"vLLM {R.RELEASE} ({live_row().name}) picks TRITON_UNFUSED only for a LoRA worker (no --moe-backend "
            "name reaches it; `select_mxfp4_moe_backend`'s LoRA branch); the LoRA worker is not stood in here"
        )
    tp, rank = PARALLEL[parallel]
    art = artifact(artifacts, profile, args, tp)
    target = H.Target(backend, cap, tp, rank)
    sm90 = S.sm90_interleave(stand_in) if stand_in is not None else contextlib.nullcontext()
    H.reset_opt_flags()
    with R.flashinfer_ops(), sm90:
        model_a = R.path_a(target)
    ops_a = R.set_aside_custom_op_counts(model_a)
    state_a = H.state(model_a)
    H.reset_opt_flags()
    with R.flashinfer_ops():
        model_b, installer = R.path_b(target, art)
    ops_b = R.set_aside_custom_op_counts(model_b)
    state_b = H.state(model_b)
    # path B builds no custom op the release's own path does not (the bypassed conversion may build more)
    assert not ops_b["enabled"] - ops_a["enabled"] and not ops_b["disabled"] - ops_a["disabled"]
    assert installer.target["runtime_revision"] == live_row().name and installer.target["backend"] == backend
    assert installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)
    if stand_in is not None:  # the replay really stood in (a recorded output per weight and layer)
        assert len(stand_in.used) == 2 * H.NUM_LAYERS
    w13 = R.routed_experts(model_b)[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()


@pytest.mark.parametrize("rank", (0, 1))
@pytest.mark.parametrize("name", EP_BACKENDS)
def test_expert_parallel_loads_the_state_the_release_loads(artifacts, name, rank):
    """EP 2 at TP 2: each rank's MoE blocks (its experts, the expert map) as the release leaves them."""
    backend, profile, cap = EP_BACKENDS[name]
    art = artifacts.in_process(H.EXAMPLE, profile, "--ep", "2", *R.runtime_args(), tps=())  # one target: OUT
    target = H.Target(backend, cap, 2, rank)
    H.reset_opt_flags()
    state_a = H.state(R.ep_path_a(target))
    H.reset_opt_flags()
    model_b, installer = R.ep_path_b(target, art)
    state_b = H.state(model_b)
    assert installer.target["ep_size"] == 2 and installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("name", ROCM_BACKENDS)
def test_rocm_backend_leaves_the_state_the_release_leaves(artifacts, name, parallel):
    """A ROCm backend on the stand-in device (harness_rocm.py, as test_rocm.py for 0.33.0): the release's own
    oracle picks the artifact's backend (VLLM_ROCM_USE_AITER as the profile sets it), and path A = path B."""
    backend, gfx, aiter, profile = ROCM_BACKENDS[name]
    if moe_backend_name(backend) is None:
        pytest.skip(
            f"vLLM {R.RELEASE} ({live_row().name}) has no {backend} (no --moe-backend name reaches it, its oracle "
            "never picks it; vLLM adds it in 0.30.0): the row does not write it"
        )
    tp, rank = PARALLEL[parallel]
    target = ROCM.RocmTarget(backend, gfx, aiter, tp, rank)
    art = artifact(artifacts, profile, (), tp)
    H.reset_opt_flags()
    model_a = ROCM.path_a(target)
    ops_a = R.set_aside_custom_op_counts(model_a)
    state_a = H.state(model_a)
    H.reset_opt_flags()
    model_b, installer = ROCM.path_b(target, art)
    ops_b = R.set_aside_custom_op_counts(model_b)
    state_b = H.state(model_b)
    assert not ops_b["enabled"] - ops_a["enabled"] and not ops_b["disabled"] - ops_a["disabled"]
    assert installer.target["runtime_revision"] == live_row().name and installer.target["backend"] == backend
    assert installer.sources and not installer.reconverted
    assert state_a == state_b, H.first_difference(state_a, state_b)
    assert ROCM.picked_backends(model_b) == {backend}
    w13 = R.routed_experts(model_b)[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()
