"""Fail closed everywhere (issue "Fail closed everywhere"): bad input, output-side faults, kills
and signals, tampering. Each case asserts the exit status, the message, that the source is
unchanged (hashes before and after) and what is left on disk.

Classes (the `cls` marker of each case):
 1 accounting: every source tensor is converted, passed through, or named in a refusal
 2 completeness: verify recomputes ranks / tensors / pass-through; the loader never returns
   another rank's slice
 3 --force replaces only intact artifacts
 4 replacing is atomic: OUT holds the old or the new artifact at every instant
 5 numbers the kernel cannot use are refused; what convert writes, verify accepts
 6 paths stay inside; only regular files are read
 7 the user's situation is exit 2 and one line; the loader raises mxconvert's errors
 8 signals at any moment: exit 128 + N, no traceback, staging removed
 9 every run-time import is a declared dependency

Output-side faults use the deterministic hook MXCONVERT_FAULT=KIND:N[:ACTION] (mxconvert/faults.py).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch
from fixtures_nvfp4 import make_nvfp4_checkpoint
from helpers import EXAMPLE, ROOT, run_cli, tree_digest
from safetensors.torch import load_file, save_file

from mxconvert.artifact.loader import load_artifact
from mxconvert.artifact.manifest import MANIFEST_NAME, seal
from mxconvert.core import faults
from mxconvert.core.errors import InputError, MismatchError, MxconvertError
from mxconvert.pipeline.output import recover_interrupted

NVFP4_EXAMPLE = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
INDEX = "model.safetensors.index.json"


# ---- helpers ----------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _fresh_fault_counters(monkeypatch):
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    faults.reset()
    yield
    faults.reset()


def _copy(src: Path, tmp_path: Path, name: str = "model") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _convert(src, out, *extra, env=None):
    """convert with --profile h100 unless `extra` names a profile."""
    profile = () if "--profile" in extra else ("--profile", "h100")
    return run_cli("convert", src, *profile, "-o", out, *extra, env=env)


def _cli(*args, env=None, timeout=120):
    full = dict(os.environ, **(env or {}))
    full.pop("MXCONVERT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "mxconvert", *map(str, args)],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=timeout,
    )


def _manifest(art: Path) -> dict:
    return json.loads((art / MANIFEST_NAME).read_text())


def _reseal(art: Path, manifest: dict) -> None:
    manifest = {k: v for k, v in manifest.items() if k != "fingerprint"}
    (art / MANIFEST_NAME).write_text(json.dumps(seal(manifest)))


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".mxconvert-" in p.name)


def _weight_map(ckpt: Path) -> dict[str, str]:
    return json.loads((ckpt / INDEX).read_text())["weight_map"]


def _edit_tensor(ckpt: Path, name: str, change) -> None:
    rel = _weight_map(ckpt)[name]
    tensors = load_file(ckpt / rel)
    tensors[name] = change(tensors[name].clone())
    save_file(tensors, ckpt / rel, metadata={"format": "pt"})


def _add_tensor(ckpt: Path, name: str, value: torch.Tensor) -> None:
    index = json.loads((ckpt / INDEX).read_text())
    rel = sorted(set(index["weight_map"].values()))[0]
    tensors = load_file(ckpt / rel)
    tensors[name] = value
    save_file(tensors, ckpt / rel, metadata={"format": "pt"})
    index["weight_map"][name] = rel
    (ckpt / INDEX).write_text(json.dumps(index))


def _refused(result, *words: str) -> None:
    """Exit 2, one line naming the problem, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    text = result.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    assert text.startswith("error:") and text.strip().count("\n") == 0, text
    for word in words:
        assert word in text, (word, text)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """A TP-2 MXFP4 artifact of the example (copied per test)."""
    out = tmp_path_factory.mktemp("tp2") / "art"
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "2", "-o", out).exit_code == 0
    return out


# ---- 1 accounting ----------------------------------------------------------------------------------
def _nvfp4_fewer_experts(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["num_experts"] = 2
    (ckpt / "config.json").write_text(json.dumps(config))


def _nvfp4_extra_expert_tensor(ckpt):
    _add_tensor(ckpt, "model.layers.0.mlp.experts.1.gate_proj.weight_zero_point", torch.zeros(1))


def _nvfp4_extra_projection(ckpt):
    _add_tensor(ckpt, "model.layers.0.mlp.experts.1.w4.weight", torch.zeros(4, dtype=torch.uint8))


def _mxfp4_extra_expert_tensor(ckpt):
    _add_tensor(ckpt, "model.layers.0.mlp.experts.gate_up_proj_zeros", torch.zeros(4, dtype=torch.uint8))


def _mxfp4_fewer_layers(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (ckpt / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "src, plant, words",
    [
        (NVFP4_EXAMPLE, _nvfp4_fewer_experts, ["experts.2.", "2 experts per layer"]),
        (NVFP4_EXAMPLE, _nvfp4_extra_expert_tensor, ["weight_zero_point"]),
        (NVFP4_EXAMPLE, _nvfp4_extra_projection, ["experts.1.w4.weight"]),
        (EXAMPLE, _mxfp4_extra_expert_tensor, ["gate_up_proj_zeros"]),
        (EXAMPLE, _mxfp4_fewer_layers, ["model.layers.1.mlp.experts"]),
    ],
    ids=[
        "nvfp4-experts-beyond-config",
        "nvfp4-extra-per-expert-tensor",
        "nvfp4-extra-projection",
        "mxfp4-extra-expert-tensor",
        "mxfp4-layers-beyond-config",
    ],
)
def test_1_every_tensor_is_converted_passed_through_or_refused(tmp_path, src, plant, words):
    ckpt = _copy(src, tmp_path)
    plant(ckpt)
    before = tree_digest(ckpt)
    result = _convert(ckpt, tmp_path / "out", "--profile", "b200")
    _refused(result, "refusing rather than dropping", *words)
    assert tree_digest(ckpt) == before and not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("src", [EXAMPLE, NVFP4_EXAMPLE], ids=["mxfp4", "nvfp4"])
def test_1_a_converted_artifact_accounts_for_every_source_tensor(tmp_path, src):
    out = tmp_path / "out"
    assert run_cli("convert", src, "--profile", "b200", "-o", out).exit_code == 0
    from mxconvert.formats.registry import open_model

    ckpt = open_model(str(src))
    manifest = _manifest(out)
    assert set(manifest["shared"]["tensors"]) | ckpt.expert_names() == set(ckpt.weight_map)
    assert not set(manifest["shared"]["tensors"]) & ckpt.expert_names()


# ---- 2 completeness ----------------------------------------------------------------------------------
def _relabel_ranks(m):
    m["ranks"][0]["rank"], m["ranks"][1]["rank"] = 1, 0


def _swap_plans(m):
    m["ranks"][0]["plan"], m["ranks"][1]["plan"] = m["ranks"][1]["plan"], m["ranks"][0]["plan"]


def _drop_layer(m):
    for r in m["ranks"]:
        r["tensors"] = {k: v for k, v in r["tensors"].items() if v["layer"] != 1}


def _drop_passthrough(m):
    key = sorted(m["shared"]["tensors"])[0]
    del m["shared"]["tensors"][key]


def _drop_rank_of_tp2_and_claim_tp4(m):
    m["target"]["tp_size"] = 4


@pytest.mark.parametrize(
    "edit, load_rank, words",
    [
        (_relabel_ranks, 0, "plan"),
        (_swap_plans, 1, "plan"),
        (_drop_layer, None, "model.layers.1.mlp.experts"),
        (_drop_passthrough, None, "pass-through tensor"),
        (_drop_rank_of_tp2_and_claim_tp4, 0, "rank"),
    ],
    ids=["ranks-relabelled", "plans-swapped", "layer-removed", "passthrough-removed", "ranks-missing"],
)
def test_2_a_resealed_manifest_that_lost_or_moved_something_fails(tp2, tmp_path, edit, load_rank, words):
    art = _copy(tp2, tmp_path, "art")
    manifest = _manifest(art)
    edit(manifest)
    _reseal(art, manifest)
    result = run_cli("verify", art, "--source", EXAMPLE, "--json")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert any(p["kind"] == "completeness" and words in p["message"] for p in report["problems"]), report["problems"]
    if load_rank is not None:
        with pytest.raises(MismatchError):
            load_artifact(art, rank=load_rank)


def test_2_rank_files_moved_to_another_rank_are_never_loaded_as_it(tp2, tmp_path):
    art = _copy(tp2, tmp_path, "art")
    manifest = _manifest(art)
    r0, r1 = manifest["ranks"]
    for f0, f1 in zip(r0["files"], r1["files"]):  # rank 1's folder now holds rank 0's bytes
        shutil.copyfile(art / f0["file"], art / f1["file"])
        f1["size"], f1["sha256_chunked"] = f0["size"], f0["sha256_chunked"]  # schema /2: the tree digest
    _reseal(art, manifest)
    with pytest.raises(MismatchError, match="holds rank 0's tensors"):
        load_artifact(art, rank=1)
    result = run_cli("verify", art, "--source", EXAMPLE, "--json")
    assert result.exit_code == 1
    assert load_artifact(art, rank=0).tensors  # rank 0 is untouched


# ---- 3 --force ------------------------------------------------------------------------------------
def _fake_manifest(out):
    (out / MANIFEST_NAME).write_text("{}")


def _edited_artifact(out):
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out, "--force").exit_code == 0
    manifest = _manifest(out)
    manifest["target"]["backend"] = "MARLIN"  # not re-sealed: the fingerprint fails
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))


def _broken_json(out):
    (out / MANIFEST_NAME).write_text('{"schema": ')


@pytest.mark.parametrize(
    "plant",
    [_fake_manifest, _edited_artifact, _broken_json],
    ids=["empty-manifest", "fingerprint-fails", "manifest-not-json"],
)
def test_3_force_never_deletes_a_folder_that_is_not_an_intact_artifact(tmp_path, plant):
    out = tmp_path / "out"
    out.mkdir()
    plant(out)
    (out / "precious.txt").write_text("keep me")
    before = tree_digest(out)
    result = _convert(EXAMPLE, out, "--force")
    _refused(result, "not an intact mxconvert artifact", "nothing was touched")
    assert tree_digest(out) == before and _leftovers(tmp_path) == []


def test_3_force_replaces_an_intact_artifact_and_a_symlinked_out_is_refused(tmp_path):
    out = tmp_path / "out"
    assert _convert(EXAMPLE, out).exit_code == 0
    first = _manifest(out)["fingerprint"]
    assert _convert(EXAMPLE, out, "--profile", "b200", "--force").exit_code == 0
    assert _manifest(out)["fingerprint"] != first and _leftovers(tmp_path) == []
    link = tmp_path / "link"
    link.symlink_to(out)
    before = tree_digest(out)
    _refused(_convert(EXAMPLE, link, "--force"), "not a folder")
    assert tree_digest(out) == before and link.is_symlink()


# ---- 4 atomic replace (deterministic injection) ----------------------------------------------------------
def _count_writes() -> int:
    """Tensors written, aux files copied and the manifest, for the example on h100."""
    from mxconvert.formats.registry import open_model

    ckpt = open_model(str(EXAMPLE))
    return 2 * 6 + len(ckpt.other_tensor_names()) + len(ckpt.aux_files()) + 1


@pytest.mark.parametrize(
    "fault",
    [
        "write:1:eio",
        "write:5:enospc",
        "write:LAST:eio",
        "rename:1:eio",
        "rename:1:eio,no-exchange",
        "rename:2:eio,no-exchange",
    ],
)
@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "replace"])
def test_4_an_io_error_at_any_write_or_rename_leaves_out_as_it_was(tmp_path, monkeypatch, fault, existing):
    out = tmp_path / "out"
    if existing:
        assert _convert(EXAMPLE, out, "--profile", "b200").exit_code == 0
    before = tree_digest(out) if existing else None
    source = tree_digest(EXAMPLE)
    monkeypatch.setenv("MXCONVERT_FAULT", fault.replace("LAST", str(_count_writes())))
    result = _convert(EXAMPLE, out, "--force")
    if fault.startswith("rename:2") and not existing:  # a fresh OUT needs one rename only
        assert result.exit_code == 0
        return
    _refused(result, "nothing was written", "still holds the previous artifact" if existing else "was not created")
    assert ("No space left" in result.stderr) == ("enospc" in fault)
    assert (tree_digest(out) == before) if existing else not out.exists()
    assert _leftovers(tmp_path) == [] and tree_digest(EXAMPLE) == source


@pytest.mark.parametrize(
    "fault",
    [
        "write:3:kill",
        "rename:1:kill",
        "rename:2:kill,no-exchange",
        "write:3:term",
        "rename:1:term",
        "write:7:int",
        "write:3:lost-term",
    ],
)
def test_4_a_kill_or_signal_at_a_write_or_rename_leaves_an_old_or_new_artifact(tmp_path, fault):
    out = tmp_path / "out"
    assert _convert(EXAMPLE, out, "--profile", "b200").exit_code == 0
    old = _manifest(out)["fingerprint"]
    action = fault.split(",")[0].split(":")[2]
    if action == "kill":  # needs its own process
        proc = _cli("convert", EXAMPLE, "--profile", "h100", "-o", out, "--force", env={"MXCONVERT_FAULT": fault})
    else:  # in-process: the CLI's handlers turn the signal into its exit status
        result = _convert(EXAMPLE, out, "--force", env={"MXCONVERT_FAULT": fault})
        proc = subprocess.CompletedProcess([], result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in proc.stderr
    if action == "kill":
        assert proc.returncode == -signal.SIGKILL
    else:
        code = {"term": 143, "int": 130, "lost-term": 143}[action]  # lost-term: swallowed in a __del__
        assert proc.returncode == code and proc.stderr.startswith("interrupted by SIG"), proc.stderr
        if fault.startswith("rename"):  # the signal waits for the rename: the new artifact is in place
            assert "holds the new, complete artifact" in proc.stderr
        else:
            assert "still holds the previous artifact" in proc.stderr
        assert _leftovers(tmp_path) == []
    recover_interrupted(out)  # what the next run does first
    assert _leftovers(tmp_path) == []
    loaded = load_artifact(out)  # fingerprint and every checksum verified
    assert loaded.fingerprint in (old, _manifest(out)["fingerprint"])
    if fault.startswith("rename:2:kill"):  # killed between the two renames: the old one comes back
        assert loaded.fingerprint == old


# ---- 4 + 8 the random kill / signal loop ----------------------------------------------------------
_PROGRESS_LINE = re.compile(r"^[^:\n]+: [\d.]+/[\d.]+ MB \(\d+%\), .*\n", re.M)


def _without_progress(stderr: str) -> str:
    """stderr without the plain progress lines a non-TTY run prints (README "Progress") before a
    signal's message: e.g. `convert: 5.1/5.1 MB (100%), ... - done` when the signal comes late."""
    return _PROGRESS_LINE.sub("", stderr)


def _write_big_gpt_oss(dst: Path, layers: int = 6, experts: int = 8, hidden: int = 640, inter: int = 640) -> Path:
    """The example, with larger random expert tensors (shapes as the config says): quick to
    write, and slow enough to convert that signals land at every stage."""
    shutil.copytree(EXAMPLE, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(
        num_hidden_layers=layers,
        num_local_experts=experts,
        hidden_size=hidden,
        intermediate_size=inter,
        layer_types=["full_attention"] * layers,
    )
    (dst / "config.json").write_text(json.dumps(config))
    index = json.loads((dst / INDEX).read_text())
    keep = {k: v for k, v in index["weight_map"].items() if ".mlp.experts." not in k}
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "gate_up_proj_blocks": (experts, 2 * inter, hidden // 32, 16),
        "gate_up_proj_scales": (experts, 2 * inter, hidden // 32),
        "gate_up_proj_bias": (experts, 2 * inter),
        "down_proj_blocks": (experts, hidden, inter // 32, 16),
        "down_proj_scales": (experts, hidden, inter // 32),
        "down_proj_bias": (experts, hidden),
    }
    for layer in range(layers):
        tensors = {}
        for name, shape in shapes.items():
            if name.endswith("bias"):
                value = torch.randn(shape, generator=gen).to(torch.bfloat16)
            elif name.endswith("scales"):
                value = torch.randint(118, 130, shape, generator=gen, dtype=torch.uint8)
            else:
                value = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
            tensors[f"model.layers.{layer}.mlp.experts.{name}"] = value
        rel = f"experts-{layer:05d}.safetensors"
        save_file(tensors, dst / rel, metadata={"format": "pt"})
        keep.update({k: rel for k in tensors})
    index["weight_map"] = keep
    (dst / INDEX).write_text(json.dumps(index))
    for stale in set(json.loads((EXAMPLE / INDEX).read_text())["weight_map"].values()) - set(keep.values()):
        (dst / stale).unlink()
    return dst


def _block_signals() -> None:
    """Start the child with the handled signals blocked, as if they arrived while the interpreter
    itself starts (before any code of ours can run): mxconvert unblocks them once its handlers
    are in place, so a signal sent at any moment from 0 s on gets the documented exit."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])


def test_4_8_kills_and_signals_at_20_random_moments_never_lose_or_corrupt_out(tmp_path):
    src = _write_big_gpt_oss(tmp_path / "big")
    source = tree_digest(src)
    args = ("convert", src, "--profile", "h100", "--tp", "2", "-o")
    started = time.monotonic()
    first = _cli(*args, tmp_path / "ref")
    duration = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    new_fp = _manifest(tmp_path / "ref")["fingerprint"]
    previous = tmp_path / "previous"
    assert _convert(EXAMPLE, previous, "--profile", "b200").exit_code == 0
    old_fp = _manifest(previous)["fingerprint"]
    rng = random.Random(8)
    sigs = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    points = [(rng.uniform(0.0, duration * 1.1), rng.choice(sigs)) for _ in range(20)]
    outcomes = []
    for pair in range(0, len(points), 2):  # two at a time: CI has two cores
        procs = []
        for slot, (delay, sig) in enumerate(points[pair : pair + 2]):
            folder = tmp_path / f"run{pair + slot}"
            folder.mkdir()
            out = folder / "out"
            shutil.copytree(previous, out)  # the artifact --force replaces
            env = {k: v for k, v in os.environ.items() if k != "MXCONVERT_FAULT"}
            proc = subprocess.Popen(
                [sys.executable, "-m", "mxconvert", *map(str, args), out, "--force"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_block_signals,
            )
            procs.append((proc, delay, sig, folder, out, time.monotonic()))
        for proc, delay, sig, folder, out, t0 in procs:
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            if proc.poll() is None:
                proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=300)
            where = f"{sig.name} at {delay:.2f}s: rc {proc.returncode}, stderr {stderr[-300:]!r}"
            assert "Traceback" not in stderr, where
            if proc.returncode == 0:
                outcomes.append("finished")
            elif sig == signal.SIGKILL:
                assert proc.returncode == -signal.SIGKILL, where
                outcomes.append("killed")
                recover_interrupted(out)
            else:
                assert proc.returncode == 128 + sig, where
                assert _without_progress(stderr).startswith(f"interrupted by {sig.name}"), where
                outcomes.append("interrupted")
            assert _leftovers(folder) == [], where  # staging removed (after a kill: by the next run)
            fp = load_artifact(out).fingerprint  # complete: fingerprint and every checksum verified
            assert fp in (old_fp, new_fp), where
            assert (fp == new_fp) == (proc.returncode == 0 or "holds the new" in stderr) or sig == signal.SIGKILL, where
    assert tree_digest(src) == source
    assert len(outcomes) == 20 and set(outcomes) - {"finished"}, outcomes


# ---- 5 numbers ------------------------------------------------------------------------------------------
def _nvfp4_scalar(value, tensor="weight_scale_2", fmt="modelopt"):
    def plant(ckpt):
        name = next(n for n in _weight_map(ckpt) if n.endswith(f"experts.1.up_proj.{tensor}"))
        _edit_tensor(ckpt, name, lambda t: torch.full_like(t, value))

    return plant


@pytest.mark.parametrize(
    "kw, plant, tensor",
    [
        ({}, _nvfp4_scalar(float("nan")), "weight_scale_2"),
        ({}, _nvfp4_scalar(float("inf")), "weight_scale_2"),
        ({}, _nvfp4_scalar(0.0), "weight_scale_2"),
        ({}, _nvfp4_scalar(-1.0), "weight_scale_2"),
        ({}, _nvfp4_scalar(0.0, "input_scale"), "input_scale"),
        ({}, _nvfp4_scalar(float("nan"), "input_scale"), "input_scale"),
        ({"fmt": "compressed-tensors"}, _nvfp4_scalar(0.0, "weight_global_scale"), "weight_global_scale"),
        ({"fmt": "compressed-tensors"}, _nvfp4_scalar(1e-45, "input_global_scale"), "input_global_scale"),
    ],
    ids=[
        "global-nan",
        "global-inf",
        "global-zero",
        "global-negative",
        "input-zero",
        "input-nan",
        "ct-global-zero",
        "ct-input-reciprocal-inf",
    ],
)
def test_5_nvfp4_scales_the_kernel_cannot_use_are_refused(tmp_path, kw, plant, tensor):
    ckpt = make_nvfp4_checkpoint(tmp_path, **kw)
    plant(ckpt)
    before = tree_digest(ckpt)
    _refused(_convert(ckpt, tmp_path / "out", "--profile", "b200"), tensor, "positive finite")
    assert tree_digest(ckpt) == before and not (tmp_path / "out").exists()


def test_5_nan_in_a_float_source_tensor_is_refused_and_inf_converts_and_verifies(tmp_path):
    bias = "model.layers.0.mlp.experts.gate_up_proj_bias"
    nan = _copy(EXAMPLE, tmp_path, "nan")
    _edit_tensor(
        nan, bias, lambda t: t.index_put_((torch.tensor(1), torch.tensor(3)), torch.tensor(float("nan"), dtype=t.dtype))
    )
    before = tree_digest(nan)
    _refused(_convert(nan, tmp_path / "out-nan"), "w13_bias", "NaN")
    assert tree_digest(nan) == before and not (tmp_path / "out-nan").exists()
    inf = _copy(EXAMPLE, tmp_path, "inf")
    _edit_tensor(
        inf, bias, lambda t: t.index_put_((torch.tensor(1), torch.tensor(3)), torch.tensor(float("inf"), dtype=t.dtype))
    )
    for profile in ("h100", "b200"):  # TRITON casts the bias to float32, TRTLLM keeps bf16
        out = tmp_path / f"out-inf-{profile}"
        assert run_cli("convert", inf, "--profile", profile, "-o", out).exit_code == 0
        assert run_cli("verify", out).exit_code == 0  # what convert writes, verify accepts


def test_5_nvfp4_nan_block_scale_is_refused(tmp_path):
    ckpt = make_nvfp4_checkpoint(tmp_path)
    name = next(n for n in _weight_map(ckpt) if n.endswith("experts.0.down_proj.weight_scale"))
    _edit_tensor(ckpt, name, lambda t: t.view(torch.uint8).index_fill_(1, torch.tensor([0]), 0x7F).view(t.dtype))
    _refused(_convert(ckpt, tmp_path / "out", "--profile", "b200"), "w2_weight_scale", "NaN")


# ---- 6 paths ---------------------------------------------------------------------------------------
def _index_entry(value):
    def plant(ckpt, tmp_path):
        index = json.loads((ckpt / INDEX).read_text())
        name = next(iter(index["weight_map"]))
        index["weight_map"][name] = value(tmp_path) if callable(value) else value
        (ckpt / INDEX).write_text(json.dumps(index))

    return plant


def _shard_symlink_outside(ckpt, tmp_path):
    rel = sorted(set(_weight_map(ckpt).values()))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(ckpt / rel, outside)
    (ckpt / rel).symlink_to(outside)


def _aux_symlink_outside(ckpt, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    (ckpt / "notes.txt").symlink_to(tmp_path / "secret.txt")


def _shard_fifo(ckpt, tmp_path):
    rel = sorted(set(_weight_map(ckpt).values()))[0]
    (ckpt / rel).unlink()
    os.mkfifo(ckpt / rel)


def _aux_fifo(ckpt, tmp_path):
    os.mkfifo(ckpt / "tokenizer_extra.json")


def _config_fifo(ckpt, tmp_path):
    (ckpt / "config.json").unlink()
    os.mkfifo(ckpt / "config.json")


@pytest.mark.parametrize(
    "plant, words",
    [
        (_index_entry("../model-00001-of-00001.safetensors"), "leaves its folder"),
        (_index_entry(lambda tmp: str(tmp / "model" / "model-00001-of-00001.safetensors")), "leaves its folder"),
        (_shard_symlink_outside, "outside"),
        (_aux_symlink_outside, "outside"),
        (_shard_fifo, "FIFO"),
        (_aux_fifo, "FIFO"),
        (_config_fifo, "FIFO"),
    ],
    ids=[
        "index-dotdot",
        "index-absolute",
        "shard-symlink-out",
        "aux-symlink-out",
        "shard-fifo",
        "aux-fifo",
        "config-fifo",
    ],
)
def test_6_source_paths_stay_inside_and_only_regular_files_are_read(tmp_path, plant, words):
    ckpt = _copy(EXAMPLE, tmp_path)
    plant(ckpt, tmp_path)
    if words == "FIFO":  # in a process of its own, with a timeout: it must never wait on the FIFO
        proc = _cli("convert", ckpt, "--profile", "h100", "-o", tmp_path / "out", timeout=60)
        code, stderr = proc.returncode, proc.stderr
    else:
        result = _convert(ckpt, tmp_path / "out")
        code, stderr = result.exit_code, result.stderr
    assert code == 2 and stderr.startswith("error:") and words in stderr, stderr
    assert not (tmp_path / "out").exists()
    if plant not in (_aux_symlink_outside, _aux_fifo):  # inspect and select do not read aux files
        for cmd in (("inspect", ckpt), ("select", ckpt, "--profile", "h100")):
            assert run_cli(*cmd).exit_code == 2


def test_6_the_hub_cache_blobs_a_snapshot_links_to_are_allowed(tmp_path):
    from fixtures_ckpt import make_hf_cache

    cache = make_hf_cache(tmp_path, src=EXAMPLE)
    assert any(p.is_symlink() for p in cache.snapshot_dir.iterdir())
    assert run_cli("convert", cache.snapshot_dir, "--profile", "h100", "-o", tmp_path / "out").exit_code == 0
    result = run_cli(
        "convert",
        cache.repo_id,
        "--cache-dir",
        cache.cache_dir,
        "--profile",
        "h100",
        "-o",
        tmp_path / "out-hub",
        env=cache.env(),
    )
    assert result.exit_code == 0, result.stderr


def _manifest_file_entry(value):
    def plant(art, tmp_path):
        manifest = _manifest(art)
        rank = manifest["ranks"][0]
        old = rank["files"][0]["file"]
        rank["files"][0]["file"] = value
        for info in rank["tensors"].values():
            if info["file"] == old:
                info["file"] = value
        _reseal(art, manifest)

    return plant


def _artifact_file_symlink_out(art, tmp_path):
    rel = _manifest(art)["ranks"][0]["files"][0]["file"]
    shutil.move(art / rel, tmp_path / "moved.safetensors")
    (art / rel).symlink_to(tmp_path / "moved.safetensors")


def _artifact_file_fifo(art, tmp_path):
    rel = _manifest(art)["ranks"][0]["files"][0]["file"]
    (art / rel).unlink()
    os.mkfifo(art / rel)


@pytest.mark.parametrize(
    "plant, verify_code",
    [
        (_manifest_file_entry("../../secret.safetensors"), 2),
        (_manifest_file_entry("/etc/hostname"), 2),
        (_artifact_file_symlink_out, 1),
        (_artifact_file_fifo, 1),
    ],
    ids=["manifest-dotdot", "manifest-absolute", "artifact-symlink-out", "artifact-fifo"],
)
def test_6_artifact_paths_stay_inside_for_verify_inspect_and_the_loader(tp2, tmp_path, plant, verify_code):
    art = _copy(tp2, tmp_path, "art")
    plant(art, tmp_path)
    if plant is _artifact_file_fifo:  # in a process of its own, with a timeout: it must never wait on the FIFO
        proc = _cli("verify", art, "--source", EXAMPLE, timeout=60)
    else:
        result = run_cli("verify", art, "--source", EXAMPLE)
        proc = subprocess.CompletedProcess([], result.exit_code, result.stdout, result.stderr)
    assert proc.returncode == verify_code and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    if verify_code == 2:
        assert "leaves its folder" in proc.stderr
        assert run_cli("inspect", art).exit_code == 2
    else:
        assert "outside" in proc.stdout or "FIFO" in proc.stdout, proc.stdout
    with pytest.raises(MxconvertError):
        load_artifact(art, rank=0)


# ---- 7 the user's situation ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (("--tp", "0"), "tp"),
        (("--tp", "-2"), "tp"),
        (("--ep", "3"), "--ep 3"),
        (("--rank", "-1"), "--rank"),
        (("--rank", "7"), "--rank"),
        (("--max-shard-size", "nan"), "--max-shard-size"),
        (("--max-shard-size", "inf"), "--max-shard-size"),
        (("--max-shard-size", "0"), "--max-shard-size"),
        (("--max-shard-size", "1e400"), "--max-shard-size"),
        (("--tp", "99999999999999999999"), "--tp"),
        (("--env", "NOEQUALS"), "--env"),
        (("--activation", "fp64"), "--activation"),
        (("--runtime", "vllm-9"), "vllm-9"),
        (("--profile", "/nonexistent/profile.toml"), "profile"),
    ],
    ids=lambda v: "_".join(v) if isinstance(v, tuple) else None,
)
def test_7_odd_option_values_are_exit_2_and_one_line(tmp_path, args, words):
    result = _convert(EXAMPLE, tmp_path / "out", *args)
    _refused(result, words)
    assert list(tmp_path.iterdir()) == []


def test_7_out_under_a_file_and_a_full_disk_are_exit_2(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    _refused(_convert(EXAMPLE, tmp_path / "afile" / "out"), "choose another -o")
    monkeypatch.setenv("MXCONVERT_FAULT", "write:2:enospc")
    _refused(_convert(EXAMPLE, tmp_path / "out"), "No space left on device", "was not created")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_7_a_read_only_parent_is_exit_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _refused(_convert(EXAMPLE, ro / "out"), "Permission denied")
    finally:
        ro.chmod(0o755)


def test_7_a_source_changed_while_read_is_refused(tmp_path, monkeypatch):
    ckpt = _copy(EXAMPLE, tmp_path)
    import mxconvert.pipeline.convert as convert_module

    real = convert_module.fault_point
    shard = ckpt / sorted(set(_weight_map(ckpt).values()))[0]

    def touch_source(kind, what=""):
        if kind == "write" and not getattr(touch_source, "done", False):
            touch_source.done = True
            os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))  # another process rewrote it
        real(kind, what)

    monkeypatch.setattr(convert_module, "fault_point", touch_source)
    _refused(_convert(ckpt, tmp_path / "out"), "changed while it was being read")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def _m_not_json(m):
    return "{not json"


def _m_list(m):
    return []


def _m_ranks_string(m):
    m["ranks"] = "0"
    return m


def _m_tensor_in_unlisted_file(m):
    info = next(iter(m["ranks"][0]["tensors"].values()))
    info["file"] = "rank-00000/other.safetensors"
    return m


def _m_plan_missing(m):
    del m["ranks"][0]["plan"]["i_end"]
    return m


def _m_shape_strings(m):
    next(iter(m["ranks"][0]["tensors"].values()))["layout"]["view_shape"] = ["a"]
    return m


def _m_deep(m):
    return "[" * 100000 + "]" * 100000


def _m_bad_view(m):
    next(iter(m["ranks"][0]["tensors"].values()))["layout"]["view_stride"] = [10**9, 1, 1]
    return m


def _m_tp_string(m):
    m["target"]["tp_size"] = "2"
    return m


@pytest.mark.parametrize(
    "edit",
    [
        _m_not_json,
        _m_list,
        _m_ranks_string,
        _m_tensor_in_unlisted_file,
        _m_plan_missing,
        _m_shape_strings,
        _m_deep,
        _m_bad_view,
        _m_tp_string,
    ],
    ids=[
        "not-json",
        "json-list",
        "ranks-string",
        "tensor-in-unlisted-file",
        "plan-missing",
        "shape-strings",
        "deeply-nested",
        "view-past-buffer",
        "tp-string",
    ],
)
def test_7_malformed_manifests_are_exit_2_everywhere_and_loader_errors_are_ours(tp2, tmp_path, edit):
    art = _copy(tp2, tmp_path, "art")
    result = edit(_manifest(art))
    if isinstance(result, dict):
        _reseal(art, result)
    else:
        (art / MANIFEST_NAME).write_text(result if isinstance(result, str) else json.dumps(result))
    before = tree_digest(art)
    for cmd, codes in ((("verify", art), (1, 2)), (("inspect", art), (0, 1, 2))):  # inspect only shows
        res = run_cli(*cmd)
        assert res.exit_code in codes and "internal error" not in res.stderr and "Traceback" not in res.stderr, (
            cmd,
            res.stdout,
            res.stderr,
        )
    with pytest.raises(MxconvertError):
        load_artifact(art, rank=0)
    assert tree_digest(art) == before
    if edit is not _m_bad_view:  # (a sealed, well-formed manifest is an artifact --force may replace)
        assert _convert(EXAMPLE, art, "--force").exit_code == 2  # not an intact artifact: never replaced
        assert tree_digest(art) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda art: load_artifact(art, rank="0"),
        lambda art: load_artifact(art, rank=5),
        lambda art: load_artifact(art, expect={"nonsense": 1}),
        lambda art: load_artifact(art, expect=["backend"]),
        lambda art: load_artifact(art / "missing"),
    ],
    ids=["rank-string", "rank-absent", "unknown-expect", "expect-list", "missing-folder"],
)
def test_7_load_artifact_raises_mxconvert_errors_for_odd_arguments(tp2, call):
    with pytest.raises(InputError):
        call(tp2)


# ---- 8 signals at start-up ---------------------------------------------------------------------------
# The child runs the command under an import hook that stops at the first import of MODULE, tells
# the test through a pipe, and goes on only once the test has sent the signal: the signal lands
# inside that import at every run, whatever the machine's load (no sleep decides the moment).
_PAUSE_AT_IMPORT = """
import os, runpy, sys
module, at_fd, go_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

class PauseAt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.write(at_fd, b"at")
            os.read(go_fd, 1)  # the signal arrives while this import runs
        return None

sys.meta_path.insert(0, PauseAt())
sys.argv = ["mxconvert", *sys.argv[4:]]
runpy.run_module("mxconvert", run_name="__main__", alter_sys=True)
"""

#: What a run interrupted before its artifact was in place may say of OUT: nothing is there.
_NOTHING_WRITTEN = re.compile(r"interrupted by (SIGINT|SIGTERM|SIGHUP); (nothing was written|\S.* was not created)")


def _interrupted_at_start(tmp_path: Path, sig: signal.Signals, module: str | None) -> tuple[int, str]:
    """Start a convert with the handled signals blocked (as if they came while the interpreter
    starts); send `sig` at once (`module` None: it waits until mxconvert unblocks them) or while
    `module` is being imported for the first time. Returns the exit code and stderr."""
    cmd = ["convert", str(EXAMPLE), "--profile", "h100", "-o", str(tmp_path / "out")]
    if module is None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mxconvert", *cmd],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_block_signals,
        )
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
        return proc.returncode, stderr
    at_read, at_write = os.pipe()
    go_read, go_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PAUSE_AT_IMPORT, module, str(at_write), str(go_read), *cmd],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_block_signals,
            pass_fds=(at_write, go_read),
        )
        os.close(at_write)
        os.close(go_read)
        at = os.read(at_read, 2)  # b"" if the child ended without importing `module`
        if at == b"at":
            proc.send_signal(sig)
            os.write(go_write, b"g")
        _, stderr = proc.communicate(timeout=120)
        assert at == b"at", f"the command never imported {module}: {stderr}"
        return proc.returncode, stderr
    finally:
        for fd in (at_read, go_write):
            os.close(fd)


@pytest.mark.parametrize(
    "sig, module",
    [
        (signal.SIGINT, None),
        (signal.SIGTERM, None),
        (signal.SIGHUP, None),
        (signal.SIGINT, "typer"),
        (signal.SIGTERM, "typer"),
        (signal.SIGHUP, "typer"),
        (signal.SIGINT, "numpy"),
        (signal.SIGTERM, "numpy"),
    ],
    ids=["INT-0s", "TERM-0s", "HUP-0s", "INT-typer", "TERM-typer", "HUP-typer", "INT-numpy", "TERM-numpy"],
)
def test_8_a_signal_during_start_up_imports_is_exit_128_plus_n_without_traceback(tmp_path, sig, module):
    """The invariant, whatever moment of start-up the signal lands on: exit 128 + N, no
    traceback, one line saying nothing was written (either wording), and nothing on disk."""
    returncode, stderr = _interrupted_at_start(tmp_path, sig, module)
    assert returncode == 128 + sig, (returncode, stderr)
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    message = _without_progress(stderr)
    assert _NOTHING_WRITTEN.fullmatch(message.strip()), stderr
    assert message.startswith(f"interrupted by {sig.name}; "), stderr
    assert list(tmp_path.iterdir()) == []


# ---- 9 declared dependencies ---------------------------------------------------------------------------
def test_9_every_third_party_module_the_package_imports_is_a_declared_dependency():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {
        d.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower().replace("-", "_")
        for d in declared
    }
    stdlib = set(sys.stdlib_module_names)
    imported = set()
    for path in (ROOT / "mxconvert").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    optional = {"vllm", "sglang", "flashinfer", "triton_kernels", "aiter", "triton", "matplotlib"}  # guarded imports
    third_party = {m for m in imported - stdlib - optional if m != "mxconvert"}
    assert third_party <= names, f"imported but not declared: {sorted(third_party - names)}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip\"? install -q \.$", ci, re.M) and "make test" in ci  # a plain install, then the suite
