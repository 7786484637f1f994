"""The host data path of `convert` and `verify` runs numpy alone (mxconvert/bits.py).

Importing torch costs seconds per command (bench/CHANGELOG.md, "Session 6"), more than the rest of a
conversion on a fast machine. A GPT-OSS checkpoint's conversion and verification only move, pack
and compare bits, so on the host they must not import torch at all: checked here through the
command line's entry for backends of every kind of codec (the Hopper fp4 pack, the bias widening
cast and the scale relabel, AITER's moves), with tensor parallelism and split tensors (400KB
shards); `inspect` of checkpoints and artifacts imports neither (it reads headers and manifests).
That the bytes equal those of the torch path is tests/test_device.py's
`test_convert_and_verify_on_the_portable_path_write_the_host_bytes`; that every layout's host
form equals its torch form, `test_portable_path_gives_the_host_bytes_both_ways` there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_startup import _RUN_AND_REPORT

from mxconvert.core.bits import bits_dtype, from_torch, nan_positions, to_torch
from mxconvert.layouts.codecs import WideningCast
from mxconvert.layouts.errors import InverseError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-gpt-oss"


def test_convert_and_verify_of_gpt_oss_import_no_torch(tmp_path):
    runs = []
    targets = (("h100", []), ("b200", ["--tp", "2"]), ("mi355x", []), ("h100", ["--max-shard-size", "400KB"]))
    for profile, extra in targets:
        out = str(tmp_path / f"{profile}{len(runs)}")
        runs.append(["convert", str(EXAMPLE), "-p", profile, *extra, "-o", out, "--json"])
        runs.append(["verify", out, "--source", str(EXAMPLE), "--json"])
    runs.append(runs[0])  # a rerun finds the artifact up to date (it reads and checks the manifest)
    several = str(tmp_path / "several")  # several targets in one command: OUT/<profile>-tp<N>/
    runs.append(
        ["convert", str(EXAMPLE), "-p", "h100", "-p", "mi355x", "--tp", "1", "--tp", "2", "-o", several, "--json"]
    )
    runs.append(["verify", str(tmp_path / "several" / "mi355x-tp2"), "--json"])
    # inspect reads headers and manifests: checkpoints of both formats and an artifact, text and JSON
    runs += [
        ["inspect", str(EXAMPLE)],
        ["inspect", str(ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"), "--json"],
        ["inspect", str(tmp_path / "several" / "h100-tp2")],
        ["inspect", several + "/mi355x-tp1", "--json"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, json.dumps(runs)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["args"] for r in reports] == runs
    for report in reports:
        assert report["code"] == 0 and "torch" not in report["heavy"], report
    assert "numpy" in reports[0]["heavy"]  # the data path ran (numpy is what it runs on)
    assert sorted(p.name for p in (tmp_path / "several").iterdir()) == [
        "h100-tp1",
        "h100-tp2",
        "mi355x-tp1",
        "mi355x-tp2",
    ]


def test_bits_round_trip_through_torch_without_a_copy():
    for dtype in (torch.uint8, torch.bfloat16, torch.float8_e4m3fn, torch.float32, torch.int32):
        t = torch.arange(24, dtype=torch.int32).to(dtype).reshape(2, 3, 4)
        bits = from_torch(t)
        assert bits.dtype == bits_dtype(str(dtype)) and bits.shape == (2, 3, 4)
        back = to_torch(bits, str(dtype))
        assert back.dtype == dtype and back.data_ptr() == t.data_ptr()


def test_nan_positions_agree_with_torch():
    values = torch.tensor([0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), -float("nan")])
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        t = values.to(dtype)
        assert np.array_equal(nan_positions(from_torch(t), str(dtype)), torch.isnan(t).numpy()), dtype
    every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    e4m3 = every_byte.view(torch.float8_e4m3fn)
    assert np.array_equal(nan_positions(from_torch(e4m3), "float8_e4m3fn"), torch.isnan(e4m3.float()).numpy())
    for dtype in (torch.float8_e5m2, torch.float8_e8m0fnu):  # every float dtype of mxconvert/dtypes.py has NaN
        every = every_byte.view(dtype)
        found = nan_positions(from_torch(every), str(dtype).removeprefix("torch."))
        assert found is not None and np.array_equal(found, torch.isnan(every.float()).numpy()), dtype
    assert nan_positions(from_torch(every_byte), "uint8") is None


def test_widening_cast_on_bits_is_torchs_cast_and_refuses_what_torch_refuses():
    cast = WideningCast("bf16 -> fp32", "float32")
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # every bf16 bit pattern
    widened = cast.encode_bits(from_torch(every), "bfloat16")
    assert np.array_equal(widened, from_torch(every.float()))
    finite = every[~torch.isnan(every)].float()
    assert np.array_equal(cast.decode_bits(from_torch(finite), "bfloat16"), from_torch(finite.bfloat16()))
    for word in (0x3F800001, 0x7FC00000, 0x7FC00001, 0xFFC00000, 0x7F810000):  # inexact, NaN
        bits = np.array([word], dtype=np.uint32).view(np.int32)
        with pytest.raises(InverseError):
            cast.decode(to_torch(bits, "float32"), torch.bfloat16)
        with pytest.raises(InverseError):
            cast.decode_bits(bits, "bfloat16")
