"""NVFP4 MoE checkpoints through the same pipeline: reading both formats, canonical assembly,
layouts (moves with exact inverses; scales recomputed), convert/verify per backend, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_nvfp4 import EXAMPLE_DIRS, make_nvfp4_checkpoint
from helpers import EXAMPLE, run_cli, torch_specs

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.formats.nvfp4.checkpoint import NVFP4_NAMES, plan_nvfp4_ranks
from mxconvert.formats.registry import Geometry, open_model
from mxconvert.layouts import nvfp4_layout
from mxconvert.target.backends import Nvfp4Backend as NB
from mxconvert.target.revisions import get_revision

QWEN_MO, QWEN_CT = EXAMPLE_DIRS["tiny-nvfp4-modelopt-qwen3"], EXAMPLE_DIRS["tiny-nvfp4-ct-qwen3"]
DS_MO, DS_CT = EXAMPLE_DIRS["tiny-nvfp4-modelopt-deepseek"], EXAMPLE_DIRS["tiny-nvfp4-ct-deepseek"]


def test_examples_are_read_with_their_facts():
    q, d = open_model(str(QWEN_CT)), open_model(str(DS_MO))
    assert (q.format_name, q.facts.quant_format, q.facts.model_type) == ("nvfp4", "compressed-tensors", "qwen3_moe")
    assert (q.facts.num_experts, q.facts.hidden_size, q.facts.intermediate_size, q.moe_layers) == (4, 256, 128, [0, 1])
    assert (d.facts.quant_format, d.facts.model_type, d.moe_layers) == ("modelopt", "deepseek_v3", [1, 2])
    others = d.other_tensor_names()
    assert any("shared_experts" in n for n in others) and any(n.startswith("model.layers.0.mlp.") for n in others)


def test_canonical_w13_is_gate_then_up_rows_of_the_rank_and_scales_are_decode_scales(tmp_path):
    mo, ct = open_model(str(QWEN_MO)), open_model(str(QWEN_CT))
    for plan in plan_nvfp4_ranks(mo.facts, 2, 1):
        a = mo.load_canonical(1, plan, None, NVFP4_NAMES)
        b = ct.load_canonical(1, plan, None, NVFP4_NAMES)
        s, t = plan.i_start, plan.i_end
        for e in range(4):
            gate = mo.tensor(f"model.layers.1.mlp.experts.{e}.gate_proj.weight")
            up = mo.tensor(f"model.layers.1.mlp.experts.{e}.up_proj.weight")
            down = mo.tensor(f"model.layers.1.mlp.experts.{e}.down_proj.weight_scale")
            assert torch.equal(a["w13_weight"][e], torch.cat([gate[s:t], up[s:t]]))
            assert torch.equal(a["w2_weight_scale"][e].view(torch.uint8), down[:, s // 16 : t // 16].view(torch.uint8))
            ws2 = mo.tensor(f"model.layers.1.mlp.experts.{e}.gate_proj.weight_scale_2")
            assert a["w13_weight_scale_2"][e] == ws2
            gs = ct.tensor(f"model.layers.1.mlp.experts.{e}.gate_proj.weight_global_scale")
            assert b["w13_weight_scale_2"][e] == (1.0 / gs.float()).reshape(())  # vLLM's float32 reciprocal
        for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
            assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
        torch.testing.assert_close(a["w13_input_scale"], b["w13_input_scale"], rtol=1e-6, atol=0)


def test_gate_up_global_scales_that_differ_are_kept_as_gate_with_a_warning(tmp_path):
    ckpt = open_model(str(make_nvfp4_checkpoint(tmp_path, gate_up_global_scale_differ=True)))
    assert ckpt.warnings and "gate and up weight global scales differ" in ckpt.warnings[0]
    result = run_cli("convert", ckpt.root, "--profile", "b200", "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0 and "warning:" in result.stderr
    assert json.loads(result.stdout)["warnings"] == ckpt.warnings


BACKENDS_033 = [
    ("b200", "flashinfer_trtllm", "FLASHINFER_TRTLLM"),
    ("b200", "flashinfer_cutlass", "FLASHINFER_CUTLASS"),
    ("b200", "flashinfer_cutedsl", "FLASHINFER_CUTEDSL"),
    ("b200", "cutlass", "VLLM_CUTLASS"),
    ("h100", "marlin", "MARLIN"),
    ("rtx-pro-6000", "auto", "FLASHINFER_CUTLASS"),
]


@pytest.mark.parametrize("example", [QWEN_MO, QWEN_CT], ids=["modelopt", "ct"])
@pytest.mark.parametrize("profile, name, backend", BACKENDS_033, ids=[b[1] + "-" + b[0] for b in BACKENDS_033])
def test_every_nvfp4_backend_converts_and_verifies(tmp_path, example, profile, name, backend):
    out = tmp_path / "out"
    result = run_cli("convert", example, "--profile", profile, "--backend", name, "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert manifest["target"]["backend"] == backend and manifest["target"]["format"] == "nvfp4"
    verified = run_cli("verify", out, "--json")
    assert verified.exit_code == 0, verified.stdout
    assert json.loads(verified.stdout)["ok"]


def test_older_revision_converts_and_differs_where_the_spec_says(tmp_path):
    for rev in ("vllm-0.33", "vllm-0.15"):
        assert run_cli("convert", QWEN_MO, "--profile", "b200", "--runtime", rev, "-o", tmp_path / rev).exit_code == 0
        assert run_cli("verify", tmp_path / rev).exit_code == 0
    new = json.loads((tmp_path / "vllm-0.33" / "mxconvert.json").read_text())["ranks"][0]["tensors"]
    old = json.loads((tmp_path / "vllm-0.15" / "mxconvert.json").read_text())["ranks"][0]["tensors"]
    assert "model.layers.0.mlp.experts.g1_alphas" in old and "model.layers.0.mlp.experts.g1_alphas" not in new


def test_global_scales_are_folded_exactly_as_vllm_033_does(tmp_path):
    """TRTLLM (a global-SF backend): a = max over every expert's input scale, repeated per expert;
    w13_weight_scale_2 = gate's weight_scale_2 * a (one float32 multiply)."""
    from mxconvert import load_artifact

    assert run_cli("convert", QWEN_MO, "--profile", "b200", "-o", tmp_path / "a").exit_code == 0
    art = load_artifact(tmp_path / "a")
    ckpt = open_model(str(QWEN_MO))
    for layer in (0, 1):
        a13 = max(
            float(ckpt.tensor(f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.input_scale"))
            for e in range(4)
            for p in ("gate", "up")
        )
        a13 = torch.tensor(a13, dtype=torch.float32)
        got = art.tensors[f"model.layers.{layer}.mlp.experts.w13_weight_scale_2"]
        want = torch.stack(
            [
                ckpt.tensor(f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight_scale_2").float() * a13
                for e in range(4)
            ]
        )
        assert torch.equal(got, want)
        assert torch.equal(art.tensors[f"model.layers.{layer}.mlp.experts.w13_input_scale"], a13.repeat(4))


@pytest.mark.parametrize(
    "backend",
    [
        NB.FLASHINFER_TRTLLM,
        NB.FLASHINFER_CUTLASS,
        NB.VLLM_CUTLASS,
        NB.FLASHINFER_CUTEDSL,
        NB.FLASHINFER_CUTEDSL_BATCHED,
        NB.MARLIN,
    ],
)
@pytest.mark.parametrize("K, N", [(256, 128), (128, 96), (320, 64)])
def test_nvfp4_moves_invert_exactly(backend, K, N):
    revision = get_revision("vllm-0.33", "nvfp4")
    try:
        layout = nvfp4_layout(backend, revision, K, N, 2)
        tensors = layout.tensors
    except UnsupportedError:
        assert backend in (NB.FLASHINFER_CUTLASS, NB.VLLM_CUTLASS, NB.FLASHINFER_CUTEDSL_BATCHED) and (2 * N) % 128
        return
    specs = torch_specs(Geometry("nvfp4", K, N).specs(2))
    g = torch.Generator().manual_seed(K + N)
    for name, t in tensors.items():
        dtype, shape = specs[name]
        x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(dtype)
        y = t.forward(x)
        assert torch.equal(t.inverse(y, shape, dtype).view(torch.uint8), x.view(torch.uint8)), name
        assert torch.equal(t.forward(x, engine="torch").view(torch.uint8), y.view(torch.uint8)), name


def test_shapes_a_backend_cannot_run_are_refused_with_the_reason(tmp_path):
    result = run_cli("convert", DS_CT, "--profile", "rtx-pro-6000", "-o", tmp_path / "out")
    assert result.exit_code == 2 and "not a multiple of 128" in result.stderr
    assert not (tmp_path / "out").exists()


def test_revisions_without_the_format_are_refused(tmp_path):
    result = run_cli("convert", QWEN_MO, "--profile", "b200", "--runtime", "vllm-0.20", "-o", tmp_path / "o")
    assert result.exit_code == 2 and "defines no NVFP4 layouts" in result.stderr and "vllm-0.33" in result.stderr
    result = run_cli("convert", EXAMPLE, "--profile", "b200", "--runtime", "vllm-0.15", "-o", tmp_path / "o")
    assert result.exit_code == 2 and "defines no MXFP4 layouts" in result.stderr


def test_w4a16_checkpoint_runs_marlin_without_input_scales(tmp_path):
    ckpt = make_nvfp4_checkpoint(tmp_path, w4a16=True)
    out = tmp_path / "out"
    result = run_cli("convert", ckpt, "--profile", "b200", "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    m = json.loads((out / "mxconvert.json").read_text())
    assert m["target"]["backend"] == "MARLIN"
    assert not any("input_scale" in k for k in m["ranks"][0]["tensors"])
    assert run_cli("verify", out).exit_code == 0


@pytest.mark.parametrize("fault", ["missing", "dtype", "algo"])
def test_bad_nvfp4_checkpoints_are_refused(tmp_path, fault):
    from safetensors.torch import load_file, save_file

    ckpt = make_nvfp4_checkpoint(tmp_path)
    name = "model.layers.1.mlp.experts.2.up_proj.weight_scale"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shard = ckpt / index["weight_map"][name]
    if fault == "algo":
        cfg = json.loads((ckpt / "hf_quant_config.json").read_text())
        cfg["quantization"]["quant_algo"] = "FP8"
        (ckpt / "hf_quant_config.json").write_text(json.dumps(cfg))
        (ckpt / "config.json").write_text(
            json.dumps(
                {k: v for k, v in json.loads((ckpt / "config.json").read_text()).items() if k != "quantization_config"}
            )
        )
        expected = "'FP8' is not NVFP4"
    else:
        tensors = load_file(shard)
        if fault == "missing":
            del tensors[name]
            index["weight_map"].pop(name)
            (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
            expected = "missing tensor"
        else:
            tensors[name] = tensors[name].float()
            expected = "expected float8_e4m3fn"
        save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(InputError) as err:
        open_model(str(ckpt))
    assert expected in str(err.value)
    result = run_cli("select", ckpt, "--profile", "b200")
    assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_expert_parallel_input_scales_follow_the_checkpoint_format(tmp_path):
    """ModelOpt holds every global expert's input scale for global-SF backends (its max spans all
    experts); compressed-tensors holds only the rank's (as vLLM 0.33.0 compressed_tensors_moe.py)."""
    from mxconvert import load_artifact

    for name, example in (("mo", QWEN_MO), ("ct", QWEN_CT)):
        assert run_cli("convert", example, "--profile", "b200", "--ep", "2", "-o", tmp_path / name).exit_code == 0
        assert run_cli("verify", tmp_path / name).exit_code == 0
    ckpt = open_model(str(QWEN_MO))

    def a13(experts):
        return max(
            float(ckpt.tensor(f"model.layers.0.mlp.experts.{e}.{p}_proj.input_scale"))
            for e in experts
            for p in ("gate", "up")
        )

    mo = load_artifact(tmp_path / "mo", rank=1).tensors["model.layers.0.mlp.experts.w13_input_scale"]
    ct = load_artifact(tmp_path / "ct", rank=1).tensors["model.layers.0.mlp.experts.w13_input_scale"]
    assert mo.shape == (2,) and float(mo[0]) == pytest.approx(a13(range(4)), rel=0)
    assert float(ct[0]) == pytest.approx(a13(range(2, 4)), rel=1e-6)


BACKENDS_015 = [
    ("b200", [], "FLASHINFER_TRTLLM"),
    ("b200", ["VLLM_USE_FLASHINFER_MOE_FP4=1", "VLLM_FLASHINFER_MOE_BACKEND=throughput"], "FLASHINFER_CUTLASS"),
    # the older CuteDSL kernel is the masked (batched-format) one
    (
        "b200",
        ["VLLM_USE_FLASHINFER_MOE_FP4=1", "VLLM_FLASHINFER_MOE_BACKEND=masked_gemm", "--batched"],
        "FLASHINFER_CUTEDSL",
    ),
    ("b200", ["VLLM_TEST_FORCE_FP8_MARLIN=1"], "MARLIN"),
    ("h100", [], "MARLIN"),
]


@pytest.mark.parametrize("example", [QWEN_MO, QWEN_CT, DS_MO], ids=["modelopt-qwen3", "ct-qwen3", "modelopt-deepseek"])
@pytest.mark.parametrize("profile, env, backend", BACKENDS_015, ids=[b[2] + "-" + b[0] for b in BACKENDS_015])
def test_every_nvfp4_backend_of_the_older_revision_converts_and_verifies(tmp_path, example, profile, env, backend):
    args = [a for item in env for a in ((item,) if item.startswith("--") else ("--env", item))]
    out = tmp_path / "out"
    result = run_cli("convert", example, "--profile", profile, "--runtime", "vllm-0.15", *args, "-o", out)
    if example == DS_MO and backend != "MARLIN":  # N = 96: the older revision pads nothing and refuses
        assert result.exit_code == 2 and "128" in result.stderr
        return
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert (manifest["target"]["backend"], manifest["target"]["runtime_revision"]) == (backend, "vllm-0.15")
    assert run_cli("verify", out).exit_code == 0
