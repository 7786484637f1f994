"""SGLang 0.5.23's compressed-tensors NVFP4 W4A4 MoE on Blackwell (`CompressedTensorsW4A4Nvfp4MoE`, its
CUTLASS branch: SGLang's pick for `auto` and `flashinfer_cutlass` from capability 10.0) against mxconvert's.

The goldens are SGLang's own `CompressedTensorsFusedMoEMethod` / `CompressedTensorsW4A4Nvfp4MoE`
`create_weights`, `FusedMoE`'s per-expert loading and `process_weights_after_loading` run on CPU
(tools/golden/sglang_nvfp4.py, `write_ct_cutlass_goldens`). They show (docs/sglang.md, "NVFP4"):

* the scheme's weights and swizzled block scales are the row's FlashInfer CUTLASS layout, and its per-expert
  scalars (`w13_input_scale_quant` the smaller of gate's and up's *stored* `input_global_scale`,
  `w2_input_scale_quant` w2's, the alphas made of them) are `nvfp4_scales.ct_w4a4_cutlass_scales` of the
  canonical tensors plus the stored input scales (`w13/w2_input_global_scale`), bit for bit;
* so `convert --runtime sglang==0.5.23 --profile b200` of the compressed-tensors Qwen3 example writes
  SGLang's own values at TP 1 and 2, verify accepts it (the layout is rebuilt from the manifest's layout
  description), and a changed scalar is caught.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import ROOT, rewrite_source_tensor, run_cli
from sglang_golden_helpers import GOLDEN, artifact_tensors, digest, read_golden, tensor_bytes

from mxconvert.formats.nvfp4.checkpoint import STORED_INPUT_SCALES
from mxconvert.formats.registry import format_named
from mxconvert.layouts import nvfp4_layout
from mxconvert.layouts.cutlass import sglang_ct_w4a4_cutlass
from mxconvert.layouts.nvfp4_scales import CT_W4A4_CUTLASS_ACTIVATION_SCALE
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.sglang_revisions import compressed_tensors_nvfp4, get_sglang_revision

ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
CUTLASS_GOLDEN = GOLDEN / "nvfp4-ct-cutlass_sglang-0.5.23_e2_h256_i128_w4a4.safetensors"
#: Stored input scales whose float32 `1 / (1 / x)` is not x, every one.
UNINVERTIBLE = GOLDEN / "nvfp4-ct-cutlass_sglang-0.5.23_e2_h128_i128_w4a4_uninvertible.safetensors"
DIGESTS = GOLDEN / "nvfp4-ct-cutlass_sglang-0.5.23_example_digests.json"
CT = ROOT / "examples" / "tiny-nvfp4-ct-qwen3"
#: Everything SGLang's CUTLASS `apply` hands `cutlass_fused_moe`, and the reciprocal global scales.
NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
         "g1_alphas", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant")  # fmt: skip


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def _canonical(golden: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mxconvert's canonical tensors of the golden's checkpoint ([gate; up], float32 `1 / x` decoded
    global and input scales) and the stored input scales, as formats/nvfp4/checkpoint.py reads them."""
    experts = sorted({int(k.split(".")[1]) for k in golden if k.startswith("in.")})

    def stack(proj: str, kind: str) -> torch.Tensor:
        return torch.stack([golden[f"in.{e}.{proj}.{kind}"] for e in experts])

    def stored(proj: str, kind: str) -> torch.Tensor:
        return torch.stack([golden[f"in.{e}.{proj}.{kind}"].reshape(()).float() for e in experts])

    return {
        "w13_weight": torch.cat([stack("gate_proj", "weight_packed"), stack("up_proj", "weight_packed")], 1),
        "w13_weight_scale": torch.cat([stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], 1),
        "w2_weight": stack("down_proj", "weight_packed"),
        "w2_weight_scale": stack("down_proj", "weight_scale"),
        "w13_weight_scale_2": 1.0 / stored("gate_proj", "weight_global_scale"),
        "w2_weight_scale_2": 1.0 / stored("down_proj", "weight_global_scale"),
        "w13_input_scale": torch.stack(
            [1.0 / stored("gate_proj", "input_global_scale"), 1.0 / stored("up_proj", "input_global_scale")], 1
        ),
        "w2_input_scale": 1.0 / stored("down_proj", "input_global_scale"),
        "w13_input_global_scale": torch.stack(
            [stored("gate_proj", "input_global_scale"), stored("up_proj", "input_global_scale")], 1
        ),
        "w2_input_global_scale": stored("down_proj", "input_global_scale"),
    }


def _layout(e: int, k: int, n: int):
    return sglang_ct_w4a4_cutlass(nvfp4_layout(Nvfp4Backend.FLASHINFER_CUTLASS, ROW, k, n, e))


def _kernel(layout, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {name: tensor.forward(canonical[name]) for name, tensor in layout.tensors.items()}
    for name, derived in layout.derived.items():
        out[name] = derived.forward(canonical)
    return out


@pytest.mark.parametrize("path", [CUTLASS_GOLDEN, UNINVERTIBLE], ids=lambda p: p.stem)
def test_ct_w4a4_cutlass_layout_is_sglangs_bytes_and_scalars(path):
    """Every tensor the scheme's CUTLASS branch leaves for the kernel, bit for bit; the goldens' experts
    have differing gate / up stored input scales, so the per-expert minimum is exercised."""
    golden = read_golden(path)
    canonical = _canonical(golden)
    e, k, half_n = canonical["w2_weight"].shape
    layout = _layout(e, k, 2 * half_n)
    got = _kernel(layout, canonical)
    assert set(got) == set(NAMES)
    for name in NAMES:
        assert _same(got[name], golden[f"out.{name}"]), name
    gate, up = canonical["w13_input_global_scale"].unbind(1)
    assert bool((gate != up).all())  # the minimum picks per expert
    assert layout.describe()["activation_scale"] == CT_W4A4_CUTLASS_ACTIVATION_SCALE


def test_stored_input_scales_are_not_the_decoded_reciprocals():
    """Why the stored scales are canonical tensors of their own: rebuilt from the decoded canonical input
    scales (`1 / (1 / x)`), SGLang's `w13/w2_input_scale_quant` of the UNINVERTIBLE golden come out wrong."""
    golden = read_golden(UNINVERTIBLE)
    canonical = _canonical(golden)
    rebuilt = {f"w{n}_input_global_scale": 1.0 / canonical[f"w{n}_input_scale"] for n in (13, 2)}
    assert set(rebuilt) == set(STORED_INPUT_SCALES)
    e, k, half_n = canonical["w2_weight"].shape
    layout = _layout(e, k, 2 * half_n)
    for name in ("w13_input_scale_quant", "w2_input_scale_quant"):
        assert _same(layout.derived[name].forward(canonical), golden[f"out.{name}"]), name
        assert not _same(layout.derived[name].forward(canonical | rebuilt), golden[f"out.{name}"]), name


def test_planted_bug_in_a_scalar_is_caught():
    """The maximum of the stored scales (a plausible slip for SGLang's `.min(dim=1)`) is not SGLang's."""
    golden = read_golden(CUTLASS_GOLDEN)
    canonical = _canonical(golden)
    wrong = canonical["w13_input_global_scale"].max(dim=1).values
    assert not _same(wrong, golden["out.w13_input_scale_quant"])


def _digests(out) -> dict:
    got: dict = {}
    for rank, layer, name, tensor in artifact_tensors(out):
        got.setdefault(rank, {}).setdefault(layer, {})[name] = digest(tensor)
    return got


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_ct_example_is_sglangs_w4a4_cutlass_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile b200` of the compressed-tensors Qwen3 example (SGLang's
    `auto` there: the W4A4 scheme's CUTLASS branch) equals SGLang's own preparation of it, every rank and
    layer, TP 1 and 2; verify accepts it (the layout rebuilt from the manifest's description)."""
    out = tmp_path / "out"
    done = run_cli("convert", CT, "--runtime", "sglang==0.5.23", "--profile", "b200", "--tp", tp, "--out", out)
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("FLASHINFER_CUTLASS", "sglang-0.5.23")
    assert target["layout"]["activation_scale"] == CT_W4A4_CUTLASS_ACTIVATION_SCALE
    rebuilt = format_named("nvfp4").layout_from_target(target)
    assert set(rebuilt.derived) == {"w13_weight_scale_2", "w2_weight_scale_2", "g1_alphas", "g2_alphas",
                                    "w13_input_scale_quant", "w2_input_scale_quant"}  # fmt: skip
    golden = json.loads(DIGESTS.read_text())
    assert golden["scheme"] == "CompressedTensorsW4A4Nvfp4MoE" and golden["example"] == CT.name
    assert _digests(out) == golden["digests"][f"tp{tp}"]
    verified = run_cli("verify", out, "--source", CT)
    assert verified.exit_code == 0, verified.output


def _uninvertible(t: torch.Tensor) -> torch.Tensor:
    """`t` moved up, one float32 step at a time, to a value whose float32 `1 / (1 / x)` is not x."""
    while bool((1.0 / (1.0 / t) == t).all()):
        t = torch.nextafter(t, torch.full_like(t, float("inf")))
    return t


def test_converted_scalars_are_the_stored_input_scales(tmp_path):
    """The loader reads the stored input scales themselves: with gate's and up's made different and
    uninvertible, the artifact's `w13_input_scale_quant` is their stored minimum and
    `w2_input_scale_quant` down's stored value, bit for bit (a decoded `1 / (1 / x)` is not); verify accepts."""
    src = tmp_path / "src"
    shutil.copytree(CT, src)
    prefix = "model.layers.1.mlp.experts.2"
    up = rewrite_source_tensor(src, f"{prefix}.up_proj.input_global_scale", lambda t: _uninvertible(t * 0.75))
    down = rewrite_source_tensor(src, f"{prefix}.down_proj.input_global_scale", _uninvertible)
    out = tmp_path / "out"
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "b200", "--out", out)
    assert done.exit_code == 0, done.output
    got = {(layer, name): t for _, layer, name, t in artifact_tensors(out)}
    assert _same(got[("layer1", "w13_input_scale_quant")][2:3], up.reshape(1).float())
    assert _same(got[("layer1", "w2_input_scale_quant")][2:3], down.reshape(1).float())
    assert not _same((1.0 / (1.0 / down)).reshape(1), down.reshape(1))
    assert run_cli("verify", out, "--source", src).exit_code == 0


def test_trtllm_of_the_w4a4_scheme_stays_refused(tmp_path):
    """`flashinfer_trtllm` (the scheme's TRT-LLM branch) is written now (tests/test_sglang_nvfp4_ct_w4a4_trtllm.py)
    with its own scalars, not the CUTLASS variant's."""
    out = tmp_path / "out"
    done = run_cli("convert", CT, "--runtime", "sglang==0.5.23", "--profile", "b200", "--backend",
                   "flashinfer_trtllm", "--out", out)  # fmt: skip
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert target["layout"]["activation_scale"] != CT_W4A4_CUTLASS_ACTIVATION_SCALE
    rule = compressed_tensors_nvfp4(ROW.name)
    assert rule is not None and rule.written == {"MARLIN", "FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"}


def test_a_shard_whose_2i_is_not_a_multiple_of_128_is_refused(tmp_path):
    """The CT DeepSeek example (I 96): SGLang's scheme pads the swizzled w13 scales' 192 rows to 256, which the
    row's CUTLASS layout does not write: refused with SGLang's reason, nothing written."""
    out = tmp_path / "out"
    done = run_cli("convert", ROOT / "examples" / "tiny-nvfp4-ct-deepseek", "--runtime", "sglang==0.5.23",
                   "--profile", "b200", "--out", out)  # fmt: skip
    assert done.exit_code == 2 and "CompressedTensorsW4A4Nvfp4MoE" in done.output and "= 192 rows" in done.output
    assert not out.exists()
