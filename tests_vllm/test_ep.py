"""Expert parallelism through the plugin (vLLM 0.33.0).

With `--tensor-parallel-size 2 --enable-expert-parallel` vLLM's MoE layers run EP=2: vLLM 0.33.0
fused_moe/config.py `FusedMoEParallelConfig.make` flattens TP x DP (x PCP) into the EP group
(ep_size = TP x DP, ep_rank = the flattened TP rank, the experts' tp_size 1, so they are not
TP-sliced), and fused_moe/expert_map_manager.py `determine_expert_map` gives rank r the experts
`r*E/ep .. (r+1)*E/ep - 1` in the default "linear" placement (`--expert-placement-strategy`
"round_robin" falls back to linear for models without expert groups, such as GPT-OSS and
Qwen3-MoE). GPT-OSS's weight loading slices the same range from `get_ep_group()`.
`mxconvert convert MODEL --ep 2` makes the matching artifact: target tp_size 1, ep_size 2, rank r
holding those experts.

Path A (vLLM's own weight loading of the checkpoint under EP, then its own
`process_weights_after_loading`) and path B (the `--ep 2` artifact through the plugin) leave the MoE
blocks of EP ranks 0 and 1 in identical state (every parameter, buffer -- the expert map among
them -- and attribute, the quant method with its kernel objects and quant config), for MXFP4
(TRITON Hopper, TRTLLM BF16, MARLIN) and NVFP4 (ModelOpt and compressed-tensors; FLASHINFER_TRTLLM,
FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN). Stand-ins: harness.py and harness_nvfp4.py (the TP and EP
process groups of rank r, here both of world size 2; the oracle's pick; the CUDA answers).

Refusals: an EP artifact in a TP-only worker and the reverse, another EP rank, another EP size,
another expert placement, and EPLB, each named with the artifact's and the live value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import harness as H
import harness_nvfp4 as N
import pytest
import torch

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm.checks import (
    EPLB_UNSUPPORTED,
    LiveLayer,
    LiveRuntime,
    expert_ids,
    layer_mismatches,
    rank_mismatch,
)

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

EP = 2
RANKS = (0, 1)
#: MXFP4: case -> (backend vLLM's oracle picks, profile, extra convert args, capability)
MXFP4 = {
    "TRITON-hopper": ("TRITON", "h100", (), (9, 0)),
    "TRTLLM_BF16": ("FLASHINFER_TRTLLM_MXFP4_BF16", "b200", (), (10, 0)),
    "MARLIN": ("MARLIN", "a100", (), (8, 0)),
}
#: NVFP4: backend -> (profile, extra convert args, capability)
NVFP4 = {
    "FLASHINFER_TRTLLM": ("b200", (), (10, 0)),
    "FLASHINFER_CUTLASS": ("b200", ("--backend", "flashinfer_cutlass"), (10, 0)),
    "VLLM_CUTLASS": ("b200", ("--backend", "cutlass"), (10, 0)),
    "MARLIN": ("h100", (), (9, 0)),
}


# ---- the EP worker --------------------------------------------------------------------------------
def parallel_config(tp: int, expert_parallel: bool = True):
    """vLLM's own ParallelConfig of `--tensor-parallel-size tp [--enable-expert-parallel]`, with the
    executor backend vLLM defaults to on a host with `tp` GPUs ("mp"; left to itself, under the CUDA
    stand-in, it would count this machine's GPUs)."""
    from vllm.config import ParallelConfig

    return ParallelConfig(
        tensor_parallel_size=tp, enable_expert_parallel=expert_parallel, distributed_executor_backend="mp"
    )


@contextlib.contextmanager
def worker(config, tp: int, rank: int, oracle, cap):
    """Rank `rank` of a TP=`tp` worker group: vLLM's EP group spans the TP ranks (parallel_state:
    DP x PCP x TP), so both groups are (tp, rank)."""
    from vllm.config import set_current_vllm_config

    with H.process_groups(tp, rank, ep=tp, ep_rank=rank), oracle, H.cuda_device(cap), set_current_vllm_config(config):
        yield


def vllm_config(model_config, tp: int = EP, expert_parallel: bool = True, eplb: bool = False):
    """vLLM's own VllmConfig of the worker. `--enable-eplb` is set after validation (stand-in: vLLM
    validates EPLB on CUDA-alike platforms only, and this config is built on vLLM's CPU platform);
    the MoE layer reads it through `FusedMoEParallelConfig.enable_eplb`."""
    from vllm.config import VllmConfig

    config = VllmConfig(model_config=model_config, parallel_config=parallel_config(tp, expert_parallel))
    config.parallel_config.enable_eplb = eplb
    return config


def mxfp4_config(tp: int = EP, **kwargs):
    from vllm.config import ModelConfig

    return vllm_config(ModelConfig(model=str(H.EXAMPLE)), tp, **kwargs)


def mxfp4_path_a(backend: str, cap, rank: int, config=None):
    """vLLM's GPT-OSS `load_weights` (it slices the EP rank's experts from `get_ep_group()`), then
    its post-processing."""
    from vllm.model_executor.models.gpt_oss import GptOssModel

    config = config or mxfp4_config()
    tp = config.parallel_config.tensor_parallel_size
    with worker(config, tp, rank, H.oracle_picks(backend), cap):
        model = H.build_model(config)
        GptOssModel.load_weights(model, H.checkpoint_weights())
        with H.cuda_only_ops():
            H.run_pwal(model, config, H.Target(backend, cap, tp, rank))
    return model


def mxfp4_path_b(backend: str, cap, rank: int, artifact, config=None, on_mismatch: str = "fail"):
    config = config or mxfp4_config()
    tp = config.parallel_config.tensor_parallel_size

    def post_process(model):
        with H.cuda_only_ops():
            H.run_pwal(model, config, H.Target(backend, cap, tp, rank))

    with worker(config, tp, rank, H.oracle_picks(backend), cap):
        return H.plugin_load_gpt_oss(config, artifact, on_mismatch, post_process)


def nvfp4_config(checkpoint: str, tp: int = EP, **kwargs):
    return vllm_config(N.model_config(checkpoint), tp, **kwargs)


def nvfp4_path_a(checkpoint: str, backend: str, cap, rank: int):
    config = nvfp4_config(checkpoint)
    with worker(config, EP, rank, N.oracle_picks(backend), cap):
        model = N.build_model(config)
        N.load_weights(model, N.checkpoint_weights(checkpoint))
        with H.cuda_only_ops():
            N.run_pwal(model, config, None)
    return model


def nvfp4_path_b(checkpoint: str, backend: str, cap, rank: int, artifact, config=None):
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared
    from mxconvert.runtimes.vllm.loader import live_runtime, moe_layers

    config = config or nvfp4_config(checkpoint)
    tp = config.parallel_config.tensor_parallel_size
    with worker(config, tp, rank, N.oracle_picks(backend), cap):
        installer = ArtifactInstaller(artifact)
        installer.check_runtime(live_runtime())
        model = N.build_model(config)
        installer.prepare(moe_layers(model))
        N.load_weights(model, iter_shared(installer.shared_files()))
        with installer.conversion_bypass(), H.cuda_only_ops():
            N.run_pwal(model, config, None)
    return model, installer


def ep_artifact(artifacts, source, profile: str, *args: str):
    """`mxconvert convert SOURCE --profile PROFILE --ep 2 ARGS` (one target: OUT itself)."""
    return artifacts.in_process(source, profile, "--ep", str(EP), *args, tps=())


def assert_ep_layers(layers, rank: int, num_experts: int):
    """What vLLM decided for EP rank `rank`: EP=2, its half of the experts in the linear placement."""
    per = num_experts // EP
    for layer in layers:
        parallel = layer.moe_config.moe_parallel_config
        assert (parallel.use_ep, parallel.ep_size, parallel.ep_rank, parallel.tp_size) == (True, EP, rank, 1)
        assert layer.local_num_experts == per and layer.expert_placement_strategy == "linear"
        expected = torch.full((num_experts,), -1, dtype=torch.int32)
        expected[rank * per : (rank + 1) * per] = torch.arange(per, dtype=torch.int32)
        assert torch.equal(layer.expert_map, expected)


# ---- path A = path B ------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("name", MXFP4)
def test_mxfp4_ep_plugin_leaves_the_state_vllm_leaves(artifacts, name, rank):
    backend, profile, args, cap = MXFP4[name]
    art = ep_artifact(artifacts, H.EXAMPLE, profile, *args)
    manifest = json.loads((art / "mxconvert.json").read_text())
    assert (manifest["target"]["backend"], manifest["target"]["tp_size"], manifest["target"]["ep_size"]) == (
        backend,
        1,
        EP,
    )
    H.reset_opt_flags()
    model_a = mxfp4_path_a(backend, cap, rank)
    state_a = H.state(model_a)
    H.reset_opt_flags()
    model_b, installer = mxfp4_path_b(backend, cap, rank, art)
    state_b = H.state(model_b)
    assert len(installer.sources) == H.NUM_LAYERS and not installer.reconverted
    layers = H.routed_experts(model_b)
    assert_ep_layers(layers, rank, model_b.config.num_local_experts)
    # the kernel class vLLM would build supports this parallel setup (the oracle is stood in)
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    kernel_cls = oracle.backend_to_kernel_cls(oracle.Mxfp4MoeBackend(backend))[0]
    assert kernel_cls._supports_parallel_config(layers[0].moe_config.moe_parallel_config)
    assert state_a == state_b, H.first_difference(state_a, state_b)
    w13 = layers[0].w13_weight
    data = w13 if isinstance(w13, torch.Tensor) else w13.storage.data
    assert data.contiguous().view(-1).view(torch.uint8).any()


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("backend", NVFP4)
@pytest.mark.parametrize("checkpoint", ["modelopt", "ct"])
def test_nvfp4_ep_plugin_leaves_the_state_vllm_leaves(artifacts, checkpoint, backend, rank):
    profile, args, cap = NVFP4[backend]
    art = ep_artifact(artifacts, N.EXAMPLES[checkpoint], profile, *args)
    model_a = nvfp4_path_a(checkpoint, backend, cap, rank)
    model_b, installer = nvfp4_path_b(checkpoint, backend, cap, rank, art)
    assert len(installer.sources) == N.NUM_LAYERS and not installer.reconverted
    layers_a, layers_b = N.routed_experts(model_a), N.routed_experts(model_b)
    assert_ep_layers(layers_b, rank, layers_b[0].global_num_experts)
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    kernel_cls = oracle.backend_to_kernel_cls(oracle.NvFp4MoeBackend(backend))[0]
    assert kernel_cls._supports_parallel_config(layers_b[0].moe_config.moe_parallel_config)
    for layer_a, layer_b in zip(layers_a, layers_b):
        assert layer_b.w13_weight.detach().view(torch.uint8).any()
        for name in N.CT_LEFTOVER_SCALES if checkpoint == "ct" else ():  # test_nvfp4.py: the one allowed difference
            left_a, left_b = getattr(layer_a, name), getattr(layer_b, name)
            assert (left_a.dtype, left_a.shape, left_a.stride()) == (left_b.dtype, left_b.shape, left_b.stride())
            assert bool((left_a != 0).all()) and not left_b.any()
            left_a.data.zero_()
    state_a, state_b = H.module_snapshot(model_a), H.module_snapshot(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)


def test_mxfp4_ep_reconvert_equals_the_normal_load_of_the_live_backend(artifacts, caplog):
    """`on_mismatch: reconvert` under EP: a TRITON Hopper `--ep 2` artifact in an Ampere (MARLIN) EP
    worker, rank 1, restores that rank's experts through mxconvert's inverses and ends in the state of
    vLLM's normal load."""
    art = ep_artifact(artifacts, H.EXAMPLE, "h100")
    backend, _, _, cap = MXFP4["MARLIN"]
    state_a = H.state(mxfp4_path_a(backend, cap, 1))
    with caplog.at_level("WARNING", logger="mxconvert.runtimes.vllm"):
        model_b, installer = mxfp4_path_b(backend, cap, 1, art, on_mismatch="reconvert")
    assert sorted(installer.reconverted) == [f"model.layers.{i}.mlp.experts" for i in range(H.NUM_LAYERS)]
    assert not installer.sources and "field 'backend'" in caplog.text
    state_b = H.state(model_b)
    assert state_a == state_b, H.first_difference(state_a, state_b)


# ---- refusals -------------------------------------------------------------------------------------
HOPPER = MXFP4["TRITON-hopper"]


def refused_mxfp4(art, rank: int, config, on_mismatch: str = "fail") -> str:
    backend, _, _, cap = HOPPER
    with pytest.raises(MismatchError) as err:
        mxfp4_path_b(backend, cap, rank, art, config=config, on_mismatch=on_mismatch)
    return str(err.value)


def test_ep_artifact_is_refused_by_a_tp_only_worker(artifacts, opened):
    art = ep_artifact(artifacts, H.EXAMPLE, "h100")
    opened.clear()
    for mode in ("fail", "reconvert"):
        message = refused_mxfp4(art, 0, mxfp4_config(EP, expert_parallel=False), mode)
        assert "field 'tp_size': artifact has 1, this layer model.layers.0.mlp.experts has 2" in message
        assert "field 'ep_size': artifact has 2, this layer model.layers.0.mlp.experts has 1" in message
        assert "make a matching artifact: mxconvert convert" in message and "--profile h100" in message
        assert "--tp 2 -o OUT" in message and "--ep" not in message.split("make a matching artifact")[1]
        assert "on_mismatch=reconvert cannot bridge ep_size, experts, tp_size" in message
    assert opened == []


def test_tp_artifact_is_refused_by_an_ep_worker(artifacts, opened):
    art = artifacts.in_process(H.EXAMPLE, "h100", tps=("2",))
    opened.clear()
    message = refused_mxfp4(art, 1, mxfp4_config())
    assert "field 'tp_size': artifact has 2, this layer model.layers.0.mlp.experts has 1" in message
    assert "field 'ep_size': artifact has 1, this layer model.layers.0.mlp.experts has 2" in message
    assert "--profile h100 --runtime vllm-0.33 --backend triton --ep 2 -o OUT" in message
    assert opened == []


def test_other_ep_rank_is_refused(artifacts, opened):
    art = artifacts.in_process(H.EXAMPLE, "h100", "--ep", "2", "--rank", "0", tps=())
    opened.clear()
    message = refused_mxfp4(art, 1, mxfp4_config())
    assert "field 'rank': artifact has [0], this layer model.layers.0.mlp.experts has 1" in message
    assert "--ep 2 -o OUT" in message
    assert opened == []


def test_other_ep_size_is_refused(artifacts, opened):
    art = ep_artifact(artifacts, H.EXAMPLE, "h100")
    opened.clear()
    message = refused_mxfp4(art, 0, mxfp4_config(4))
    assert "field 'ep_size': artifact has 2, this layer model.layers.0.mlp.experts has 4" in message
    # rank 0 of EP=4 holds expert 0 only; the artifact's rank 0 holds experts 0..1
    assert "field 'experts': artifact has '0..1', this layer model.layers.0.mlp.experts has '0..0'" in message
    assert "--ep 4 -o OUT" in message
    assert opened == []


def test_other_expert_placement_is_refused(artifacts, opened, monkeypatch):
    """Round-robin placement (vLLM keeps it for grouped-expert models under DeepEP low-latency; here
    forced, since GPT-OSS has no expert groups): EP rank 0 then holds experts 0 and 2, not 0..1."""
    import vllm.model_executor.layers.fused_moe.expert_map_manager as emm

    monkeypatch.setattr(emm, "determine_expert_placement_strategy", lambda **_: "round_robin")
    art = ep_artifact(artifacts, H.EXAMPLE, "h100")
    opened.clear()
    for mode in ("fail", "reconvert"):
        config = mxfp4_config()
        config.parallel_config.expert_placement_strategy = "round_robin"
        message = refused_mxfp4(art, 0, config, mode)
        assert "field 'experts': artifact has '0..1', this layer model.layers.0.mlp.experts has '[0, 2]'" in message
    assert opened == []


def test_expert_and_eplb_checks_are_pure_data():
    manifest = {"ranks": [{"rank": 1, "plan": {"expert_start": 2, "expert_end": 4}}]}

    def layer(experts):
        return LiveLayer("p", "TRITON", 0, 0, 1, 2, 1, 4, global_experts=experts)

    assert rank_mismatch(manifest, layer((2, 3))) is None
    assert rank_mismatch(manifest, layer(None)) is None
    wrong = rank_mismatch(manifest, layer((3, 2)))
    assert wrong is not None and wrong.line() == "field 'experts': artifact has '2..3', this layer p has '[3, 2]'"
    assert expert_ids((0,)) == "0..0" and expert_ids(()) == "[]"
    target = {
        "format": "mxfp4",
        "backend": "TRITON",
        "tp_size": 1,
        "ep_size": 2,
        "hidden_size_padded": 0,
        "intermediate_size_padded": 0,
    }
    runtime = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.5.1")
    assert layer_mismatches(target, layer((2, 3)), runtime) == []
    eplb = dataclasses.replace(layer((2, 3)), eplb=True)
    assert [m.line() for m in layer_mismatches(target, eplb, runtime)] == [
        "field 'eplb': artifact has False, this layer p has True"
    ]


@pytest.mark.parametrize("checkpoint", ["modelopt", "ct"])
def test_nvfp4_eplb_worker_is_refused(artifacts, opened, checkpoint):
    """EPLB (both NVFP4 methods support it on FLASHINFER_TRTLLM) is refused, saying what it changes."""
    profile, args, cap = NVFP4["FLASHINFER_TRTLLM"]
    art = ep_artifact(artifacts, N.EXAMPLES[checkpoint], profile, *args)
    opened.clear()
    with pytest.raises(MismatchError) as err:
        nvfp4_path_b(checkpoint, "FLASHINFER_TRTLLM", cap, 0, art, config=nvfp4_config(checkpoint, eplb=True))
    message = str(err.value)
    assert "field 'eplb': artifact has False, this layer model.layers.0.mlp.experts has True" in message
    assert EPLB_UNSUPPORTED in message and "make a matching artifact" not in message
    assert opened == []


def test_mxfp4_eplb_is_refused_by_vllm_itself(artifacts, opened):
    """vLLM 0.33.0 has no EPLB for GPT-OSS MXFP4: `GptOssMxfp4MoEMethod.supports_eplb` is False and
    `RoutedExperts` raises while the model is built, before the plugin's layer checks (which refuse
    EPLB for MXFP4 too, test_expert_and_eplb_checks_are_pure_data)."""
    art = ep_artifact(artifacts, H.EXAMPLE, "h100")
    opened.clear()
    with pytest.raises(NotImplementedError, match="EPLB is not supported GptOssMxfp4MoEMethod"):
        mxfp4_path_b("TRITON", (9, 0), 0, art, config=mxfp4_config(eplb=True))
    assert opened == []
