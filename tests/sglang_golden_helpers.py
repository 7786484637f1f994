"""Helpers the SGLang golden tests share (tests/test_sglang_golden.py, test_sglang_marlin.py,
test_sglang_triton.py, test_sglang_nvfp4_golden.py): reading a golden of tools/golden/sglang_*.py,
the GPT-OSS checkpoint tensors padded as SGLang's `create_weights` pads them, an artifact's expert
tensors with their digests (the form of the goldens' example digests), and the example's conversion
for SGLang's row that each backend's test compares with those digests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

GOLDEN = Path(__file__).resolve().parent / "golden" / "sglang"


def read_golden(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a golden safetensors file, by name (`in.*`, `out.*`, `params.*`)."""
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def padded_gpt_oss(golden: dict[str, torch.Tensor], hp: int, ip: int, scale_fill: int) -> dict[str, torch.Tensor]:
    """The golden's checkpoint tensors (`in.*`, by SGLang's parameter name) padded at their ends to
    (Hp, Ip) as SGLang's `create_weights` allocates them: scales with `scale_fill`, the rest with 0."""
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
        fill = scale_fill if name in ("w13_weight_scale", "w2_weight_scale") else 0
        dst = torch.full(shape, fill, dtype=src.dtype)
        dst[tuple(slice(0, s) for s in src.shape)] = src
        out[name] = dst
    return out


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes in memory order (a 0-dim tensor's too)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def digest(t: torch.Tensor) -> dict:
    """dtype, shape and sha256 of the bytes: an entry of the goldens' example digests."""
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest(),
    }


def artifact_tensors(out: Path) -> Iterator[tuple[str, str, str, torch.Tensor]]:
    """(`rankN`, `layerL`, canonical name, tensor) of every tensor of the artifact in `out`."""
    manifest = json.loads((out / "mxconvert.json").read_text())
    for rank in manifest["ranks"]:
        for key, entry in rank["tensors"].items():
            with safe_open(str(out / entry["file"]), "pt") as f:
                tensor = f.get_tensor(key)
            yield f"rank{rank['rank']}", f"layer{entry['layer']}", entry["name"], tensor


def convert_example_for_sglang(out: Path, tp: int, *args: str) -> dict:
    """`mxconvert convert examples/tiny-gpt-oss --runtime sglang==0.5.23 ARGS --tp TP --out OUT`, which
    must succeed under SGLang's row with its 0x7F scale fill; the manifest's target."""
    from helpers import EXAMPLE, run_cli

    result = run_cli("convert", EXAMPLE, "--runtime", "sglang==0.5.23", *args, "--tp", str(tp), "--out", out)
    assert result.exit_code == 0, result.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert target["runtime_revision"] == "sglang-0.5.23"
    assert target["scale_pad_fill"] == 0x7F
    return target


def verify_accepts(out: Path) -> None:
    """`mxconvert verify OUT --source examples/tiny-gpt-oss` passes."""
    from helpers import EXAMPLE, run_cli

    verified = run_cli("verify", out, "--source", EXAMPLE)
    assert verified.exit_code == 0, verified.output
