"""SGLang 0.5.23's NVFP4 (ModelOpt) FlashInfer TRT-LLM bytes, its pick on a B200, and Marlin bytes, its
pick on an H100, against mxconvert's.

The goldens are SGLang's own `ModelOptNvFp4FusedMoEMethod.create_weights`, `FusedMoE`'s per-expert
loading and `process_weights_after_loading` run on CPU (tools/golden/sglang_nvfp4.py, stand-ins
named there). They show (docs/sglang.md, "NVFP4"):

* the four moved tensors are vLLM 0.33's FlashInfer TRT-LLM NVFP4 layout (layouts/trtllm.py) with the
  sizes SGLang pads to (I to 64, H unpadded: the row's `nvfp4_fi_padding` (1, 64)), bit for bit;
* the kernel scalars are the folded derived tensors: `w13_weight_scale_2` (folded) is SGLang's
  `g1_alphas` and `g1_alphas_up`, `w2_weight_scale_2` its `g2_alphas`, `g1_scale_c` its `g1_scale_c`,
  and the reduced input scales' reciprocals its `w13_input_scale_quant` / `w2_input_scale_quant`;
* Marlin: SGLang's `prepare_moe_nvfp4_layer_for_marlin` is vLLM ~0.15's "plain" NVFP4 Marlin layout
  (layouts/marlin.py; the row's `nvfp4_marlin_scales`): no padding of a gated layer, subnormal block
  scales kept, global scales bf16(w) * 2^119;
* so `convert --runtime sglang==0.5.23` of the ModelOpt example (`--profile b200`, `--profile h100`)
  writes SGLang's own values at TP 1 and 2, and verify accepts it; what would differ is refused.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import ROOT, rewrite_source_tensor, run_cli
from sglang_golden_helpers import GOLDEN, artifact_tensors, digest, read_golden, tensor_bytes

from mxconvert.layouts import nvfp4_layout
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.nvfp4 import select_nvfp4_backend
from mxconvert.selection.report import SelectionRefused
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision

CASES = sorted(GOLDEN.glob("nvfp4-trtllm_sglang-0.5.23_e*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "nvfp4-trtllm_sglang-0.5.23_example_digests.json"
MARLIN_CASES = sorted(GOLDEN.glob("nvfp4-marlin_sglang-0.5.23_e*.safetensors"))
MARLIN_DIGESTS = GOLDEN / "nvfp4-marlin_sglang-0.5.23_example_digests.json"
#: What SGLang's Marlin layer holds that the artifact does (workspace is the device's, made at install).
MARLIN_NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2",
                "w2_weight_scale_2")  # fmt: skip
MODELOPT = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
CT = ROOT / "examples" / "tiny-nvfp4-ct-qwen3"
ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
B = Nvfp4Backend.FLASHINFER_TRTLLM
MOVED = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
#: artifact (derived) tensor -> the SGLang layer parameters that hold its values
SCALARS = {
    "w13_weight_scale_2": ("g1_alphas", "g1_alphas_up"),
    "w2_weight_scale_2": ("g2_alphas",),
    "g1_scale_c": ("g1_scale_c",),
}
#: artifact input scale (one maximum repeated per expert) -> SGLang's reciprocal scalar
RECIPROCALS = {"w13_input_scale": "w13_input_scale_quant", "w2_input_scale": "w2_input_scale_quant"}


def _canonical(golden: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mxconvert's canonical NVFP4 tensors of the golden's checkpoint ([gate; up], gate's global scale)."""
    experts = sorted({int(k.split(".")[1]) for k in golden if k.startswith("in.")})

    def stack(proj: str, kind: str) -> torch.Tensor:
        return torch.stack([golden[f"in.{e}.{proj}.{kind}"] for e in experts])

    return {
        "w13_weight": torch.cat([stack("gate_proj", "weight"), stack("up_proj", "weight")], 1),
        "w13_weight_scale": torch.cat([stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], 1),
        "w2_weight": stack("down_proj", "weight"),
        "w2_weight_scale": stack("down_proj", "weight_scale"),
        "w13_weight_scale_2": stack("gate_proj", "weight_scale_2").float(),
        "w13_input_scale": torch.stack([stack("gate_proj", "input_scale"), stack("up_proj", "input_scale")], 1).float(),
        "w2_weight_scale_2": stack("down_proj", "weight_scale_2").float(),
        "w2_input_scale": stack("down_proj", "input_scale").float(),
    }


def _kernel(canonical: dict[str, torch.Tensor], revision, backend=B) -> dict[str, torch.Tensor]:
    e, k, half_n = canonical["w2_weight"].shape
    layout = nvfp4_layout(backend, revision, k, 2 * half_n, e)
    out = {name: tensor.forward(canonical[name]) for name, tensor in layout.tensors.items()}
    for name, derived in layout.derived.items():
        out[name] = derived.compute(*(canonical[i] for i in derived.inputs))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def test_goldens_cover_a_padded_and_an_unpadded_case():
    names = {p.name for p in CASES}
    assert "nvfp4-trtllm_sglang-0.5.23_e2_h256_i96.safetensors" in names  # I 96 -> 128
    assert "nvfp4-trtllm_sglang-0.5.23_e2_h128_i128.safetensors" in names  # H 128 stays (vLLM pads to 256)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_rows_trtllm_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden), ROW)
    for name in MOVED:
        assert _same(kernel[name], golden[f"out.{name}"]), f"{path.name}: {name} differs from SGLang's bytes"
    for name, sglang_names in SCALARS.items():
        for sglang_name in sglang_names:
            assert _same(kernel[name], golden[f"out.{sglang_name}"]), f"{name} vs SGLang's {sglang_name}"
    for name, sglang_name in RECIPROCALS.items():
        assert _same((1 / kernel[name][0]).reshape(()), golden[f"out.{sglang_name}"]), sglang_name


def test_vllm_033s_padding_is_not_sglangs():
    """vLLM 0.33 pads K to 256: at H 128 its moved tensors are larger than SGLang's; the row's (1, 64) is not."""
    golden = read_golden(GOLDEN / "nvfp4-trtllm_sglang-0.5.23_e2_h128_i128.safetensors")
    vllm = _kernel(_canonical(golden), get_revision("vllm-0.33", "nvfp4"))
    assert all(not _same(vllm[name], golden[f"out.{name}"]) for name in MOVED)
    assert ROW.nvfp4_fi_padding == (1, 64) and get_revision("vllm-0.33", "nvfp4").nvfp4_fi_padding == (256, 64)


def test_unfolded_scales_are_not_the_same_tensors():
    """Unfolded (vLLM ~0.15) the artifact would hold the raw global scales, not SGLang's alphas."""
    golden = read_golden(GOLDEN / "nvfp4-trtllm_sglang-0.5.23_e2_h256_i96.safetensors")
    unfolded = _kernel(_canonical(golden), replace(ROW, nvfp4_fold_global_scales=False))
    assert not _same(unfolded["w13_weight_scale_2"], golden["out.g1_alphas"])
    assert ROW.nvfp4_fold_global_scales is True


def test_marlin_goldens_cover_an_unpadded_i_and_subnormal_scales():
    names = {p.name for p in MARLIN_CASES}
    assert {
        "nvfp4-marlin_sglang-0.5.23_e2_h256_i128.safetensors",
        "nvfp4-marlin_sglang-0.5.23_e1_h128_i192.safetensors",
    } <= names
    golden = read_golden(GOLDEN / "nvfp4-marlin_sglang-0.5.23_e1_h128_i192.safetensors")
    scales = golden["in.0.gate_proj.weight_scale"].view(torch.uint8)
    assert bool((scales < 0x08).any())  # subnormal E4M3 block scales


@pytest.mark.parametrize("path", MARLIN_CASES, ids=lambda p: p.stem)
def test_sglang_marlin_bytes_are_the_rows_plain_marlin_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden), ROW, Nvfp4Backend.MARLIN)
    assert set(kernel) == set(MARLIN_NAMES)
    for name in MARLIN_NAMES:
        assert _same(kernel[name], golden[f"out.{name}"]), f"{path.name}: {name} differs from SGLang's bytes"


def test_vllm_033s_rescaled_marlin_scales_are_not_sglangs():
    golden = read_golden(GOLDEN / "nvfp4-marlin_sglang-0.5.23_e1_h128_i192.safetensors")
    vllm = _kernel(_canonical(golden), get_revision("vllm-0.33", "nvfp4"), Nvfp4Backend.MARLIN)
    differ = {name for name in MARLIN_NAMES if not _same(vllm[name], golden[f"out.{name}"])}
    assert {"w13_weight_scale_2", "w2_weight_scale_2"} <= differ
    assert ROW.nvfp4_marlin_scales == "plain"


def _artifact_values(out: Path) -> dict:
    """{rankN: {layerL: {SGLang parameter: digest}}} of the artifact's expert tensors, named as SGLang's."""
    values: dict = {}
    for rank, layer_key, name, tensor in artifact_tensors(out):
        layer = values.setdefault(rank, {}).setdefault(layer_key, {})
        if name in MOVED:
            layer[name] = tensor
        elif name in SCALARS:
            layer.update({sglang_name: tensor for sglang_name in SCALARS[name]})
        else:
            layer[RECIPROCALS[name]] = (1 / tensor[0]).reshape(())
    return values


def _digests(out: Path) -> dict:
    """{rankN: {layerL: {name: digest}}} of the artifact's tensors, by mxconvert's names."""
    got: dict = {}
    for rank, layer, name, tensor in artifact_tensors(out):
        got.setdefault(rank, {}).setdefault(layer, {})[name] = digest(tensor)
    return got


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_values(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile b200` of the ModelOpt Qwen3 example: every kernel tensor
    of every rank and layer equals what SGLang's own loading and post-processing hold (the golden's
    digests; SGLang's raw w13 / w2 weight_scale_2 and input scales, which its TRT-LLM kernel does not
    read after post-processing, are not in the artifact); and verify accepts it."""
    out = tmp_path / "out"
    done = run_cli("convert", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "b200", "--tp", tp, "--out", out)
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("FLASHINFER_TRTLLM", "sglang-0.5.23")
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    got = _artifact_values(out)
    assert set(got) == set(golden)
    for rank, layers in golden.items():
        assert set(got[rank]) == set(layers)
        for layer, params in layers.items():
            kernel_params = {n: d for n, d in params.items() if n not in ("w13_weight_scale_2", "w2_weight_scale_2")}
            assert {n: digest(t) for n, t in got[rank][layer].items()} == kernel_params, (rank, layer)
    verified = run_cli("verify", out, "--source", MODELOPT)
    assert verified.exit_code == 0, verified.output


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_marlintensor_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile h100` (SGLang's auto there: Marlin) of the ModelOpt
    example equals SGLang's own Marlin preparation of it (tools/golden/sglang_nvfp4.py), TP 1 and 2."""
    out = tmp_path / "out"
    done = run_cli("convert", MODELOPT, "--runtime", "sglang==0.5.23", "--profile", "h100", "--tp", tp, "--out", out)
    assert done.exit_code == 0, done.output
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert manifest["target"]["backend"] == "MARLIN"
    golden = json.loads(MARLIN_DIGESTS.read_text())["digests"][f"tp{tp}"]
    got = _digests(out)
    want = {
        r: {lay: {n: d for n, d in ps.items() if n != "workspace"} for lay, ps in ls.items()}
        for r, ls in golden.items()
    }
    assert got == want
    verified = run_cli("verify", out, "--source", MODELOPT)
    assert verified.exit_code == 0, verified.output


MODELOPT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-modelopt-deepseek"


@pytest.mark.parametrize("stem", ["nvfp4-trtllm", "nvfp4-marlin"])
def test_converted_padded_example_is_sglangs_own_values(tmp_path, stem):
    """The ModelOpt DeepSeek example (I 96: SGLang's TRT-LLM pads it to 128, Marlin does not), TP 1."""
    profile = "b200" if stem == "nvfp4-trtllm" else "h100"
    out = tmp_path / "out"
    done = run_cli("convert", MODELOPT_DEEPSEEK, "--runtime", "sglang==0.5.23", "--profile", profile, "--out", out)
    assert done.exit_code == 0, done.output
    golden = json.loads((GOLDEN / f"{stem}_sglang-0.5.23_example-deepseek_digests.json").read_text())["digests"]["tp1"]
    if stem == "nvfp4-trtllm":
        got = {
            r: {lay: {n: digest(t) for n, t in ps.items()} for lay, ps in ls.items()}
            for r, ls in _artifact_values(out).items()
        }
        raw = ("w13_weight_scale_2", "w2_weight_scale_2")
        want = {
            r: {lay: {n: d for n, d in ps.items() if n not in raw} for lay, ps in ls.items()}
            for r, ls in golden.items()
        }
        assert golden["rank0"]["layer1"]["w13_weight"]["shape"] == [4, 256, 64]  # I 96 -> 128, gate and up
    else:
        got = _digests(out)
        want = {
            r: {lay: {n: d for n, d in ps.items() if n != "workspace"} for lay, ps in ls.items()}
            for r, ls in golden.items()
        }
    assert got == want
    assert run_cli("verify", out, "--source", MODELOPT_DEEPSEEK).exit_code == 0


def test_uneven_tp_slicing_of_sglangs_trtllm_path_is_refused(tmp_path):
    """At TP 2 the example's 48-row shard is padded to 64 and SGLang's padded loading gives rank 0 rows
    0-63 and rank 1 rows 64-95 (narrow_padded_param_and_loaded_weight), where mxconvert splits 48 / 48."""
    out = tmp_path / "out"
    done = run_cli(
        "convert", MODELOPT_DEEPSEEK, "--runtime", "sglang==0.5.23", "--profile", "b200", "--tp", 2, "--out", out
    )
    assert done.exit_code == 2 and "padded shard" in done.output and not out.exists()


def test_compressed_tensors_checkpoints_are_refused(tmp_path):
    """The CT Qwen3 example's TRT-LLM is written now (tests/test_sglang_nvfp4_ct_w4a4_trtllm.py); the CT
    DeepSeek example's I 96, which the row would pad and SGLang's compressed-tensors scheme does not, stays refused."""
    ct_deepseek = ROOT / "examples" / "tiny-nvfp4-ct-deepseek"
    done = run_cli("convert", ct_deepseek, "--runtime", "sglang==0.5.23", "--profile", "b200", "--backend",
                   "flashinfer_trtllm", "--out", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 2
    assert "compressed-tensors NVFP4" in done.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("scalar", ["weight_scale_2", "input_scale"])
def test_differing_gate_and_up_scalars_are_refused(tmp_path, scalar):
    src = tmp_path / "src"
    shutil.copytree(MODELOPT, src)
    rewrite_source_tensor(src, f"model.layers.1.mlp.experts.2.up_proj.{scalar}", lambda t: t * 1.5)
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "b200", "--out", tmp_path / "out")
    assert done.exit_code == 2
    assert f"layer 1 expert 2: gate_proj.{scalar}" in done.output and not (tmp_path / "out").exists()
    # vLLM keeps gate's and converts it (with a warning for the global scale)
    vllm = run_cli("convert", src, "--runtime", "vllm-0.33", "--profile", "b200", "--out", tmp_path / "vllm")
    assert vllm.exit_code == 0, vllm.output


def test_hidden_sizes_sglangs_trtllm_preparation_cannot_hold_are_refused():
    profile = get_profile("b200")
    kwargs = {"producer": "modelopt", "model_type": "qwen3_moe", "intermediate_size": 768}
    with pytest.raises(SelectionRefused, match="hidden size 2880"):
        select_nvfp4_backend(profile, ROW, Deployment(), "auto", hidden_size=2880, **kwargs)
    assert select_nvfp4_backend(profile, ROW, Deployment(), "auto", hidden_size=2048, **kwargs).backend is B
