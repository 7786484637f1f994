"""Path A = path B for the SGLang loader's NVFP4 install under expert parallelism (`--tp-size 2 --ep-size 2`:
MoE TP 1, MoE EP 2), on CPU, both ranks and both layers of the NVFP4 examples, for every NVFP4 path SGLang
0.5.23 runs with ep_size > 1 that mxconvert writes (docs/sglang.md, "Expert parallelism"): ModelOpt
FLASHINFER_TRTLLM (b200), FLASHINFER_CUTLASS (b200, `--backend flashinfer_cutlass`) and MARLIN (h100);
compressed-tensors W4A4 TRT-LLM and CUTLASS (b200) and W4A16 Marlin (h100).

* path A: SGLang's own `create_weights` for the rank's E / ep local experts, `FusedMoE.weight_loader`'s
  expert mapping (tools/golden/sglang_nvfp4.py `_expert_id`: ModelOpt's `_sglang_require_global_experts`
  input scales take every global expert, everything else the rank's) and `process_weights_after_loading`;
* path B: the same `create_weights`, then the installer on the artifact `convert --runtime sglang==0.5.23
  --ep 2` wrote.

The examples' input scales differ per expert, and rank 1 holds neither the largest ModelOpt input scale
nor the smallest compressed-tensors one: a maximum over the rank's experts instead of SGLang's global one
(ModelOpt TRT-LLM / CUTLASS) shows on rank 1, as does a global minimum where SGLang takes the rank's (the
compressed-tensors TRT-LLM scheme's local input scales). Planted bugs (ModelOpt's maximum over the rank's
experts; rank 1 handed rank 0's experts) fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import harness
import pytest
import torch

from mxconvert.formats.nvfp4.format import Nvfp4Format
from mxconvert.runtimes.sglang import installer
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

flashinfer = pytest.importorskip("flashinfer")
import ct_paths  # noqa: E402 - tests_sglang helpers
import sglang_nvfp4 as golden  # noqa: E402 - tools/golden, put on sys.path by harness
import test_nvfp4 as modelopt  # noqa: E402 - the TP tests' state of a ModelOpt TRT-LLM / Marlin layer
import test_nvfp4_ct as ct_marlin  # noqa: E402
import test_nvfp4_ct_w4a4 as ct_cutlass  # noqa: E402
import test_nvfp4_ct_w4a4_trtllm as ct_trtllm  # noqa: E402
import test_nvfp4_cutlass as modelopt_cutlass  # noqa: E402

EP = 2
B200 = LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__)
H100 = LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__)
SGLANG = ("--runtime", "sglang==0.5.23", "--ep", str(EP))
EXPERTS, LAYERS = modelopt.EXPERTS, modelopt.LAYERS
#: ModelOpt cases: (SGLang runner, the convert's profile and backend, the process's device, the layer state)
MODELOPT = {
    "trtllm": ("flashinfer_trtllm", ("--profile", "b200"), B200, modelopt.state),
    "cutlass": ("flashinfer_cutlass", ("--profile", "b200", "--backend", "flashinfer_cutlass"), B200,
                modelopt_cutlass.state),
    "marlin": ("marlin", ("--profile", "h100"), H100, modelopt.state),
}  # fmt: skip
#: compressed-tensors cases, as MODELOPT
CT = {
    "ct-trtllm": ("flashinfer_trtllm", ("--profile", "b200", "--backend", "flashinfer_trtllm"), B200, ct_trtllm.state),
    "ct-cutlass": ("flashinfer_cutlass", ("--profile", "b200"), B200, ct_cutlass.state),
    "ct-marlin": ("marlin", ("--profile", "h100"), H100, ct_marlin.state),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-ep")
    out = {
        name: harness.convert(modelopt.EXAMPLE, root / name, *args, *SGLANG)
        for name, (_, args, _, _) in MODELOPT.items()
    }
    return out | {
        name: harness.convert(ct_paths.EXAMPLE, root / name, *args, *SGLANG) for name, (_, args, _, _) in CT.items()
    }


def modelopt_a(code: golden.SglangNvfp4, state, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        method, layer = code.build(EXPERTS, modelopt.HIDDEN, modelopt.INTER, 1, rank, ep=EP)
        code.load(layer, golden.example_experts(modelopt.EXAMPLE, layer_id))
        code.process(method, layer)
        states[modelopt.prefix(layer_id)] = state(layer) | _raw_shapes(layer)
    return states


def modelopt_b(code: golden.SglangNvfp4, state, art: Path, live: LiveSglang, rank: int) -> dict[str, dict]:
    inst = SglangArtifactInstaller(art, True, golden.marlin_tool.marlin_make_workspace, nvfp4_dispatch=lambda: False)
    inst.check_runtime(live)
    built = {modelopt.prefix(i): code.build(EXPERTS, modelopt.HIDDEN, modelopt.INTER, 1, rank, ep=EP) for i in LAYERS}
    inst.prepare([(p, layer, nvfp4_layer(p, method, layer)) for p, (method, layer) in built.items()])
    for method, layer in built.values():
        inst.postprocess(layer, method)
    return {p: state(layer) | _raw_shapes(layer) for p, (_method, layer) in built.items()}


def _raw_shapes(layer: torch.nn.Module) -> dict[str, object]:
    """The shapes of SGLang's raw input scales, which no kernel reads after post-processing but which stay on
    the layer at the size `create_weights` gave them: every global expert's for ModelOpt
    (`_sglang_require_global_experts`), the rank's for compressed-tensors."""
    names = ("w13_input_scale", "w2_input_scale", "w13_input_global_scale", "w2_input_global_scale")
    return {f"{n} shape": ("attribute", tuple(getattr(layer, n).shape)) for n in names if hasattr(layer, n)}


@pytest.mark.parametrize("rank", range(EP))
@pytest.mark.parametrize("case", sorted(MODELOPT))
def test_modelopt_path_a_equals_path_b(artifacts, case, rank):
    runner, _args, live, state = MODELOPT[case]
    code = golden.SglangNvfp4(harness.read_installed, runner)
    a = modelopt_a(code, state, rank)
    assert harness.all_differences(a, modelopt_b(code, state, artifacts[case], live, rank)) == []
    for layer_state in a.values():
        assert layer_state["w13_weight"][3][0] == EXPERTS // EP  # the rank's local experts only
        if case != "marlin":  # ModelOpt's input scales stay every global expert's (modelopt_quant.py:2634-2648)
            assert layer_state["w13_input_scale shape"] == ("attribute", (EXPERTS, 2))


@pytest.mark.parametrize("rank", range(EP))
@pytest.mark.parametrize("case", sorted(CT))
def test_compressed_tensors_path_a_equals_path_b(artifacts, case, rank):
    runner, _args, live, state = CT[case]
    code = golden.SglangNvfp4Ct(harness.read_installed, runner)
    workspace = golden.marlin_tool.marlin_make_workspace if case == "ct-marlin" else None
    a = ct_paths.path_a(code, state, 1, rank, ep=EP)
    assert (
        harness.all_differences(a, ct_paths.path_b(code, state, live, artifacts[case], 1, rank, True, workspace, ep=EP))
        == []
    )
    assert all(layer_state["w13_weight"][3][0] == EXPERTS // EP for layer_state in a.values())


def test_the_example_tells_a_global_reduction_from_a_local_one():
    """In every MoE layer, for w13's and w2's input scales, one EP rank holds neither ModelOpt's largest input
    scale nor compressed-tensors' smallest stored one, so the comparisons of both ranks above see a reduction
    over the wrong experts (rank 1 does for w13 of both layers: the planted test below)."""
    local = EXPERTS // EP
    for layer_id in LAYERS:
        for folder, kind, reduce in (
            (modelopt.EXAMPLE, "input_scale", max),
            (ct_paths.EXAMPLE, "input_global_scale", min),
        ):
            experts = golden.example_experts(folder, layer_id)
            for proj in ("gate_proj", "down_proj"):
                values = [float(experts[e][proj][kind]) for e in range(EXPERTS)]
                ranks = [reduce(values[r * local : (r + 1) * local]) for r in range(EP)]
                assert any(value != reduce(values) for value in ranks), (folder.name, layer_id, proj)
            gate = [float(experts[e]["gate_proj"][kind]) for e in range(EXPERTS)]
            assert reduce(gate[local:]) != reduce(gate), (folder.name, layer_id)


# ---- planted bugs ---------------------------------------------------------------------------------


def test_planted_maximum_over_the_ranks_experts_is_seen(tmp_path, monkeypatch):
    """A convert whose ModelOpt input scales hold the rank's experts only (the maximum over the rank's experts,
    not SGLang's over every global expert): rank 1's TRT-LLM scalars differ, and only those."""
    real = Nvfp4Format.geometry

    def local_rows(self, *args, **kwargs):
        return dataclasses.replace(real(self, *args, **kwargs), global_experts=None)

    monkeypatch.setattr(Nvfp4Format, "geometry", local_rows)
    from mxconvert import convert

    convert(str(modelopt.EXAMPLE), tmp_path / "art", profile="b200", runtime="sglang==0.5.23", ep=EP, jobs=1)
    runner, _args, live, state = MODELOPT["trtllm"]
    code = golden.SglangNvfp4(harness.read_installed, runner)
    found = harness.all_differences(modelopt_a(code, state, 1), modelopt_b(code, state, tmp_path / "art", live, 1))
    assert {line.split(": ")[1] for line in found} == {
        "g1_alphas", "g1_alphas_up", "g2_alphas", "g1_scale_c", "w13_input_scale_quant", "w2_input_scale_quant",
    }, found  # fmt: skip


def test_planted_rank_one_given_rank_zeros_experts_is_seen(artifacts, monkeypatch):
    """The installer reads rank 0's files for the EP rank-1 process: the checks pass (same sizes), the
    expert tensors differ."""
    real = installer.rank_entry
    monkeypatch.setattr(installer, "rank_entry", lambda manifest, rank, root: real(manifest, 0, root))
    runner, _args, live, state = MODELOPT["trtllm"]
    code = golden.SglangNvfp4(harness.read_installed, runner)
    found = harness.all_differences(modelopt_a(code, state, 1), modelopt_b(code, state, artifacts["trtllm"], live, 1))
    assert {line.split(": ")[1] for line in found} >= {"w13_weight", "w2_weight", "g1_alphas"}, found
