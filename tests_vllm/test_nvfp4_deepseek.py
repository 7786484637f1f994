"""NVFP4 DeepSeek-V3 through the plugin: the ModelOpt and the compressed-tensors DeepSeek-V3 examples
(examples/tiny-nvfp4-*-deepseek: 1 dense + 2 MoE layers, 4 routed experts, one NVFP4 shared expert,
hidden 128, moe_intermediate 96), in vLLM 0.33.0's own `DeepseekV2MoE` blocks (router with
`e_score_correction_bias`, NVFP4 shared experts, routed experts) loaded by vLLM's own
`DeepseekV2Model.load_weights`, and the whole `DeepseekV3ForCausalLM` through the model loaders.

These sizes make vLLM pad: TRT-LLM pads hidden 128 -> 256 and the intermediate size 96 -> 128
(TP=2: 48 -> 64), CuteDSL the same, Marlin the intermediate size 96 -> 128 (TP=2: 48 -> 64). Path A
(vLLM's loading and `process_weights_after_loading` of the checkpoint) and path B (the artifact through
the plugin) leave identical state, `moe_config`'s padded sizes included (asserted as well, so a
padding that both paths skipped would show). The other three backends (FlashInfer CUTLASS,
VLLM_CUTLASS, CuteDSL batched) cannot run these sizes: vLLM's conversion raises (it does not pad the
gated intermediate size for them, 2 x 96 is not a multiple of 128) and mxconvert refuses to convert
(exit 2): both are asserted. Stand-ins: harness.py and harness_nvfp4.py docstrings (DeepSeek adds
vLLM's emulation kernel as the CPU entry of the NVFP4 linear-kernel table and a placeholder for the
CUDA op `_C.silu_and_mul`, both for the shared experts, the same in both paths).
"""

from __future__ import annotations

import harness as H
import harness_nvfp4 as N
import pytest

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

PADDING = ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "MARLIN")
NOT_PADDED_GATED = ("FLASHINFER_CUTLASS", "VLLM_CUTLASS", "FLASHINFER_CUTEDSL_BATCHED")
#: (hidden_dim, intermediate_size_per_partition, hidden_dim_unpadded) vLLM leaves in moe_config
EXPECTED_PADDED = {
    ("FLASHINFER_TRTLLM", 1): (256, 128, 128),
    ("FLASHINFER_TRTLLM", 2): (256, 64, 128),
    ("FLASHINFER_CUTEDSL", 1): (256, 128, 128),
    ("FLASHINFER_CUTEDSL", 2): (256, 64, 128),
    ("MARLIN", 1): (128, 96, 128),
    ("MARLIN", 2): (128, 48, 128),  # Marlin pads its tensors only
}
CASES = [("ct-deepseek", b, p) for b in PADDING for p in N.PARALLEL] + [
    ("modelopt-deepseek", b, p) for b in PADDING for p in ("tp1", "tp2-rank0")
]


@pytest.mark.parametrize("checkpoint, backend, parallel", CASES)
def test_deepseek_blocks_plugin_equals_vllm(artifacts, checkpoint, backend, parallel):
    target = N.target(checkpoint, backend, parallel)
    model_a = N.path_a(target)
    model_b, installer = N.path_b(target, N.artifact_for(artifacts, target))
    expected = [EXPECTED_PADDED[(backend, target.tp)]] * N.NUM_LAYERS
    assert N.padded_sizes(model_a) == expected == N.padded_sizes(model_b)
    shared = [m for name, m in model_b.named_modules() if name.endswith("shared_experts.gate_up_proj")]
    assert len(shared) == N.NUM_LAYERS and all(m.weight.detach().any() for m in shared)  # loaded from shared/
    N.assert_same_state(target, model_a, model_b, installer)


@pytest.mark.parametrize("backend", NOT_PADDED_GATED)
def test_deepseek_sizes_vllm_cannot_run_are_refused_by_mxconvert_too(artifacts, tmp_path, backend):
    from typer.testing import CliRunner

    from mxconvert.cli.main import app

    target = N.target("modelopt-deepseek", backend, "tp1")
    with pytest.raises(NotImplementedError, match="Intermediate size padding"):
        N.path_a(target)
    profile, args, _ = N.BACKENDS[backend]
    done = CliRunner().invoke(
        app, ["convert", str(target.path), "--profile", profile, *args, "-o", str(tmp_path / "out")]
    )
    assert done.exit_code == 2, done.output
    assert "192" in done.output and "128" in done.output  # 2 x 96 rows, not a multiple of 128
    assert not (tmp_path / "out").exists()


def load_model(model_path, load_format: str, target: N.Target):
    """vLLM's model loader (`auto` or `mxconvert`) building the whole model, stand-ins as the blocks."""
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
        N.nvfp4_linear_kernels_on_cpu(),
        set_current_vllm_config(config),
    ):
        import vllm.distributed.parallel_state as ps

        ps._PP.is_first_rank = ps._PP.is_last_rank = True  # one pipeline stage (DeepseekV2Model asks)
        return loader.load_model(config, config.model_config), loader


def tensors(model) -> dict:
    out = {f"param {k}": H.tensor_facts(v) for k, v in model.named_parameters(remove_duplicate=False)}
    out |= {f"buffer {k}": H.tensor_facts(v) for k, v in model.named_buffers(remove_duplicate=False)}
    return out


@pytest.mark.parametrize(
    "checkpoint, backend", [("modelopt-deepseek", "FLASHINFER_TRTLLM"), ("ct-deepseek", "FLASHINFER_CUTEDSL")]
)
def test_whole_deepseek_v3_through_the_load_format_equals_the_default_loader(artifacts, checkpoint, backend):
    """The whole `DeepseekV3ForCausalLM` (MLA attention, the dense first layer, NVFP4 shared and routed
    experts, router, norms, lm_head): `--load-format mxconvert` on the artifact versus vLLM's default
    loader on the checkpoint (TP=1; the tiny example's attention heads do not split over the stood-in
    TP=2 groups of one process). Compressed-tensors' four leftover global scales per MoE layer are the
    one allowed difference."""
    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    target = N.target(checkpoint, backend, "tp1")
    model_a, _ = load_model(target.path, "auto", target)
    model_b, loader = load_model(N.artifact_for(artifacts, target), "mxconvert", target)
    assert isinstance(loader, MxconvertModelLoader) and len(loader.installer.sources) == N.NUM_LAYERS
    for layer_a, layer_b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        for name in N.CT_LEFTOVER_SCALES if target.is_ct else ():
            assert bool((getattr(layer_a, name) != 0).all()) and not getattr(layer_b, name).any()
            getattr(layer_a, name).data.zero_()
    ta, tb = tensors(model_a), tensors(model_b)
    assert ta.keys() == tb.keys() and len(ta) > 40
    assert [k for k in ta if ta[k] != tb[k]] == []
    for a, b in zip(N.routed_experts(model_a), N.routed_experts(model_b)):
        sa, sb = H.module_snapshot(a), H.module_snapshot(b)
        assert sa == sb, H.first_difference(sa, sb)
