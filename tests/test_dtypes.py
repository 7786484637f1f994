"""Planning's dtypes by name (mxconvert/dtypes.py) agree with torch and with the safetensors library,
and the NVFP4 scale checks `select` runs without torch (float32 arithmetic in Python) reach the
verdicts torch reaches."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from mxconvert.core.dtypes import _TABLE, DType, TorchDTypes, dtype_named, from_safetensors, torch_dtype
from mxconvert.formats.nvfp4.checkpoint import _allclose_float32, _float32, _reciprocal_float32
from mxconvert.storage.safetensors_header import read_header
from mxconvert.storage.safetensors_io import StreamingWriter

NAMES = [name for name, _, _ in _TABLE]


@pytest.mark.parametrize("name", NAMES)
def test_a_name_is_its_torch_dtype(name):
    dtype = torch_dtype(name)
    assert isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}"
    assert DType(name).itemsize == dtype.itemsize
    assert dtype_named(dtype) == name == dtype_named(name) and type(dtype_named(dtype)) is DType
    assert torch_dtype(dtype) is dtype and torch_dtype(DType(name)) is dtype


@pytest.mark.parametrize("name", NAMES)
def test_headers_read_and_written_without_torch_match_the_safetensors_library(tmp_path, name):
    """The library writes a file holding the dtype: our header reader names it; we write one: the
    library reads it back as that dtype, with the same bytes."""
    dtype = torch_dtype(name)
    tensor = (torch.arange(48) % 2).to(torch.uint8).view(dtype).reshape(2, -1)  # bytes 0 and 1: valid bools
    save_file({"t": tensor}, tmp_path / "lib.safetensors")
    tensors, _ = read_header(tmp_path / "lib.safetensors")
    info = tensors["t"]
    assert type(info.dtype) is DType and info.dtype == name and info.shape == tuple(tensor.shape)
    assert from_safetensors(DType(name).safetensors) == name
    writer = StreamingWriter(tmp_path / "ours.safetensors", [("t", DType(name), tuple(tensor.shape))])
    writer.write("t", tensor)
    writer.close()
    back = load_file(tmp_path / "ours.safetensors")["t"]
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))


def test_unknown_dtypes_are_refused():
    assert from_safetensors("F4") is None and from_safetensors("U16") is None
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_named("complex64")


def test_a_table_of_dtype_names_gives_torch_dtypes_on_lookup():
    table = TorchDTypes({1: "uint8", 4: "int32"})
    assert table[1] is torch.uint8 and table[4] is torch.int32 and 4 in table and 2 not in table


def _f32_values() -> list[float]:
    """float32 values around every edge the scale checks meet: zero, subnormals, the smallest
    normal, one, the largest, the reciprocal overflow threshold, infinities, NaN; plus random ones."""
    special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        math.inf,
        -math.inf,
        math.nan,
        1e-45,
        1.1754944e-38,
        3.4028235e38,
        2.938736e-39,
        2.9387359e-39,
        2.9387361e-39,
        448.0,
        6.0,
        1 / 3,
    ]
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**31 - 1, (400,), generator=g, dtype=torch.int64).to(torch.int32)
    randoms = bits.view(torch.float32).tolist()
    values = [_float32(v) for v in special] + randoms
    # neighbours, one ulp apart, of each
    out = []
    for v in values:
        out.append(v)
        if math.isfinite(v):
            (i,) = struct.unpack("<i", struct.pack("<f", v))
            for j in (i - 1, i + 1):
                if -(2**31) <= j < 2**31:
                    out.append(struct.unpack("<f", struct.pack("<i", j))[0])
    return out


def test_the_float32_reciprocal_is_torchs():
    values = _f32_values()
    ours = [_reciprocal_float32(v) for v in values]
    theirs = (1.0 / torch.tensor(values, dtype=torch.float32)).tolist()
    for v, a, b in zip(values, ours, theirs):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), v


def test_the_float32_allclose_is_torchs_also_at_the_tolerance_edge():
    g = torch.Generator().manual_seed(1)
    base = torch.rand(300, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-30, 30, (300,), generator=g)
    base = base.to(torch.float32)
    pairs = []
    for b in base.tolist() + [1.0, 448.0, 1e-30, 6.0]:
        # steps of about the tolerance (1e-5 relative): either side of its edge, in ulps
        for rel in (0.0, 0.5e-5, 0.99e-5, 1e-5, 1.01e-5, 2e-5, 1e-3):
            other = _float32(b * (1 + rel))
            (i,) = struct.unpack("<i", struct.pack("<f", other))
            for j in (i - 2, i - 1, i, i + 1, i + 2):
                pairs.append((b, struct.unpack("<f", struct.pack("<i", j))[0]))
    pairs += [(0.0, 1e-8), (0.0, 1.1e-8), (1e-9, 0.0), (5e-9, 1.4e-8)]
    agree = close = 0
    for a, b in pairs:
        want = torch.allclose(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32))
        assert _allclose_float32(a, b) == want, (a, b)
        agree += 1
        close += want
    assert agree > 5000 and 0 < close < agree  # both verdicts met, many times


def test_the_float32_allclose_is_torchs_where_double_precision_would_differ():
    """The pairs where computing the tolerance in float64 gives the other verdict than float32
    (found over 2^20 values of b in [1.5, 1.625), a at the edge): torch's verdict is float32's."""
    import numpy as np

    b = np.arange(0x3FC00000, 0x3FC00000 + (1 << 20), dtype=np.int64).astype(np.int32).view(np.float32)
    allowed32 = np.float32(1e-8) + np.abs(np.float32(1e-5) * b)
    allowed64 = 1e-8 + 1e-5 * b.astype(np.float64)
    pairs = set()
    for steps in (np.floor(allowed / 2.0**-23) + k for allowed in (allowed32, allowed64) for k in (0, 1)):  # ulp 2^-23
        a = (b.astype(np.float64) + steps * 2.0**-23).astype(np.float32)
        differ = (np.abs(a - b) <= allowed32) != (np.abs(a.astype(np.float64) - b) <= allowed64)
        pairs |= {(float(x), float(y)) for x, y in zip(a[differ], b[differ])}
    assert len(pairs) >= 5
    for a, b_ in sorted(pairs):
        want = torch.allclose(torch.tensor(a, dtype=torch.float32), torch.tensor(b_, dtype=torch.float32))
        assert _allclose_float32(a, b_) == want, (a, b_)
        assert (abs(a - b_) <= 1e-8 + 1e-5 * abs(b_)) != want  # double precision would get it wrong
