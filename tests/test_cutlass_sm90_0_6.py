"""The `sm90-interleave-0.6` CUTLASS layout (docs/layouts.md, "CUTLASS", C2c): FlashInfer
0.6.11.post2-0.6.16.post3's SM90 fp4 weight interleave as a move of 4-bit codes.

Held three ways: its inverse round-trips on every engine; its closed form equals the thread-by-thread
transcription of the CUDA kernel (tools/golden/release_standins.py `sm90_fp4_weights_0_6`, itself
checked on an H200: tools/golden/device_sm90_fp4_0_6.json); and for one recorded shape it gives the
bytes vLLM 0.22.0-0.28.0's own weight processing gave (tests/golden/tensors/vllm-X.Y.Z-mxfp4.json).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from mxconvert.layouts.cutlass import cutlass_tensors
from mxconvert.target.releases import row_for_release
from mxconvert.target.revisions import REVISIONS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "golden"))
from release_standins import sm90_fp4_weights_0_6  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "vllm_releases_tensor_table_c2c", REPO / "tools/vllm_releases/tensor_table.py"
)
assert _spec is not None and _spec.loader is not None
T = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = T
_spec.loader.exec_module(T)

LAYOUT = {t.name: t for t in cutlass_tensors("sm90-interleave-0.6")}
OLDER = {t.name: t for t in cutlass_tensors("sm90-scale-interleave")}
CLAIMED = ("0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0")
SHAPES = [(1, 16, 32), (2, 32, 64), (3, 48, 96), (2, 256, 128), (1, 1440, 1440)]  # [E, rows, K/2 bytes]


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_weights_equal_the_kernel_transcription(shape):
    w = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(606))
    want = torch.stack([sm90_fp4_weights_0_6(w[e]) for e in range(shape[0])])
    assert not torch.equal(want, w)  # the kernel moves bytes: the comparison is not of an identity
    for engine in ("auto", "gather", "arrange", "torch"):
        assert torch.equal(LAYOUT["w2_weight"].forward(w, engine), want), engine


@pytest.mark.parametrize("name", ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"])
@pytest.mark.parametrize("engine", ["auto", "torch"])
def test_round_trip(name, engine):
    shape = (2, 64, 64) if "scale" not in name else (2, 64, 8)
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    layout = LAYOUT[name]
    buffer = layout.forward(x, engine)
    assert buffer.dtype == torch.uint8 and buffer.numel() == x.numel()
    assert torch.equal(layout.inverse(buffer, tuple(x.shape), torch.uint8, engine), x)


def test_shapes_the_kernel_does_not_fill_are_refused():
    with pytest.raises(ValueError, match="K % 64 == 0"):
        LAYOUT["w2_weight"].buffer_spec((1, 16, 48), torch.uint8)  # K = 96
    with pytest.raises(ValueError, match="rows % 16 == 0"):
        LAYOUT["w2_weight"].buffer_spec((1, 24, 32), torch.uint8)


@pytest.mark.parametrize("release", CLAIMED)
def test_recorded_bytes_of_one_shape(release):
    """vLLM `release`'s own FLASHINFER_CUTLASS_MXFP4_BF16 weights for e1_h96_i96 (Hp = Ip = 128),
    laid out directly and through the row `vllm==release` resolves to."""
    doc = T.load(T.TENSORS / f"vllm-{release}-mxfp4.json")
    case = next(
        c for c in doc["cases"] if c["backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16" and c["shape"] == "e1_h96_i96"
    )
    canonical = T._mxfp4_inputs(case["E"], case["H"], case["I"], case["Hp"], case["Ip"], case["seed"])
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
        mine = LAYOUT[name].forward(canonical[name])
        recorded = case["tensors"][name]
        assert (_sha(mine), list(mine.shape)) == (recorded["sha256"], recorded["shape"]), name
    for name in ("w13_weight", "w2_weight"):  # the weights are what C2c changes from C2b
        assert _sha(OLDER[name].forward(canonical[name])) != case["tensors"][name]["sha256"], name
    row = row_for_release(release, "mxfp4")
    assert row is not None and row.cutlass_sm90_layout == "sm90-interleave-0.6"
    assert "FLASHINFER_CUTLASS_MXFP4_BF16" not in dict(row.unproven_layouts)
    assert T.compare("mxfp4", case, row.name) == ("equal", [])


def test_claimed_releases_are_the_rows_that_use_it():
    """Exactly the rows covering 0.22.0-0.28.0 use C2c, and the committed table agrees."""
    covering = [row_for_release(r, "mxfp4") for r in CLAIMED]
    rows = {row.name for row in covering if row is not None}
    assert len(rows) == 6 and None not in covering
    using = {r.name for r in REVISIONS.values() if r.cutlass_sm90_layout == "sm90-interleave-0.6"}
    assert rows == using
    assert json.loads((T.TENSORS / "expected_rows.json").read_text())["mxfp4"]["0.26.0"]["backends"][
        "FLASHINFER_CUTLASS_MXFP4_BF16"
    ] == sorted(using)
