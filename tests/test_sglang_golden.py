"""SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer TRT-LLM (SM100) bytes against mxconvert's layout.

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` run on
CPU (tools/golden/sglang_mxfp4_trtllm.py, stand-ins named there). They show (docs/sglang.md):

* the moves are exactly the reused FlashInfer TRT-LLM layout (layouts/trtllm.py, vLLM 0.33's), with
  the sizes SGLang pads to (the `sglang-0.5.23` row's round-up: I -> 128, H -> 256), bit for bit;
* the one difference is the padding of the scales: SGLang's is 0x7F where vLLM's is 0, which the
  row's `mxfp4_scale_pad_fill` carries into the canonical tensors (formats/mxfp4/canonical.py);
* so `convert --runtime sglang==0.5.23 --profile b200` writes SGLang's bytes: the example
  checkpoint's artifact equals SGLang's own loading + post-processing of it, TP 1 and 2
  (tools/golden/sglang_mxfp4_example.py), bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, run_cli
from safetensors import safe_open

from mxconvert.layouts import resolve_layout
from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS, get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision

GOLDEN = Path(__file__).resolve().parent / "golden" / "sglang"
CASES = sorted(GOLDEN.glob("trtllm-sm100_sglang-0.5.23_*.safetensors"))
EXAMPLE_DIGESTS = GOLDEN / "trtllm-sm100_sglang-0.5.23_example_digests.json"
BACKEND = Mxfp4Backend.FLASHINFER_TRTLLM_MXFP4_MXFP8
#: checkpoint name (SGLang's parameter) -> mxconvert's canonical / kernel tensor name
NAMES = {
    "w13_weight": "w13_weight",
    "w13_weight_scale": "w13_weight_scale",
    "w13_weight_bias": "w13_bias",
    "w2_weight": "w2_weight",
    "w2_weight_scale": "w2_weight_scale",
    "w2_weight_bias": "w2_bias",
}
SCALES = ("w13_weight_scale", "w2_weight_scale")


def _read(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _canonical(golden: dict[str, torch.Tensor], hp: int, ip: int, scale_fill: int) -> dict[str, torch.Tensor]:
    """The rank's checkpoint tensors padded at their ends to (Hp, Ip), scales with `scale_fill`."""
    e = golden["in.w13_weight"].shape[0]
    shapes = {
        "w13_weight": (e, 2 * ip, hp // 2),
        "w13_weight_scale": (e, 2 * ip, hp // 32),
        "w13_weight_bias": (e, 2 * ip),
        "w2_weight": (e, hp, ip // 2),
        "w2_weight_scale": (e, hp, ip // 32),
        "w2_weight_bias": (e, hp),
    }
    out = {}
    for name, shape in shapes.items():
        src = golden[f"in.{name}"]
        dst = torch.full(shape, scale_fill if name in SCALES else 0, dtype=src.dtype)
        dst[tuple(slice(0, s) for s in src.shape)] = src
        out[NAMES[name]] = dst
    return out


def _padded_sizes(golden: dict[str, torch.Tensor]) -> tuple[int, int]:
    _, rows, half_h = golden["in.w13_weight"].shape
    return get_sglang_revision("sglang-0.5.23").round_up(BACKEND, "cuda", 2 * half_h, rows // 2)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _kernel(canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layout = resolve_layout(BACKEND, get_revision("vllm-0.33"), get_profile("b200"))
    return {name: layout.tensors[name].forward(t) for name, t in canonical.items()}


def test_goldens_cover_a_padded_and_an_unpadded_case():
    names = {p.name for p in CASES}
    assert "trtllm-sm100_sglang-0.5.23_e2_h160_i160.safetensors" in names
    assert "trtllm-sm100_sglang-0.5.23_e1_h256_i256.safetensors" in names


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_pads_to_the_rows_round_up(path):
    golden = _read(path)
    hp, ip = _padded_sizes(golden)
    assert (hp, ip) == (int(golden["params.hidden_padded"]), int(golden["params.intermediate_padded"]))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_trtllm_layout_of_a_0x7f_padded_canonical(path):
    golden = _read(path)
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0x7F))
    for sglang_name, name in NAMES.items():
        want = golden[f"out.{sglang_name}"]
        got = kernel[name]
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == tuple(want.shape), name
        assert _bytes(got) == _bytes(want), f"{path.name}: {name} differs from SGLang's bytes"


def test_zero_padded_canonical_differs_only_in_the_scales():
    """With vLLM's canonical padding (zeros) the weights and biases still match SGLang's and the
    scales do not: the reason the SGLang row carries its own fill."""
    golden = _read(GOLDEN / "trtllm-sm100_sglang-0.5.23_e2_h160_i160.safetensors")
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0))
    for sglang_name, name in NAMES.items():
        same = _bytes(kernel[name]) == _bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in SCALES), name


def test_unpadded_shape_needs_no_fill():
    golden = _read(GOLDEN / "trtllm-sm100_sglang-0.5.23_e1_h256_i256.safetensors")
    kernel = _kernel(_canonical(golden, *_padded_sizes(golden), scale_fill=0))
    for sglang_name, name in NAMES.items():
        assert _bytes(kernel[name]) == _bytes(golden[f"out.{sglang_name}"]), name


def test_the_sglang_row_fills_scale_padding_with_0x7f_and_vllm_rows_with_zero():
    assert get_sglang_revision("sglang-0.5.23").mxfp4_scale_pad_fill == 0x7F
    assert {row.mxfp4_scale_pad_fill for row in REVISIONS.values()} == {0}


def test_the_sglang_row_lays_out_the_backend():
    target = LayoutTarget(BACKEND, get_sglang_revision("sglang-0.5.23"), get_profile("b200"))
    assert build_layout("mxfp4", target).kind == "trtllm"


def _artifact_digests(out: Path) -> dict:
    """{rankN: {layerL: {SGLang parameter name: dtype, shape, sha256}}} of an artifact's expert tensors."""
    manifest = json.loads((out / "mxconvert.json").read_text())
    digests: dict = {}
    for rank in manifest["ranks"]:
        for key, entry in rank["tensors"].items():
            with safe_open(str(out / entry["file"]), "pt") as f:
                tensor = f.get_tensor(key)
            sglang_name = {v: k for k, v in NAMES.items()}[entry["name"]]
            layer = digests.setdefault(f"rank{rank['rank']}", {}).setdefault(f"layer{entry['layer']}", {})
            layer[sglang_name] = {
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape),
                "sha256": hashlib.sha256(_bytes(tensor)).hexdigest(),
            }
    return digests


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile b200` of examples/tiny-gpt-oss: every expert
    tensor of every rank equals what SGLang 0.5.23's own loading and post-processing hold
    (tools/golden/sglang_mxfp4_example.py), padding included; and verify accepts the artifact."""
    out = tmp_path / "out"
    result = run_cli(
        "convert", EXAMPLE, "--runtime", "sglang==0.5.23", "--profile", "b200", "--tp", str(tp), "--out", out
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert manifest["target"]["backend"] == BACKEND.value
    assert manifest["target"]["runtime_revision"] == "sglang-0.5.23"
    assert manifest["target"]["scale_pad_fill"] == 0x7F
    golden = json.loads(EXAMPLE_DIGESTS.read_text())["digests"][f"tp{tp}"]
    assert _artifact_digests(out) == golden
    verified = run_cli("verify", out, "--source", EXAMPLE)
    assert verified.exit_code == 0, verified.output


def test_vllm_manifests_record_no_scale_fill(tmp_path):
    """The fill is written to the target only where it is not 0, so vLLM artifacts are unchanged."""
    out = tmp_path / "out"
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "--out", out).exit_code == 0
    assert "scale_pad_fill" not in json.loads((out / "mxconvert.json").read_text())["target"]
