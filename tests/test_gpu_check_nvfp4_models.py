"""The NVFP4 checkpoints of the GPU serving check (tools/gpu_check/serve/models.py `write_qwen3_nvfp4`)
and the wiring of its NVFP4 cases (nvfp4_cases.py), on CPU at small sizes.

Held: each kind writes a Qwen3MoeForCausalLM checkpoint in its format's config (ModelOpt: both
`hf_quant_config.json` and `config.json["quantization_config"]`; compressed-tensors:
`nvfp4-pack-quantized`); `mxconvert convert --runtime vllm==0.26.0 --profile h100` makes a MARLIN
artifact of row vllm-0.25-nvfp4 that Marlin pads as vLLM 0.26.0 does, and `mxconvert verify` passes;
`--runtime vllm-0.26` (serve_check.convert's) is refused for NVFP4, and the later `--runtime` of
nvfp4_cases wins; the serving-check sizes are ones Marlin pads; `nvfp4_correctness` (with a stand-in for
the vLLM runs) converts each kind with the NVFP4 row, runs A, A', B with `--moe-backend marlin` and fills
`results["cases"]` in serve_check's shape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mxconvert.cli.main import app

SERVE = Path(__file__).resolve().parents[1] / "tools" / "gpu_check" / "serve"
sys.path.insert(0, str(SERVE))
import models  # noqa: E402
import nvfp4_cases  # noqa: E402

#: Small sizes (the serving check's are models.NVFP4_SIZES): hidden % 128 == 0 and an intermediate size
#: that is a multiple of 32 but not of 64, so Marlin pads it (96 -> 128), as it pads the serving check's.
SMALL = dict(
    layers=2, experts=4, experts_per_token=2, hidden=256, intermediate=96, heads=2, kv_heads=1, head_dim=64, vocab=2048
)


def cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvfp4-serve")
    return {kind: models.write_qwen3_nvfp4(root / kind, kind, **SMALL) for kind in models.NVFP4_KINDS}


def test_each_kind_is_a_qwen3_moe_checkpoint_in_its_format(checkpoints):
    for kind, ckpt in checkpoints.items():
        config = json.loads((ckpt / "config.json").read_text())
        assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["model_type"] == "qwen3_moe"
        assert (config["num_hidden_layers"], config["num_experts"], config["num_experts_per_tok"]) == (2, 4, 2)
        assert (config["hidden_size"], config["moe_intermediate_size"], config["vocab_size"]) == (256, 96, 2048)
        quant = config["quantization_config"]
        if kind == "modelopt":
            assert quant["quant_method"] == "modelopt" and quant["quant_algo"] == "NVFP4"
            legacy = json.loads((ckpt / "hf_quant_config.json").read_text())
            assert legacy["quantization"]["quant_algo"] == "NVFP4" and legacy["producer"]["name"] == "modelopt"
        else:
            assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "nvfp4-pack-quantized"
            assert not (ckpt / "hf_quant_config.json").exists()
    index = json.loads((checkpoints["ct"] / "model.safetensors.index.json").read_text())
    assert "model.layers.1.mlp.experts.3.down_proj.weight_packed" in index["weight_map"]


@pytest.mark.parametrize("kind", list(models.NVFP4_KINDS))
def test_the_checkpoint_converts_for_vllm_0_26_and_verifies(checkpoints, tmp_path, kind):
    out = tmp_path / "art"
    done = cli("convert", str(checkpoints[kind]), "--runtime", "vllm==0.26.0", "--profile", "h100", "-o", str(out))
    assert done.exit_code == 0, done.output
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert (target["runtime_revision"], target["backend"], target["format"]) == (nvfp4_cases.ROW, "MARLIN", "nvfp4")
    assert target["layout"]["intermediate_padded"] == 128  # Marlin's pad of 96 (hidden % 128 == 0: to 64s)
    verified = cli("verify", str(out))
    assert verified.exit_code == 0, verified.output


def test_the_release_not_the_mxfp4_row_picks_the_nvfp4_row(checkpoints, tmp_path):
    """serve_check.convert passes `--runtime vllm-0.26`, which has no NVFP4 layouts; nvfp4_cases adds
    `--runtime vllm==0.26.0` after it, and the last one is used."""
    refused = cli(
        "convert", str(checkpoints["ct"]), "--runtime", "vllm-0.26", "--profile", "h100", "-o", str(tmp_path / "x")
    )
    assert refused.exit_code == 2 and "defines no NVFP4 layouts" in refused.output
    assert not (tmp_path / "x").exists()
    out = tmp_path / "both"
    done = cli(
        "convert", str(checkpoints["ct"]), "-o", str(out), "--runtime", "vllm-0.26", "--profile", "h100",
        "--backend", "marlin", *nvfp4_cases.RUNTIME,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert nvfp4_cases.artifact_row(out) == nvfp4_cases.ROW


def test_the_serving_check_sizes_make_marlin_pad():
    """vLLM 0.26.0 `prepare_nvfp4_moe_layer_for_marlin`: hidden % 128 == 0 pads the intermediate size to a
    multiple of 64; mxconvert takes NVFP4 intermediate sizes in multiples of 32."""
    sizes = models.NVFP4_SIZES
    assert sizes["hidden"] % 128 == 0 and sizes["intermediate"] % 32 == 0 and sizes["intermediate"] % 64 != 0
    assert (sizes["layers"], sizes["experts"], sizes["experts_per_token"], sizes["vocab"]) == (2, 8, 2, 2048)


def test_nvfp4_correctness_fills_the_cases_in_serve_checks_shape(tmp_path, monkeypatch):
    """The vLLM runs stood in (no GPU here); the conversions are real (`mxconvert convert` of each kind)."""
    import serve_check

    monkeypatch.setattr(models, "NVFP4_SIZES", SMALL)
    runs: list[tuple[str, str, str, str]] = []

    def run_llm(work, tag, model, *, load_format="auto", backend="auto", extra=None, gen=True, parallel=()):
        runs.append((tag, Path(model).name, load_format, backend))
        if tag.startswith("F-"):
            return {"ok": False, "error_type": "MismatchError", "error": "field 'runtime_revision': ..."}
        outputs = [{"tokens": [1, 2], "prompt_logprobs": [[[5, "0x1.0p-1", 1]]], "logprobs": [[[2, "0x1.0p-2", 1]]]}]
        return {"ok": True, "outputs": outputs, "load": [{"seconds": 1.0}], "engine_ready_seconds": 2.0}

    def convert(work, ckpt, out, *args):  # serve_check.convert's command, in this process
        done = cli(
            "convert", str(ckpt), "-o", str(out), "--runtime", "vllm-0.26", "--profile", "h100", *args, "--force"
        )
        assert done.exit_code == 0, done.output
        return {"seconds": 0.0, "args": list(args)}

    results: dict = {"cases": {}, "fail_closed": {}, "timing": {}}
    nvfp4_cases.nvfp4_correctness(tmp_path, results, run_llm, convert, serve_check.compare, serve_check.load_figures)
    assert sorted(results["cases"]) == ["nvfp4-ct-marlin-tp1", "nvfp4-modelopt-marlin-tp1"]
    for case in results["cases"].values():
        assert case["runtime_row"] == nvfp4_cases.ROW
        assert case["convert"]["args"] == ["--backend", "marlin", "--tp", "1", *nvfp4_cases.RUNTIME]
        assert case["A_vs_B"]["bitwise_equal"] and case["A_vs_A2"]["bitwise_equal"]
        assert {"A", "B", "A_error", "B_error"} <= set(case)
    assert [(t, lf, b) for t, _, lf, b in runs if not t.startswith("F-")] == [
        (f"{side}-nvfp4-{kind}-marlin-tp1", "mxconvert" if side == "B" else "auto", "marlin")
        for kind in ("modelopt", "ct")
        for side in ("A", "A2", "B")
    ]
    assert results["fail_closed"]["nvfp4_other_row"]["refused"]
    assert nvfp4_cases.artifact_row(tmp_path / "art-nvfp4-modelopt-marlin-vllm-0.33") == "vllm-0.33"
    assert "nvfp4-ct-marlin-tp1 | True | True" in serve_check.table(results)
