"""`mxconvert convert` end to end on the example checkpoint: artifact format, JSON, dry run,
atomicity, no writes to the source, determinism, and bounded memory."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_ckpt import make_checkpoint
from helpers import EXAMPLE, run_cli, tree_digest
from safetensors import safe_open

from mxconvert.artifact.manifest import fingerprint
from mxconvert.formats.mxfp4.canonical import load_canonical, plan_ranks
from mxconvert.formats.mxfp4.checkpoint import open_checkpoint
from mxconvert.layouts import resolve_layout
from mxconvert.pipeline import convert as convert_mod
from mxconvert.pipeline import plan as plan_mod
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision


@pytest.mark.parametrize(
    "profile, runtime, backend, hp, ip",
    [
        ("h100", "vllm-0.33", "TRITON", 320, 320),
        ("b200", "vllm-0.33", "FLASHINFER_TRTLLM_MXFP4_BF16", 512, 384),
        ("b200", "vllm-0.20", "FLASHINFER_TRTLLM_MXFP4_BF16", 512, 512),
        ("mi355x", "vllm-0.33", "TRITON", 512, 512),
        ("a100", "vllm-0.33", "MARLIN", 512, 384),
        ("mi355x-aiter", "vllm-0.33", "AITER_MXFP4_BF16", 512, 512),
    ],
)
def test_convert_writes_the_layout_of_the_selected_backend(tmp_path, profile, runtime, backend, hp, ip):
    out = tmp_path / "out"
    result = run_cli("convert", EXAMPLE, "--profile", profile, "--runtime", runtime, "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    manifest = json.loads((out / "mxconvert.json").read_text())
    assert summary["fingerprint"] == manifest["fingerprint"] == fingerprint(manifest)
    t = manifest["target"]
    assert (t["backend"], t["runtime_revision"], t["hidden_size_padded"], t["intermediate_size_padded"]) == (
        backend,
        runtime,
        hp,
        ip,
    )
    # every expert tensor equals the layout applied to the canonical tensors, stored as recorded
    ckpt = open_checkpoint(str(EXAMPLE))
    prof, rev = get_profile(profile), get_revision(runtime)
    layout = resolve_layout(Mxfp4Backend(backend), rev, prof)
    rank = manifest["ranks"][0]
    (plan,) = plan_ranks(ckpt.facts, 1, 1)
    for layer in range(2):
        canonical = load_canonical(ckpt, layer, plan, hp, ip)
        for name, value in canonical.items():
            key = f"model.layers.{layer}.mlp.experts.{name}"
            entry = rank["tensors"][key]
            with safe_open(out / entry["file"], "pt") as f:
                stored = f.get_tensor(key)
            assert torch.equal(stored.view(torch.uint8), layout.tensors[name].forward(value).view(torch.uint8))
            assert entry["layout"]["view_shape"] and entry["dtype"] == str(stored.dtype).removeprefix("torch.")
    # non-expert tensors and aux files are unchanged
    shared = manifest["shared"]["tensors"]
    assert "model.embed_tokens.weight" in shared and not any(".experts." in k for k in shared)
    with safe_open(out / shared["lm_head.weight"]["file"], "pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), ckpt.tensor("lm_head.weight"))
    for aux in ("config.json", "tokenizer.json", "generation_config.json"):
        assert (out / aux).read_bytes() == (EXAMPLE / aux).read_bytes()


def test_dry_run_writes_nothing_and_prints_the_plan(tmp_path):
    result = run_cli("convert", EXAMPLE, "--profile", "b200", "-o", tmp_path / "out", "--dry-run", "--json")
    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["dry_run"] and plan["target"]["backend"] == "FLASHINFER_TRTLLM_MXFP4_BF16"
    assert plan["total_bytes"] > 0 and plan["ranks"][0]["files"]
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_existing_output_is_kept_unless_force(tmp_path):
    out = tmp_path / "out"
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out).exit_code == 0
    first = tree_digest(out)
    result = run_cli("convert", EXAMPLE, "--profile", "b200", "-o", out)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert tree_digest(out) == first
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "-o", out, "--force").exit_code == 0
    assert json.loads((out / "mxconvert.json").read_text())["target"]["profile"] == "b200"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or old folder left


def test_a_failure_midway_leaves_no_artifact_and_no_staging(tmp_path, monkeypatch):
    calls = {"n": 0}
    import mxconvert.formats.mxfp4.canonical as canonical_mod

    real = canonical_mod.load_canonical_bits

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(canonical_mod, "load_canonical_bits", failing)
    result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", tmp_path / "out")
    assert result.exit_code != 0 and "disk full" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_source_is_never_written_and_output_inside_source_is_refused(tmp_path):
    ckpt = make_checkpoint(tmp_path)
    before = tree_digest(ckpt)
    assert run_cli("convert", ckpt, "--profile", "b200", "-o", tmp_path / "out").exit_code == 0
    result = run_cli("convert", ckpt, "--profile", "b200", "-o", ckpt / "converted")
    assert result.exit_code == 2 and "must not be the source" in result.stderr
    assert tree_digest(ckpt) == before


def test_conversion_is_deterministic(tmp_path):
    for name in ("a", "b"):
        assert run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "2", "-o", tmp_path / name).exit_code == 0
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")


def test_tp_and_ep_write_one_folder_per_rank_and_rank_selects_one(tmp_path):
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "--tp", "2", "-o", tmp_path / "tp").exit_code == 0
    m = json.loads((tmp_path / "tp" / "mxconvert.json").read_text())
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    assert all(f["file"].startswith(f"rank-{r['rank']:05d}/") for r in m["ranks"] for f in r["files"])
    assert m["ranks"][1]["plan"]["i_start"] == 160
    assert (
        run_cli("convert", EXAMPLE, "--profile", "h100", "--ep", "2", "--rank", "1", "-o", tmp_path / "ep").exit_code
        == 0
    )
    m = json.loads((tmp_path / "ep" / "mxconvert.json").read_text())
    assert [r["rank"] for r in m["ranks"]] == [1] and m["ranks"][0]["plan"]["expert_start"] == 2
    assert m["ranks"][0]["tensors"]["model.layers.0.mlp.experts.w13_weight"]["layout"]["canonical_shape"][0] == 2
    assert (
        run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "2", "--rank", "5", "-o", tmp_path / "x").exit_code
        == 2
    )


def test_unsupported_backend_is_refused_before_anything_is_written(tmp_path):
    result = run_cli("convert", EXAMPLE, "--profile", "cpu", "-o", tmp_path / "out")  # CPU: not laid out
    assert result.exit_code == 2 and "CPU" in result.stderr and "not laid out" in result.stderr
    assert not (tmp_path / "out").exists()


def test_peak_memory_does_not_grow_with_the_number_of_layers(tmp_path, monkeypatch):
    """Convert streams: the largest tensor alive at once is one chunk of one tensor of one layer,
    whatever the number of layers (measured on every canonical chunk and layout output)."""
    peak = {"bytes": 0}
    import mxconvert.formats.mxfp4.canonical as canonical_mod

    real_load = canonical_mod.load_canonical_bits

    def recording(*args, **kwargs):
        out = real_load(*args, **kwargs)
        peak["bytes"] = max(peak["bytes"], sum(t.nbytes for t in out.values()))
        return out

    monkeypatch.setattr(canonical_mod, "load_canonical_bits", recording)
    results = []
    for layers in (2, 6):
        ckpt = make_checkpoint(tmp_path / f"l{layers}", num_layers=layers)
        peak["bytes"] = 0
        plan = plan_mod.make_plan(
            open_checkpoint(str(ckpt)), get_profile("h100"), get_revision(None), plan_mod.Deployment(), "auto"
        )
        convert_mod.execute(plan, tmp_path / f"out{layers}", chunk_bytes=64 << 10)
        results.append(peak["bytes"])
    one_expert_w13 = 2 * 320 * 320 // 2  # a chunk never holds less than one expert
    assert results[0] == results[1] <= max(64 << 10, one_expert_w13)


def test_force_only_replaces_an_artifact_or_an_empty_folder(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.txt").write_text("keep me")
    result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", precious, "--force")
    assert result.exit_code == 2 and "not an mxconvert artifact" in result.stderr
    assert (precious / "data.txt").read_text() == "keep me"
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "-o", afile, "--force").exit_code == 2
    assert afile.read_text() == "x"
    (tmp_path / "empty").mkdir()
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "-o", tmp_path / "empty", "--force").exit_code == 0


def test_staging_left_by_a_killed_run_is_removed(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = tmp_path / f".out.mxconvert-staging-{dead.pid}"
    stale.mkdir()
    (stale / "half-written.safetensors").write_bytes(b"\0" * 100)
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "-o", tmp_path / "out").exit_code == 0
    assert not stale.exists()


def test_sigterm_during_convert_leaves_nothing_behind(tmp_path):
    import subprocess
    import sys

    code = (
        "import os, signal, mxconvert.convert as c\n"
        "real = c._run_step\n"
        "def slow(*a, **k):\n"
        "    out = real(*a, **k); os.kill(os.getpid(), signal.SIGTERM); return out\n"
        "c._run_step = slow\n"
        "from mxconvert.cli.main import main\n"
        f"import sys; sys.argv = ['mxconvert', 'convert', r'{EXAMPLE}', '--profile', 'h100', "
        f"'-o', r'{tmp_path / 'out'}']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert list(tmp_path.iterdir()) == [], [p.name for p in tmp_path.iterdir()]


def test_a_layout_result_unlike_its_header_is_an_internal_error_and_writes_nothing(tmp_path, monkeypatch):
    """The header comes from the layout's shape-only spec and the writer counts bytes only: a chunk
    of the right size but another shape must stop the conversion, not be written under the header."""
    from mxconvert.layouts import device

    real = device.HostCompute.forward

    def flattened(self, layout, canonical, dtype):
        out, out_dtype = real(self, layout, canonical, dtype)
        return (out.reshape(out.shape[0], -1) if out.ndim > 2 else out), out_dtype

    monkeypatch.setattr(device.HostCompute, "forward", flattened)
    result = run_cli("convert", EXAMPLE, "--profile", "b200", "-o", tmp_path / "out")
    assert result.exit_code == 3, result.stderr
    assert "the header says" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_nan_filled_chunk_is_refused_without_listing_every_nan():
    """A corrupt source whose chunk is NaN throughout (FP8 scales of 0x7F / 0xFF bytes) is refused
    with the first NaN's place, without an index per NaN (np.argwhere: 8 bytes per dimension per
    element, 24x a 3-d chunk on each worker at once: an out-of-memory kill instead of exit 2)."""
    import tracemalloc
    from types import SimpleNamespace

    import numpy as np

    from mxconvert.core.errors import InputError

    canonical = np.full((8, 256, 1024), 0x7F, dtype=np.uint8)  # 2 MiB of float8_e4m3fn NaN
    canonical[0, 0, :3] = 0x38
    plan = SimpleNamespace(ckpt=SimpleNamespace(root="ckpt"))
    tp = SimpleNamespace(layer=3, name="w13_weight_scale")
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"layer 3 w13_weight_scale of expert 5 holds NaN \(at index \[0, 3\]\)"):
            convert_mod._refuse_nan(canonical, "float8_e4m3fn", plan, tp, range(5, 13))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * canonical.nbytes, peak
