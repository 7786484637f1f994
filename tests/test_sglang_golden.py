"""SGLang 0.5.23's GPT-OSS MXFP4 FlashInfer TRT-LLM (SM100) bytes against mxconvert's layout.

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` run on
CPU (tools/golden/sglang_mxfp4_trtllm.py, stand-ins named there). They show (docs/sglang.md):

* the moves are exactly the reused FlashInfer TRT-LLM layout (layouts/trtllm.py, vLLM 0.33's), with
  the sizes SGLang pads to (the `sglang-0.5.23` row's round-up: I -> 128, H -> 256), bit for bit;
* the one difference is the padding of the scales: SGLang's is 0x7F, mxconvert's canonical
  tensors pad with zeros; which is why `convert` refuses the backend under the SGLang row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts import resolve_layout
from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision
from mxconvert.target.sglang_revisions import get_sglang_revision

GOLDEN = Path(__file__).resolve().parent / "golden" / "sglang"
CASES = sorted(GOLDEN.glob("trtllm-sm100_sglang-0.5.23_*.safetensors"))
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
    """With mxconvert's canonical padding (zeros) the weights and biases still match SGLang's and
    the scales do not: the reason the SGLang row refuses this backend."""
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


def test_convert_refuses_the_backend_under_the_sglang_row():
    target = LayoutTarget(BACKEND, get_sglang_revision("sglang-0.5.23"), get_profile("b200"))
    with pytest.raises(UnsupportedError, match="0x7F"):
        build_layout("mxfp4", target)
