"""docs/sglang.md, "vLLM and SGLang artifacts of one checkpoint": for the same kernel (TRT-LLM MXFP4 x
MXFP8 on a B200) the two engines' artifacts of examples/tiny-gpt-oss differ only in the padded scale
bytes (SGLang fills 0x7F, vLLM 0) and the target's engine fields; `mxconvert inspect A B` says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-gpt-oss"


def mx(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mxconvert", *args], capture_output=True, text=True, cwd=REPO)


def test_inspect_shows_only_the_scale_padding_and_the_engine_differ(tmp_path):
    vllm, sglang = tmp_path / "vllm", tmp_path / "sglang"
    common = ["convert", str(EXAMPLE), "--profile", "b200"]
    assert mx(*common, "--runtime", "vllm-0.33", "--backend", "flashinfer_trtllm_afp8", "-o", str(vllm)).returncode == 0
    assert mx(*common, "--runtime", "sglang==0.5.23", "-o", str(sglang)).returncode == 0
    shown = mx("inspect", str(vllm), str(sglang))
    assert shown.returncode == 1, shown.stderr  # differ
    lines = [line.strip() for line in shown.stdout.splitlines() if line.strip()]
    assert lines[0] == f"different: A = {vllm}, B = {sglang}"
    fields = [line for line in lines[1:] if line.startswith("target ")]
    assert [f.split(":")[0] for f in fields] == [
        "target kernel_class",
        "target runtime_revision",
        "target runtime_release",
    ]
    tensors = [line for line in lines[1:] if line.startswith("layer ")]
    assert tensors and all(line.split(":")[0].endswith("_scale") for line in tensors), tensors
    assert all("same layout, different bytes" in line for line in tensors)
    weights = {f"layer {i} {name}" for i in (0, 1) for name in ("w13_weight_scale", "w2_weight_scale")}
    assert {line.split(":")[0] for line in tensors} == weights
