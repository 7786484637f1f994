"""SGLang 0.5.23's compressed-tensors NVFP4 W4A4 MoE with `--moe-runner-backend flashinfer_trtllm` on Blackwell
(`CompressedTensorsW4A4Nvfp4MoE`, its `use_flashinfer_trtllm` branch) against mxconvert's.

The goldens are SGLang's own `CompressedTensorsFusedMoEMethod` / `CompressedTensorsW4A4Nvfp4MoE`
`create_weights`, `FusedMoE`'s per-expert loading and `process_weights_after_loading` run on CPU
(tools/golden/sglang_nvfp4.py, `write_ct_trtllm_goldens`). They show (docs/sglang.md, "NVFP4"):

* the scheme's weights and block scales (`reorder_w1w3_to_w3w1`, `prepare_static_weights_for_trtllm_fp4_moe`)
  are the row's FlashInfer TRT-LLM layout where I / tp is a multiple of 64 (nothing padded), and its scalars
  (ONE minimum of the *stored* input scales over every local expert, repeated per expert; the alphas and
  `g1_scale_c` made of it) are `nvfp4_scales.ct_w4a4_trtllm_scales`, bit for bit, also where the stored
  scales are float32-uninvertible and differ per expert;
* so `convert --backend flashinfer_trtllm` of the compressed-tensors Qwen3 example writes SGLang's own values
  at TP 1 and 2 and verify accepts it; an I / tp the row would pad is refused with SGLang's reason.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import ROOT, rewrite_source_tensor, run_cli
from sglang_golden_helpers import GOLDEN, artifact_tensors, read_golden
from test_sglang_nvfp4_ct_w4a4 import _canonical, _digests, _same, _uninvertible

from mxconvert.formats.registry import format_named
from mxconvert.layouts import nvfp4_layout
from mxconvert.layouts.nvfp4_scales import CT_W4A4_TRTLLM_ACTIVATION_SCALE
from mxconvert.layouts.trtllm import sglang_ct_w4a4_trtllm
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.sglang_revisions import compressed_tensors_nvfp4, get_sglang_revision

ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
TRTLLM_GOLDEN = GOLDEN / "nvfp4-ct-trtllm_sglang-0.5.23_e2_h256_i128_w4a4.safetensors"
#: Three experts whose stored input scales all differ and are float32-uninvertible (1 / (1 / x) != x).
UNINVERTIBLE = GOLDEN / "nvfp4-ct-trtllm_sglang-0.5.23_e3_h128_i64_w4a4_uninvertible.safetensors"
DIGESTS = GOLDEN / "nvfp4-ct-trtllm_sglang-0.5.23_example_digests.json"
CT = ROOT / "examples" / "tiny-nvfp4-ct-qwen3"
#: Everything SGLang's TRT-LLM `apply` hands `FlashInferTrtllmFp4MoeQuantInfo`, and the reciprocal global scales.
NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
         "g1_alphas", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant", "g1_scale_c")  # fmt: skip
SCALARS = ("g1_alphas", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant", "g1_scale_c")


def _layout(e: int, k: int, n: int):
    return sglang_ct_w4a4_trtllm(nvfp4_layout(Nvfp4Backend.FLASHINFER_TRTLLM, ROW, k, n, e))


def _kernel(layout, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {name: tensor.forward(canonical[name]) for name, tensor in layout.tensors.items()}
    for name, derived in layout.derived.items():
        out[name] = derived.forward(canonical)
    return out


@pytest.mark.parametrize("path", [TRTLLM_GOLDEN, UNINVERTIBLE], ids=lambda p: p.stem)
def test_ct_w4a4_trtllm_layout_is_sglangs_bytes_and_scalars(path):
    """Every tensor the scheme's TRT-LLM branch leaves for the kernel, bit for bit. The goldens' stored input
    scales differ between gate and up and between experts, so the one minimum over them all is exercised."""
    golden = read_golden(path)
    canonical = _canonical(golden)
    e, k, half_n = canonical["w2_weight"].shape
    layout = _layout(e, k, 2 * half_n)
    got = _kernel(layout, canonical)
    assert set(got) == set(NAMES)
    for name in NAMES:
        assert _same(got[name], golden[f"out.{name}"]), name
    stored = canonical["w13_input_global_scale"]
    gate, up = stored.unbind(1)
    assert bool((gate != up).all())  # gate's and up's differ per expert ...
    assert len(set(stored.min(dim=1).values.tolist())) == e  # ... and the experts' minima differ
    assert bool((golden["out.w13_input_scale_quant"] == stored.min()).all())
    assert layout.describe()["activation_scale"] == CT_W4A4_TRTLLM_ACTIVATION_SCALE


def test_stored_input_scales_are_not_the_decoded_reciprocals():
    """Rebuilt from the decoded canonical input scales (`1 / (1 / x)`), SGLang's scalars of the UNINVERTIBLE
    golden come out wrong: the minimum must be of the stored values."""
    golden = read_golden(UNINVERTIBLE)
    canonical = _canonical(golden)
    rebuilt = {f"w{n}_input_global_scale": 1.0 / canonical[f"w{n}_input_scale"] for n in (13, 2)}
    e, k, half_n = canonical["w2_weight"].shape
    layout = _layout(e, k, 2 * half_n)
    for name in ("w13_input_scale_quant", "w2_input_scale_quant"):
        assert _same(layout.derived[name].forward(canonical), golden[f"out.{name}"]), name
        assert not _same(layout.derived[name].forward(canonical | rebuilt), golden[f"out.{name}"]), name


@pytest.mark.parametrize(
    "wrong",
    [
        lambda raw: raw.min(dim=1).values,  # the CUTLASS branch's per-expert minimum
        lambda raw: raw.max().expand(raw.shape[0]),  # ModelOpt's maximum
    ],
    ids=["per-expert-min", "global-max"],
)
def test_planted_bug_in_the_reduction_is_caught(wrong):
    """Plausible slips for SGLang's `.min()` over all local experts are not SGLang's value."""
    golden = read_golden(UNINVERTIBLE)
    raw = _canonical(golden)["w13_input_global_scale"]
    assert not _same(wrong(raw).float().contiguous(), golden["out.w13_input_scale_quant"])


def test_the_cutlass_scalars_are_not_the_trtllm_ones():
    """The two branches' layouts differ in their scalars: the CUTLASS variant's on this golden is not SGLang's."""
    from mxconvert.layouts.nvfp4_scales import ct_w4a4_cutlass_scales

    golden = read_golden(TRTLLM_GOLDEN)
    canonical = _canonical(golden)
    cutlass = ct_w4a4_cutlass_scales()["w13_input_scale_quant"].forward(canonical)
    assert not _same(cutlass, golden["out.w13_input_scale_quant"])


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_ct_example_is_sglangs_w4a4_trtllm_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile b200 --backend flashinfer_trtllm` of the compressed-tensors
    Qwen3 example equals SGLang's own preparation of it, every rank and layer, TP 1 and 2; verify accepts it
    (the layout rebuilt from the manifest's description)."""
    out = tmp_path / "out"
    done = run_cli("convert", CT, "--runtime", "sglang==0.5.23", "--profile", "b200", "--backend",
                   "flashinfer_trtllm", "--tp", tp, "--out", out)  # fmt: skip
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("FLASHINFER_TRTLLM", "sglang-0.5.23")
    assert target["layout"]["activation_scale"] == CT_W4A4_TRTLLM_ACTIVATION_SCALE
    rebuilt = format_named("nvfp4").layout_from_target(target)
    assert set(rebuilt.derived) == {"w13_weight_scale_2", "w2_weight_scale_2", *SCALARS}
    golden = json.loads(DIGESTS.read_text())
    assert golden["scheme"] == "CompressedTensorsW4A4Nvfp4MoE" and golden["runner"] == "flashinfer_trtllm"
    assert golden["example"] == CT.name
    assert _digests(out) == golden["digests"][f"tp{tp}"]
    verified = run_cli("verify", out, "--source", CT)
    assert verified.exit_code == 0, verified.output


def test_converted_scalars_are_the_minimum_of_the_stored_input_scales(tmp_path):
    """The loader reads the stored input scales themselves: with one expert's up and down scales made the
    smallest and uninvertible, the artifact's `w13/w2_input_scale_quant` are those stored values for every
    expert of the layer, bit for bit (a decoded `1 / (1 / x)` is not); verify accepts."""
    src = tmp_path / "src"
    shutil.copytree(CT, src)
    prefix = "model.layers.1.mlp.experts.2"
    up = rewrite_source_tensor(src, f"{prefix}.up_proj.input_global_scale", lambda t: _uninvertible(t * 0.25))
    down = rewrite_source_tensor(src, f"{prefix}.down_proj.input_global_scale", lambda t: _uninvertible(t * 0.25))
    out = tmp_path / "out"
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "b200", "--backend",
                   "flashinfer_trtllm", "--out", out)  # fmt: skip
    assert done.exit_code == 0, done.output
    got = {(layer, name): t for _, layer, name, t in artifact_tensors(out)}
    w13, w2 = got[("layer1", "w13_input_scale_quant")], got[("layer1", "w2_input_scale_quant")]
    assert _same(w13, up.reshape(1).float().expand(w13.shape[0]).contiguous())
    assert _same(w2, down.reshape(1).float().expand(w2.shape[0]).contiguous())
    assert not _same((1.0 / (1.0 / down)).reshape(1), down.reshape(1))
    assert run_cli("verify", out, "--source", src).exit_code == 0


def test_written_backends_of_the_row():
    rule = compressed_tensors_nvfp4(ROW.name)
    assert rule is not None and rule.written == {"MARLIN", "FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"}


def test_a_shard_that_the_row_would_pad_is_refused(tmp_path):
    """The CT DeepSeek example (I 96): the row's TRT-LLM layout pads I to 64 (128), which SGLang's scheme does not:
    refused with SGLang's reason, nothing written. TP 2 of the Qwen3 example (I 64 per rank) is written."""
    out = tmp_path / "out"
    done = run_cli("convert", ROOT / "examples" / "tiny-nvfp4-ct-deepseek", "--runtime", "sglang==0.5.23",
                   "--profile", "b200", "--backend", "flashinfer_trtllm", "--out", out)  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "CompressedTensorsW4A4Nvfp4MoE" in done.output and "= 96 intermediate rows" in done.output
    assert "multiple of 64" in done.output
    assert not out.exists()
