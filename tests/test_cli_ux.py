"""CLI for CI pipelines and people (issue 12): one backend vocabulary, plans that fail where the run
fails, no silently accepted option, idempotent re-runs, strict profile files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_ckpt import make_checkpoint
from helpers import EXAMPLE, run_cli, tree_digest

import mxconvert
from mxconvert.core.errors import MismatchError
from mxconvert.selection import moe_backend_names
from mxconvert.target.revisions import get_revision


def _convert(out, *args, env=None):
    result = run_cli("convert", EXAMPLE, "-o", out, "--json", *args, env=env)
    return result, (json.loads(result.stdout) if result.exit_code == 0 else None)


# ---- item 3: one vocabulary -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "profile, name, backend",
    [
        ("h100", "TRITON", "TRITON"),
        ("h100", "triton", "TRITON"),
        ("h100", "Triton", "TRITON"),
        ("b200", "FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_BF16"),
        ("b200", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "FLASHINFER_TRTLLM_MXFP4_MXFP8"),  # via flashinfer_trtllm_afp8
        ("a100", "MARLIN", "MARLIN"),
        ("mi355x-aiter", "AITER_MXFP4_BF16", "AITER_MXFP4_BF16"),
    ],
)
def test_backend_accepts_enum_names_and_moe_backend_names(tmp_path, profile, name, backend):
    result = run_cli("select", EXAMPLE, "-p", profile, "--backend", name, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backend"] == backend


def test_every_backend_select_prints_can_be_passed_back():
    """No name select prints is 'unknown' to --backend: it is chosen, or refused with vLLM's reason."""
    for profile in ("h100", "b200", "mi355x", "a100"):
        shown = json.loads(run_cli("select", EXAMPLE, "-p", profile, "--json").stdout)
        for c in shown["considered"]:
            result = run_cli("select", EXAMPLE, "-p", profile, "--backend", c["backend"], "--json")
            assert "unknown backend" not in result.stderr, (profile, c["backend"], result.stderr)
            if result.exit_code == 0:
                assert json.loads(result.stdout)["backend"] == c["backend"]
            else:
                assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_an_enum_name_vllm_would_not_pick_is_refused_with_the_reason():
    result = run_cli("select", EXAMPLE, "-p", "h100", "--backend", "FLASHINFER_TRTLLM_MXFP4_BF16")
    assert result.exit_code == 2 and "FLASHINFER_TRTLLM_MXFP4_BF16" in result.stderr
    bogus = run_cli("select", EXAMPLE, "-p", "h100", "--backend", "fastest")
    assert bogus.exit_code == 2 and "triton" in bogus.stderr and "TRITON_UNFUSED" in bogus.stderr


def test_moe_backend_names_still_cover_the_revision():
    names = moe_backend_names(get_revision("vllm-0.33"))
    for name in names:
        result = run_cli("select", EXAMPLE, "-p", "h100", "--backend", name)
        assert result.exit_code in (0, 2) and "unknown" not in result.stderr, name


def test_load_artifact_expect_takes_both_vocabularies(tmp_path):
    out = tmp_path / "art"
    assert _convert(out, "-p", "h100")[0].exit_code == 0
    for name in ("TRITON", "triton", "Triton"):
        assert mxconvert.load_artifact(out, expect={"backend": name}).target["backend"] == "TRITON"
    with pytest.raises(MismatchError):
        mxconvert.load_artifact(out, expect={"backend": "marlin"})
    with pytest.raises(MismatchError):
        mxconvert.load_artifact(out, expect={"backend": "FLASHINFER_TRTLLM_MXFP4_BF16"})


# ---- item 4: plans exit as the run would ------------------------------------------------------------------
def test_select_and_dry_run_fail_where_convert_fails(tmp_path):
    out = tmp_path / "art"
    for cmd in (
        ["select", EXAMPLE, "-p", "h100", "--ep", "3"],
        ["convert", EXAMPLE, "-p", "h100", "--ep", "3", "-o", out, "--dry-run"],
        ["convert", EXAMPLE, "-p", "h100", "--ep", "3", "-o", out],
    ):
        result = run_cli(*cmd)
        assert result.exit_code == 2 and "--ep 3" in result.stderr, cmd
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    dry = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out, "--dry-run")
    real = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out)
    assert dry.exit_code == real.exit_code == 2 and "--force" in dry.stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_dry_run_and_real_run_print_the_same_schema(tmp_path):
    out = tmp_path / "art"
    dry, plan = _convert(out, "-p", "b200", "--dry-run")
    real, done = _convert(out, "-p", "b200")
    assert dry.exit_code == real.exit_code == 0
    assert set(plan) == set(done)
    assert (plan["schema"], plan["status"], plan["dry_run"]) == ("mxconvert.convert/1", "planned", True)
    assert (done["status"], done["dry_run"]) == ("written", False) and done["fingerprint"].startswith("sha256:")
    assert plan["target"] == done["target"] and plan["ranks"] == done["ranks"]


# ---- item 5: no silently accepted option ------------------------------------------------------------------
def test_all2all_is_checked_against_vllms_names():
    bad = run_cli("select", EXAMPLE, "-p", "b200", "--all2all", "bogus")
    assert bad.exit_code == 2 and "deepep_low_latency" in bad.stderr
    ok = run_cli("select", EXAMPLE, "-p", "b200", "--ep", "2", "--all2all", "DeepEP-Low-Latency", "--json")
    assert ok.exit_code == 0, ok.output


def test_repeated_profile_is_refused_where_one_target_is_meant(tmp_path):
    result = run_cli("select", EXAMPLE, "-p", "h100", "-p", "b200")
    assert result.exit_code == 2 and "h100, b200" in result.stderr
    twice = run_cli("convert", EXAMPLE, "-p", "h100", "-p", "h100", "-o", tmp_path / "o")
    assert twice.exit_code == 2 and "given twice" in twice.stderr and not (tmp_path / "o").exists()


# ---- item 6: several targets in one command ----------------------------------------------------------------
def test_several_targets_are_written_to_their_folders_and_resume(tmp_path, monkeypatch):
    import mxconvert.pipeline.convert as convert_mod

    out = tmp_path / "out"
    args = ["convert", EXAMPLE, "-p", "h100", "-p", "b200", "--tp", "1", "--tp", "2", "-o", out, "--json"]
    real, calls = convert_mod.execute, []

    def interrupted(plan, dest, **kw):  # the third target is killed midway
        calls.append(dest.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(plan, dest, **kw)

    monkeypatch.setattr(convert_mod, "execute", interrupted)
    first = run_cli(*args)
    assert first.exit_code == 130
    assert sorted(p.name for p in out.iterdir()) == ["h100-tp1", "h100-tp2"]  # complete ones only
    monkeypatch.setattr(convert_mod, "execute", real)
    second = run_cli(*args)
    assert second.exit_code == 0, second.output
    doc = json.loads(second.stdout)
    assert doc["schema"] == "mxconvert.convert-multi/1"
    status = {Path(t["artifact"]).name: t["status"] for t in doc["targets"]}
    assert status == {"h100-tp1": "up_to_date", "h100-tp2": "up_to_date", "b200-tp1": "written", "b200-tp2": "written"}
    backends = {Path(t["artifact"]).name: t["target"]["backend"] for t in doc["targets"]}
    assert backends["h100-tp2"] == "TRITON" and backends["b200-tp1"] == "FLASHINFER_TRTLLM_MXFP4_BF16"
    for name in status:
        art = out / name
        manifest = json.loads((art / "mxconvert.json").read_text())
        assert manifest["target"]["tp_size"] == int(name[-1])
        assert run_cli("verify", art).exit_code == 0
    text = run_cli(*args[:-1])
    assert text.exit_code == 0 and text.stdout.count("up to date") == 4


def test_a_refused_target_refuses_the_whole_command_before_writing(tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-p", "a100", "--backend", "TRITON", "-o", out)
    assert result.exit_code == 2 and "a100" in result.stderr
    assert not out.exists()


def test_vllm_variables_of_the_environment_are_read_as_vllm_would(tmp_path):
    env = {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}
    old = run_cli("select", EXAMPLE, "-p", "h100", "--runtime", "vllm-0.20", "--json", env=env)
    assert old.exit_code == 0, old.output
    data = json.loads(old.stdout)
    assert data["backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16"  # vLLM 0.20 reads it on SM90
    assert data["environment"]["VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"] == {"value": "1", "from": "environment"}
    # --env wins over the environment
    off = run_cli(
        "select",
        EXAMPLE,
        "-p",
        "h100",
        "--runtime",
        "vllm-0.20",
        "--json",
        "--env",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0",
        env=env,
    )
    assert json.loads(off.stdout)["backend"] == "TRITON"
    # vLLM 0.33 no longer reads it: the plan says so, the choice is vLLM 0.33's
    new = run_cli("select", EXAMPLE, "-p", "h100", "--json", env=env)
    assert new.exit_code == 0
    entry = json.loads(new.stdout)["environment"]["VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"]
    assert json.loads(new.stdout)["backend"] == "TRITON" and "ignored" in entry
    text = run_cli("select", EXAMPLE, "-p", "h100", env=env)
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 (environment) is ignored" in text.stderr


def test_an_environment_that_contradicts_the_profile_is_refused():
    result = run_cli("select", EXAMPLE, "-p", "mi300x", env={"VLLM_ROCM_USE_AITER": "1"})
    assert result.exit_code == 2 and "mi300x-aiter" in result.stderr
    agrees = run_cli("select", EXAMPLE, "-p", "mi300x-aiter", "--json", env={"VLLM_ROCM_USE_AITER": "1"})
    assert agrees.exit_code == 0, agrees.output


# ---- item 7: idempotent --------------------------------------------------------------------------------------
def test_converting_again_is_up_to_date_and_rewrites_nothing(tmp_path):
    out = tmp_path / "art"
    first, _ = _convert(out, "-p", "h100", "--tp", "2")
    assert first.exit_code == 0
    before = tree_digest(out)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again, data = _convert(out, "-p", "h100", "--tp", "2")
    assert again.exit_code == 0 and data["status"] == "up_to_date"
    assert tree_digest(out) == before and {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps
    text = run_cli("convert", EXAMPLE, "-p", "h100", "--tp", "2", "-o", out)
    assert text.exit_code == 0 and "up to date" in text.stdout
    dry, plan = _convert(out, "-p", "h100", "--tp", "2", "--dry-run")
    assert dry.exit_code == 0 and plan["status"] == "up_to_date"
    other = run_cli("convert", EXAMPLE, "-p", "h100", "--tp", "1", "-o", out)  # another target
    assert other.exit_code == 2 and "--force" in other.stderr


def test_a_changed_source_or_a_damaged_artifact_is_not_up_to_date(tmp_path):
    src = make_checkpoint(tmp_path)
    out = tmp_path / "art"
    assert run_cli("convert", src, "-p", "h100", "-o", out).exit_code == 0
    shard = sorted(out.glob("rank-*/*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    assert run_cli("convert", src, "-p", "h100", "-o", out).exit_code == 2
    assert run_cli("convert", src, "-p", "h100", "-o", out, "--force").exit_code == 0
    assert run_cli("convert", src, "-p", "h100", "-o", out).exit_code == 0
    (src / "config.json").write_text((src / "config.json").read_text().replace("{", "{ ", 1))
    result = run_cli("convert", src, "-p", "h100", "-o", out)
    assert result.exit_code == 2 and "--force" in result.stderr


# ---- item 8: strict profile files ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, message",
    [
        ('{"base": "b200", "has_flashinfer": "false"}', "has_flashinfer must be true or false, got 'false'"),
        ('{"name": "x", "platform": "cuda", "capability": [9]}', "capability must look like"),
        ('{"name": "x", "platform": "cuda", "capability": "9.0", "aliases": "x1"}', "aliases must be a list"),
        ('{"base": 100}', "base must be a profile name"),
        ('{"name": 7, "platform": "cuda", "capability": "9.0"}', "name must be a string"),
    ],
)
def test_profile_files_are_strictly_typed(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    result = run_cli("select", EXAMPLE, "-p", path)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_a_derived_profile_keeps_its_own_name_and_its_base(tmp_path):
    path = tmp_path / "b200-as-sm103.toml"
    path.write_text('base = "b200"\ncapability = "10.3"\n')
    result = run_cli("select", EXAMPLE, "-p", path, "--json")
    data = json.loads(result.stdout)
    assert (data["profile"], data["profile_base"]) == ("b200-as-sm103", "b200")
    text = run_cli("select", EXAMPLE, "-p", path)
    assert "b200-as-sm103 (from b200)" in text.stdout
    out = tmp_path / "art"
    assert run_cli("convert", EXAMPLE, "-p", path, "-o", out).exit_code == 0
    device = json.loads((out / "mxconvert.json").read_text())["target"]["device"]
    assert (device["name"], device["base"], device["capability"]) == ("b200-as-sm103", "b200", [10, 3])
    assert run_cli("verify", out).exit_code == 0


# ---- item 9: inspect A B compares everything ---------------------------------------------------------------
def _rewrite_tensor(ckpt_dir, name, change):
    """Change one non-expert tensor's values in place (a different checkpoint, same shapes)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = json.loads((ckpt_dir / "model.safetensors.index.json").read_text())
    shard = ckpt_dir / index["weight_map"][name]
    with safe_open(shard, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    tensors[name] = change(tensors[name])
    save_file(tensors, shard, metadata=meta)


def test_inspect_diff_compares_other_tensors_copied_files_and_sources(tmp_path):
    a = make_checkpoint(tmp_path, "a")
    b = make_checkpoint(tmp_path, "b")
    same = run_cli("inspect", a, b, "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["same"]  # the same model at two paths
    # a copied file differs (generation_config.json is neither a tensor nor a source file)
    (b / "generation_config.json").write_text('{"do_sample": false}\n')
    art_a, art_b = tmp_path / "art-a", tmp_path / "art-b"
    assert run_cli("convert", a, "-p", "h100", "-o", art_a).exit_code == 0
    assert run_cli("convert", b, "-p", "h100", "-o", art_b).exit_code == 0
    result = run_cli("inspect", art_a, art_b, "--json")
    d = json.loads(result.stdout)
    assert result.exit_code == 1 and not d["same"]
    assert [c["file"] for c in d["copied_files"]] == ["generation_config.json"]
    assert not d["target"] and not d["descriptors"] and not d["bytes"] and not d["other_tensors"]
    # a non-expert tensor differs: found in checkpoints and in artifacts, with the source hashes
    c = make_checkpoint(tmp_path, "c")
    _rewrite_tensor(c, "lm_head.weight", lambda t: t + 1)
    ck = json.loads(run_cli("inspect", a, c, "--json").stdout)
    assert [o["tensor"] for o in ck["other_tensors"]] == ["lm_head.weight"] and not ck["same"]
    art_c = tmp_path / "art-c"
    assert run_cli("convert", c, "-p", "h100", "-o", art_c).exit_code == 0
    d = json.loads(run_cli("inspect", art_a, art_c, "--json").stdout)
    assert [o["tensor"] for o in d["other_tensors"]] == ["lm_head.weight"]
    assert any(s["field"] == "files" for s in d["source"])
    text = run_cli("inspect", art_a, art_c)
    assert "lm_head.weight: same dtype and shape, different bytes" in text.stdout


def test_inspect_diff_reports_different_source_layouts(tmp_path):
    hf = make_checkpoint(tmp_path, "hf", layout="hf")
    orig = make_checkpoint(tmp_path, "orig", layout="original")
    d = json.loads(run_cli("inspect", hf, orig, "--json").stdout)
    assert not d["same"] and any(s["field"] == "layout" for s in d["source"])


# ---- item 10: conventions -------------------------------------------------------------------------------------
def test_version_short_help_and_completion():
    from helpers import run_cli_subprocess

    version = run_cli_subprocess("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mxconvert {mxconvert.__version__}"
    short = run_cli_subprocess("convert", "-h")
    assert short.returncode == 0 and "--max-shard-size" in short.stdout
    assert "--install-completion" in run_cli_subprocess("-h").stdout


def test_errors_are_json_under_json():
    result = run_cli("select", "no/such-model-here", "-p", "h100", "--json", env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["schema"] == "mxconvert.error/1" and data["ok"] is False
    assert data["error"]["exit_code"] == 2 and "no/such-model-here" in data["error"]["message"]
    assert "no/such-model-here" in result.stderr  # and the line on stderr


def test_backends_lists_every_backend_with_the_profiles_that_select_it():
    rows = json.loads(run_cli("backends", "--json").stdout)["backends"]
    keys = {(r["format"], r["revision"], r["backend"]) for r in rows}
    from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend

    assert {("mxfp4", "vllm-0.33", b.value) for b in Mxfp4Backend} <= keys
    assert {("nvfp4", "vllm-0.33", b.value) for b in Nvfp4Backend if b.value != "FLASHINFER_MOE_EP_CUTEDSL"} <= keys
    assert any(r["revision"] == "vllm-0.15" for r in rows) and any(r["revision"] == "vllm-0.20" for r in rows)
    by = {(r["format"], r["revision"], r["backend"]): r for r in rows}
    for profile in ("h100", "b200", "a100"):  # what `select` picks is listed as selected on that profile
        chosen = json.loads(run_cli("select", EXAMPLE, "-p", profile, "--json").stdout)["backend"]
        assert profile in by[("mxfp4", "vllm-0.33", chosen)]["selected_on"]
    assert by[("nvfp4", "vllm-0.33", "VLLM_CUTLASS")]["moe_backend"] == "cutlass"


def test_tables_at_80_columns_wrap_and_never_cut_the_key_column(tmp_path):
    from helpers import run_cli_subprocess

    out = tmp_path / "art"
    assert run_cli("convert", EXAMPLE, "-p", "b200", "-o", out).exit_code == 0
    env = {"COLUMNS": "80"}
    shown = run_cli_subprocess("inspect", out, "--layer", "0", env=env)
    assert shown.returncode == 0
    lines = shown.stdout.splitlines()
    table_lines = [line for line in lines if line[:1] in "┏┃┡│└┗╇━"]
    assert table_lines and max(map(len, table_lines)) <= 80  # prose lines soft-wrap in the terminal
    for name in ("w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias"):
        assert any(f"L0 {name} " in line for line in lines), name
    assert "…" not in shown.stdout
    backends = run_cli_subprocess("backends", env=env)
    assert max(len(line) for line in backends.stdout.splitlines() if line[:1] in "┏┃┡│└") <= 80
    assert "FLASHINFER_TRTLLM_MXFP4_MXFP8" in backends.stdout and "…" not in backends.stdout


# ---- item 5: --max-shard-size is a hard limit ---------------------------------------------------------------
@pytest.mark.parametrize("size, limit", [("700KB", 700_000), ("1MB", 1_000_000), ("0.6MiB", 629_145)])
def test_max_shard_size_bounds_every_written_file(tmp_path, size, limit):
    out = tmp_path / "art"
    result, data = _convert(out, "-p", "b200", "--tp", "2", "--max-shard-size", size)
    assert result.exit_code == 0, result.output
    sizes = [p.stat().st_size for p in out.rglob("*.safetensors")]
    assert len(sizes) > 4 and max(sizes) <= limit
    assert data["files"] >= len(sizes)
    assert run_cli("verify", out).exit_code == 0
    for rank in (0, 1):
        assert mxconvert.load_artifact(out, rank=rank).tensors


def test_a_max_shard_size_below_one_tensor_is_refused_with_the_size_that_works(tmp_path):
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", tmp_path / "art", "--max-shard-size", "100KB")
    assert result.exit_code == 2 and "use --max-shard-size" in result.stderr
    assert not (tmp_path / "art").exists()
