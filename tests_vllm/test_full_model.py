"""The whole `GptOssForCausalLM` through vLLM's model loaders: `--load-format mxconvert` on the
artifact (MxconvertModelLoader.load_model: checks, vLLM's create_model, shared tensors through
vLLM's weight iterator and `load_weights`, post-processing with the MoE conversion bypassed) versus
vLLM's default loader on the checkpoint. Every parameter and buffer of the model, and the whole
state of every MoE module, must be identical (TP=1: the tiny example has one KV head, which the
stood-in TP=2 groups cannot split in the attention layers; TP=2 is covered per block in
test_equivalence.py). Stand-ins as in harness.py (process groups, CUDA
device answers, the oracle's backend); `enforce_eager` because vLLM's compilation passes reference
custom ops that a CPU install lacks."""

from __future__ import annotations

import harness as H
import pytest

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)


def load(model_path, load_format: str, target: H.Target):
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_path), enforce_eager=True),
        load_config=LoadConfig(load_format=load_format),
    )
    loader = get_model_loader(config.load_config)
    with (
        H.process_groups(target.tp, target.rank),
        H.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        H.cuda_only_ops(),
        set_current_vllm_config(config),
    ):
        return loader.load_model(config, config.model_config), loader


def tensors(model) -> dict:
    out = {f"param {k}": H.tensor_facts(v) for k, v in model.named_parameters(remove_duplicate=False)}
    out |= {f"buffer {k}": H.tensor_facts(v) for k, v in model.named_buffers(remove_duplicate=False)}
    return out


@pytest.mark.parametrize(
    "name, profile, target",
    [
        ("TRITON-hopper-tp1", "h100", H.Target("TRITON", (9, 0), 1, 0)),
        ("TRTLLM_BF16-tp1", "b200", H.Target("FLASHINFER_TRTLLM_MXFP4_BF16", (10, 0), 1, 0)),
    ],
)
def test_vllm_serve_load_format_mxconvert_equals_the_default_loader(artifacts, name, profile, target):
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    art = artifacts.get(profile, "--tp", str(target.tp))
    H.reset_opt_flags()
    model_a, _ = load(H.EXAMPLE, "auto", target)
    flags_a = H.opt_flags_state()
    H.reset_opt_flags()
    model_b, loader = load(art, "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == H.NUM_LAYERS
    assert H.opt_flags_state() == flags_a
    ta, tb = tensors(model_a), tensors(model_b)
    assert ta.keys() == tb.keys()
    assert [k for k in ta if ta[k] != tb[k]] == []
    experts_a, experts_b = H.routed_experts(model_a), H.routed_experts(model_b)
    for a, b in zip(experts_a, experts_b):
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)


def load_nvfp4(model_path, load_format: str, target):
    """As `load`, with the NVFP4 oracle's choice stood in (harness_nvfp4.oracle_picks)."""
    import harness_nvfp4 as N
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_path), enforce_eager=True),
        load_config=LoadConfig(load_format=load_format),
    )
    loader = get_model_loader(config.load_config)
    with (
        H.process_groups(target.tp, target.rank),
        N.oracle_picks(target.backend),
        H.cuda_device(target.cap),
        H.cuda_only_ops(),
        set_current_vllm_config(config),
    ):
        return loader.load_model(config, config.model_config), loader


@pytest.mark.parametrize(
    "checkpoint, backend, profile, args, cap",
    [
        ("modelopt", "FLASHINFER_TRTLLM", "b200", (), (10, 0)),
        ("ct", "FLASHINFER_CUTLASS", "b200", ("--backend", "flashinfer_cutlass"), (10, 0)),
    ],
)
def test_nvfp4_qwen3_moe_through_the_load_format_equals_the_default_loader(
    artifacts, checkpoint, backend, profile, args, cap
):
    """The whole `Qwen3MoeForCausalLM` (attention, NVFP4 MoE, router, norms, lm_head) of the ModelOpt and
    the compressed-tensors example: `--load-format mxconvert` on the artifact versus vLLM's default loader
    on the checkpoint (TP=1). Compressed-tensors' four checkpoint global-scale parameters per MoE layer are
    the one allowed difference (zero-filled by the plugin, see test_nvfp4.py)."""
    import harness_nvfp4 as N

    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    art = artifacts.nvfp4(checkpoint, profile, *args) / f"{profile}-tp1"
    target = N.Target(checkpoint, backend, cap, 1, 0)
    model_a, _ = load_nvfp4(N.EXAMPLES[checkpoint], "auto", target)
    model_b, loader = load_nvfp4(art, "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == N.NUM_LAYERS
    for layer_a, layer_b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        for name in N.CT_LEFTOVER_SCALES if checkpoint == "ct" else ():
            assert bool((getattr(layer_a, name) != 0).all()) and not getattr(layer_b, name).any()
            getattr(layer_a, name).data.zero_()
    ta, tb = tensors(model_a), tensors(model_b)
    assert ta.keys() == tb.keys()
    assert [k for k in ta if ta[k] != tb[k]] == []
    for a, b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)
