"""SGLang 0.5.23's compressed-tensors NVFP4 MoE on an H100 (`CompressedTensorsW4A16Nvfp4MoE`, the FP4
Marlin scheme SGLang takes below capability 10.0, a W4A4 checkpoint served weight-only) against mxconvert's.

The goldens are SGLang's own `CompressedTensorsFusedMoEMethod` / `CompressedTensorsW4A16Nvfp4MoE`
`create_weights`, `FusedMoE`'s per-expert loading and `process_weights_after_loading` run on CPU
(tools/golden/sglang_nvfp4.py, `SglangNvfp4Ct`; stand-ins named there). They show (docs/sglang.md, "NVFP4"):

* the scheme's reciprocal of gate's stored weight global scale is mxconvert's canonical decode
  (formats/nvfp4/checkpoint.py, float32 `1 / x`), and what it leaves on the layer is the row's NVFP4
  Marlin layout (vLLM ~0.15's "plain" Marlin, as for ModelOpt), bit for bit, W4A4 and W4A16 alike;
* so `convert --runtime sglang==0.5.23 --profile h100` of the compressed-tensors Qwen3 example writes
  SGLang's own values at TP 1 and 2 (verify accepts it), and what SGLang's scheme raises on (a hidden
  size not a multiple of 128, a TP shard not a multiple of 64, differing gate / up global scales) is
  refused (its W4A4 scheme on Blackwell: tests/test_sglang_nvfp4_ct_w4a4.py, CUTLASS, and
  tests/test_sglang_nvfp4_ct_w4a4_trtllm.py, TRT-LLM).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import ROOT, rewrite_source_tensor, run_cli
from sglang_golden_helpers import GOLDEN, artifact_tensors, digest, read_golden, tensor_bytes

from mxconvert.layouts import nvfp4_layout
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.revisions import get_revision
from mxconvert.target.sglang_revisions import compressed_tensors_nvfp4, get_sglang_revision

ROW = get_sglang_revision("sglang-0.5.23", "nvfp4")
CASES = sorted(GOLDEN.glob("nvfp4-ct-marlin_sglang-0.5.23_e*.safetensors"))
DIGESTS = GOLDEN / "nvfp4-ct-marlin_sglang-0.5.23_example_digests.json"
CT = ROOT / "examples" / "tiny-nvfp4-ct-qwen3"
CT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-ct-deepseek"
#: What SGLang's Marlin layer holds that the artifact does (workspace is the device's, made at install).
NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2")


def _canonical(golden: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mxconvert's canonical NVFP4 tensors of the golden's compressed-tensors checkpoint: [gate; up],
    gate's global scale decoded as float32 `1 / x` (formats/nvfp4/checkpoint.py `decode_scale`)."""
    experts = sorted({int(k.split(".")[1]) for k in golden if k.startswith("in.")})

    def stack(proj: str, kind: str) -> torch.Tensor:
        return torch.stack([golden[f"in.{e}.{proj}.{kind}"] for e in experts])

    def decoded(proj: str) -> torch.Tensor:
        return torch.stack([1.0 / golden[f"in.{e}.{proj}.weight_global_scale"].reshape(()).float() for e in experts])

    return {
        "w13_weight": torch.cat([stack("gate_proj", "weight_packed"), stack("up_proj", "weight_packed")], 1),
        "w13_weight_scale": torch.cat([stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], 1),
        "w2_weight": stack("down_proj", "weight_packed"),
        "w2_weight_scale": stack("down_proj", "weight_scale"),
        "w13_weight_scale_2": decoded("gate_proj"),
        "w2_weight_scale_2": decoded("down_proj"),
    }


def _kernel(canonical: dict[str, torch.Tensor], revision) -> dict[str, torch.Tensor]:
    e, k, half_n = canonical["w2_weight"].shape
    layout = nvfp4_layout(Nvfp4Backend.MARLIN, revision, k, 2 * half_n, e)
    out = {name: tensor.forward(canonical[name]) for name, tensor in layout.tensors.items()}
    for name, derived in layout.derived.items():
        out[name] = derived.compute(*(canonical[i] for i in derived.inputs))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tensor_bytes(a) == tensor_bytes(b)


def test_goldens_cover_w4a4_and_w4a16_with_subnormal_scales():
    names = {p.name for p in CASES}
    assert names == {
        "nvfp4-ct-marlin_sglang-0.5.23_e2_h256_i128_w4a4.safetensors",
        "nvfp4-ct-marlin_sglang-0.5.23_e1_h128_i192_w4a16.safetensors",
    }
    w4a4 = read_golden(GOLDEN / "nvfp4-ct-marlin_sglang-0.5.23_e2_h256_i128_w4a4.safetensors")
    assert "in.0.gate_proj.input_global_scale" in w4a4  # loaded by SGLang, then dropped
    w4a16 = read_golden(GOLDEN / "nvfp4-ct-marlin_sglang-0.5.23_e1_h128_i192_w4a16.safetensors")
    assert not any(k.endswith("input_global_scale") for k in w4a16)
    assert bool((w4a16["in.0.gate_proj.weight_scale"].view(torch.uint8) < 0x08).any())  # subnormal E4M3
    assert float(w4a16["in.0.gate_proj.weight_global_scale"]) > 1  # the encode convention (a divisor)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_ct_marlin_bytes_are_the_rows_plain_marlin_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden), ROW)
    assert set(kernel) == set(NAMES)
    for name in NAMES:
        assert _same(kernel[name], golden[f"out.{name}"]), f"{path.name}: {name} differs from SGLang's bytes"


def test_undecoded_or_rescaled_global_scales_are_not_sglangs():
    """The check can fail: the stored (encode) global scale, or vLLM 0.33's rescaled Marlin scales, differ."""
    golden = read_golden(GOLDEN / "nvfp4-ct-marlin_sglang-0.5.23_e1_h128_i192_w4a16.safetensors")
    canonical = _canonical(golden)
    raw = dict(canonical, w13_weight_scale_2=1.0 / canonical["w13_weight_scale_2"])
    assert not _same(_kernel(raw, ROW)["w13_weight_scale_2"], golden["out.w13_weight_scale_2"])
    vllm = _kernel(canonical, get_revision("vllm-0.33", "nvfp4"))
    assert not _same(vllm["w13_weight_scale_2"], golden["out.w13_weight_scale_2"])


def _digests(out) -> dict:
    got: dict = {}
    for rank, layer, name, tensor in artifact_tensors(out):
        got.setdefault(rank, {}).setdefault(layer, {})[name] = digest(tensor)
    return got


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_ct_example_is_sglangs_own_marlin_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile h100` of the compressed-tensors Qwen3 example (W4A4,
    served weight-only) equals SGLang's own CompressedTensorsW4A16Nvfp4MoE preparation of it, every rank
    and layer, TP 1 and 2; verify accepts it."""
    out = tmp_path / "out"
    done = run_cli("convert", CT, "--runtime", "sglang==0.5.23", "--profile", "h100", "--tp", tp, "--out", out)
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["backend"], target["runtime_revision"]) == ("MARLIN", "sglang-0.5.23")
    golden = json.loads(DIGESTS.read_text())
    assert golden["scheme"] == "CompressedTensorsW4A16Nvfp4MoE" and golden["example"] == CT.name
    want = {
        r: {lay: {n: d for n, d in ps.items() if n != "workspace"} for lay, ps in ls.items()}
        for r, ls in golden["digests"][f"tp{tp}"].items()
    }
    assert _digests(out) == want
    verified = run_cli("verify", out, "--source", CT)
    assert verified.exit_code == 0, verified.output


def test_shapes_sglangs_ct_scheme_raises_on_are_refused(tmp_path):
    """The DeepSeek example's I 96 is not a multiple of 64 (SGLang's scheme raises); vLLM converts it."""
    out = tmp_path / "out"
    done = run_cli("convert", CT_DEEPSEEK, "--runtime", "sglang==0.5.23", "--profile", "h100", "--out", out)
    assert done.exit_code == 2, done.output
    assert "intermediate_size_per_partition % 64" in done.output and "96 / tp 1 = 96" in done.output
    assert not out.exists()
    rule = compressed_tensors_nvfp4(ROW.name)
    assert rule is not None and (rule.marlin_hidden_multiple, rule.marlin_shard_multiple) == (128, 64)


def test_differing_gate_and_up_global_scales_are_refused(tmp_path):
    """SGLang's W4A16 scheme raises where gate's and up's weight global scales differ (ModelOpt's Marlin
    keeps gate's); vLLM keeps gate's with a warning and converts it."""
    src = tmp_path / "src"
    shutil.copytree(CT, src)
    rewrite_source_tensor(src, "model.layers.1.mlp.experts.2.up_proj.weight_global_scale", lambda t: t * 1.5)
    done = run_cli("convert", src, "--runtime", "sglang==0.5.23", "--profile", "h100", "--out", tmp_path / "out")
    assert done.exit_code == 2, done.output
    assert "layer 1 expert 2: gate_proj.weight_global_scale" in done.output and not (tmp_path / "out").exists()
    vllm = run_cli("convert", src, "--runtime", "vllm-0.33", "--profile", "h100", "--out", tmp_path / "vllm")
    assert vllm.exit_code == 0, vllm.output


@pytest.mark.parametrize("backend", ["flashinfer_trtllm"])
def test_sglangs_w4a4_scheme_stays_refused(tmp_path, backend):
    """On Blackwell SGLang takes CompressedTensorsW4A4Nvfp4MoE; its TRT-LLM branch is written where nothing is
    padded (tests/test_sglang_nvfp4_ct_w4a4_trtllm.py) and refused with its reason where the row would pad
    (the CT DeepSeek example's I 96)."""
    out = tmp_path / "out"
    done = run_cli("convert", ROOT / "examples" / "tiny-nvfp4-ct-deepseek", "--runtime", "sglang==0.5.23",
                   "--profile", "b200", "--backend", backend, "--out", out)  # fmt: skip
    assert done.exit_code == 2 and "compressed-tensors NVFP4" in done.output and not out.exists()
    assert "MARLIN" in compressed_tensors_nvfp4(ROW.name).written  # type: ignore[union-attr]


# ---- compressed-tensors W4A4 on Blackwell (FLASHINFER_CUTLASS): compared, not written -------------------
CUTLASS_GOLDEN = GOLDEN / "nvfp4-ct-cutlass_sglang-0.5.23_e2_h256_i128_w4a4.safetensors"


def _ct_w4a4_canonical(golden: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`_canonical` plus the decoded input scales ([gate, up] per expert; down's), as convert reads them."""
    experts = sorted({int(k.split(".")[1]) for k in golden if k.startswith("in.")})

    def decoded(proj: str) -> torch.Tensor:
        return torch.stack([1.0 / golden[f"in.{e}.{proj}.input_global_scale"].reshape(()).float() for e in experts])

    return _canonical(golden) | {
        "w13_input_scale": torch.stack([decoded("gate_proj"), decoded("up_proj")], 1),
        "w2_input_scale": decoded("down_proj"),
    }


def test_sglang_ct_cutlass_moves_are_the_rows_cutlass_layout_but_its_scalars_are_not():
    """CompressedTensorsW4A4Nvfp4MoE's CUTLASS branch ([up; gate] loading, `swizzle_blockscale`) gives the
    row's FlashInfer CUTLASS weights and block scales bit for bit; its kernel scalars are per expert
    (`w13_input_scale_quant` the smaller stored input_global_scale of gate and up) where the layout folds
    the maximum decoded input scale over all experts, so `g1_alphas` differs: the row writes it with SGLang's
    per-expert scalars instead (layouts/cutlass.py `sglang_ct_w4a4_cutlass`)."""
    golden = read_golden(CUTLASS_GOLDEN)
    canonical = _ct_w4a4_canonical(golden)
    e, k, half_n = canonical["w2_weight"].shape
    layout = nvfp4_layout(Nvfp4Backend.FLASHINFER_CUTLASS, ROW, k, 2 * half_n, e)
    for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
        assert _same(layout.tensors[name].forward(canonical[name]), golden[f"out.{name}"]), name
    stored = torch.stack(
        [
            torch.minimum(golden[f"in.{x}.gate_proj.input_global_scale"], golden[f"in.{x}.up_proj.input_global_scale"])
            for x in range(e)
        ]
    ).reshape(e)
    assert _same(golden["out.w13_input_scale_quant"], stored)  # the stored values themselves, per expert
    assert len(set(stored.tolist())) == e  # the golden's experts' input scales differ
    folded = layout.derived["w13_weight_scale_2"]
    g1 = folded.compute(*(canonical[i] for i in folded.inputs))
    assert not _same(g1, golden["out.g1_alphas"])  # one maximum over all experts is not SGLang's per-expert alpha
    rule = compressed_tensors_nvfp4(ROW.name)
    # the per-expert scalars are a layout of their own (tests/test_sglang_nvfp4_ct_w4a4.py), now written
    assert rule is not None and "FLASHINFER_CUTLASS" in rule.written
