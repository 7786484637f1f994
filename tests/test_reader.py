"""Reading checkpoints: HF and original layouts, hub cache, and refusal of bad input (exit 2)."""

from __future__ import annotations

import pytest
import torch
from fixtures_ckpt import (
    change_dtype,
    change_shape,
    corrupt_header,
    drop_tensor,
    index_points_to_missing_shard,
    make_checkpoint,
    make_hf_cache,
    set_quant_method,
    truncate,
)
from helpers import EXAMPLE, run_cli, run_cli_subprocess, tree_digest

from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4.checkpoint import EXPERT_TENSORS, expert_tensor_name, open_checkpoint


def test_example_checkpoint_is_read_with_the_facts_of_its_config():
    ckpt = open_checkpoint(str(EXAMPLE))
    f = ckpt.facts
    assert (f.model_type, f.quant_method, f.layout) == ("gpt_oss", "mxfp4", "hf")
    assert (f.num_layers, f.num_experts, f.hidden_size, f.intermediate_size) == (2, 4, 320, 320)
    assert ckpt.tensor(expert_tensor_name(f, 0, "gate_up_proj_blocks")).shape == (4, 640, 10, 16)
    others = ckpt.other_tensor_names()
    assert "model.embed_tokens.weight" in others and "lm_head.weight" in others
    assert not any(".experts." in n for n in others)


def test_original_layout_holds_the_same_expert_bytes_as_the_hf_layout(tmp_path):
    hf = open_checkpoint(str(make_checkpoint(tmp_path / "a", layout="hf")))
    orig = open_checkpoint(str(make_checkpoint(tmp_path / "b", layout="original")))
    assert orig.layout == "original" and orig.root.name == "original"
    assert orig.facts.num_experts == hf.facts.num_experts
    for layer in range(hf.facts.num_layers):
        for t in EXPERT_TENSORS:
            a = hf.tensor(expert_tensor_name(hf.facts, layer, t))
            b = orig.tensor(expert_tensor_name(orig.facts, layer, t))
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (layer, t)


def test_hub_repo_id_is_read_from_a_local_cache_without_network(tmp_path):
    cache = make_hf_cache(tmp_path)
    ckpt = open_checkpoint(cache.repo_id, cache_dir=str(cache.cache_dir))
    assert ckpt.identity.kind == "hub"
    assert ckpt.identity.repo_id == cache.repo_id and ckpt.identity.revision == cache.revision
    assert ckpt.facts.num_experts == 4


def test_hub_offline_env_vars_are_honoured_by_the_cli(tmp_path):
    cache = make_hf_cache(tmp_path)
    result = run_cli_subprocess("select", cache.repo_id, "--profile", "h100", "--json", env=cache.env())
    assert result.returncode == 0, result.stderr
    assert '"backend": "TRITON"' in result.stdout


def test_hub_repo_missing_from_an_offline_cache_is_refused(tmp_path):
    cache = make_hf_cache(tmp_path)
    result = run_cli_subprocess("select", "openai/not-there", "--profile", "h100", env=cache.env())
    assert result.returncode == 2
    assert "openai/not-there" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "Traceback" not in result.stderr


EXPERT = "model.layers.1.mlp.experts.gate_up_proj_blocks"


def _shard_of(ckpt_dir, name):
    import json

    index = json.loads((ckpt_dir / "model.safetensors.index.json").read_text())
    return ckpt_dir / index["weight_map"][name]


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("missing_tensor", ["missing tensor", EXPERT]),
        ("wrong_dtype", [EXPERT, "dtype float16", "expected uint8"]),
        ("wrong_shape", [EXPERT, "shape [4, 640, 10, 8]", "expected [4, 640, 10, 16]"]),
        ("quant_method", ["config.json", "'fp8'", "mxfp4"]),
        ("no_quant_config", ["config.json", "quantization_config"]),
        ("corrupt_header", [".safetensors", "corrupt"]),
        ("truncated", [".safetensors", "truncated", "model.layers"]),
        ("missing_shard", ["model.safetensors.index.json", "do not exist"]),
    ],
)
def test_bad_checkpoints_are_refused_with_file_tensor_and_expectation(tmp_path, fault, expected):
    ckpt = make_checkpoint(tmp_path)
    if fault == "missing_tensor":
        drop_tensor(ckpt, EXPERT)
    elif fault == "wrong_dtype":
        change_dtype(ckpt, EXPERT, torch.float16)
    elif fault == "wrong_shape":
        change_shape(ckpt, EXPERT, (4, 640, 10, 8))
    elif fault == "quant_method":
        set_quant_method(ckpt, "fp8")
    elif fault == "no_quant_config":
        set_quant_method(ckpt, None)
    elif fault == "corrupt_header":
        corrupt_header(_shard_of(ckpt, EXPERT))
    elif fault == "truncated":
        truncate(_shard_of(ckpt, EXPERT), 1000)
    elif fault == "missing_shard":
        index_points_to_missing_shard(ckpt)
    before = tree_digest(ckpt)
    with pytest.raises(InputError) as err:
        open_checkpoint(str(ckpt))
    for text in expected:
        assert text in str(err.value), (text, str(err.value))
    result = run_cli("convert", ckpt, "--profile", "h100", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert "error:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
    assert tree_digest(ckpt) == before


def test_not_a_checkpoint_folder_and_not_a_repo_id(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run_cli("select", tmp_path / "empty", "--profile", "h100").exit_code == 2
    result = run_cli("select", "no such thing here", "--profile", "h100")
    assert result.exit_code == 2 and "not a Hugging Face repo id" in result.stderr
