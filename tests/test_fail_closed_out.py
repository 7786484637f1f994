"""Fail closed, round 2, on the output side (issue "Fail closed, round 2", classes 1, 2, 3, 6, 7 and
the artifact-entry names of 9): nothing written outside OUT, nothing deleted that is not ours, no
staging folder shared or deleted while alive, no damaged artifact "up to date", and a dry run that
refuses what a run refuses. Each case asserts the exit status, the message and the disk state.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLE, flip_stored_bits, rank_tensor, run_cli

MANIFEST = "mxconvert.json"


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (links not followed): folders, links with their target, files
    with their sha256, so that any entry created, removed or changed shows."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                found[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _refused(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def _convert(out, *extra, src=EXAMPLE):
    profile = () if "-p" in extra or "--profile" in extra else ("-p", "h100")
    return run_cli("convert", src, *profile, "-o", out, *extra)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """A converted artifact (h100, TP 1), copied by the tests that change it."""
    out = tmp_path_factory.mktemp("art") / "art"
    result = _convert(out)
    assert result.exit_code == 0, result.stderr
    return out


def _copy_artifact(artifact: Path, dst: Path) -> Path:
    shutil.copytree(artifact, dst, symlinks=True)
    return dst


def _profile_file(folder: Path, name: str, filename: str = "p.json") -> Path:
    path = folder / filename
    path.write_text(json.dumps({"base": "h100", "name": name}))
    return path


# ---- 1 nothing written outside OUT; targets never share a folder --------------------------------------
@pytest.mark.parametrize("name", ["../escape", "../../escape", "/ABS", "a/b", ".", "..", "-x", "a b", "x" * 101])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_1_a_profile_name_that_is_not_a_folder_name_is_refused_before_writing(tmp_path, artifact, name, force):
    work = tmp_path / "work"
    work.mkdir()
    if name == "/ABS":
        name = str(tmp_path / "abs")
    for victim in (work / "escape-tp1", tmp_path / "escape-tp1"):  # where `../escape` would land:
        _copy_artifact(artifact, victim)  # an unrelated artifact that --force would have replaced
    prof = _profile_file(tmp_path, name)
    before = snapshot(tmp_path)
    result = _convert(work / "out", "-p", prof, "-p", "b200", *(["--force"] if force else []))
    _refused(result, "cannot name a target folder", "set `name` in the profile file")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "profiles",
    [
        ("h100", "H100"),  # an alias spelled two ways
        ("h100", "h100.json"),  # a profile file named like a built-in
        ("h100", "upper.json"),  # ... differing only in case (one folder on a case-insensitive disk)
        ("p1.json", "p2.json"),  # two files, one name
    ],
    ids=["alias-case", "file-like-builtin", "file-case", "two-files"],
)
def test_1_targets_whose_folders_collide_are_refused_before_writing(tmp_path, profiles):
    _profile_file(tmp_path, "h100", "h100.json")
    _profile_file(tmp_path, "H100", "upper.json")
    _profile_file(tmp_path, "same", "p1.json")
    _profile_file(tmp_path, "same", "p2.json")
    args = [a for p in profiles for a in ("-p", tmp_path / p if p.endswith(".json") else p)]
    before = snapshot(tmp_path)
    for extra in ((), ("--dry-run",)):
        result = _convert(tmp_path / "out", *args, *extra)
        _refused(result, "two targets would both be written to OUT/")
    assert snapshot(tmp_path) == before


def test_1_a_file_is_written_only_at_a_path_proven_inside_the_staging_folder(tmp_path):
    from mxconvert.core.errors import InputError
    from mxconvert.pipeline.output import path_inside

    staging, outside = tmp_path / "staging", tmp_path / "outside"
    staging.mkdir()
    outside.mkdir()
    (staging / "rank-00000").symlink_to(outside)  # a folder on the way leaves the staging folder
    (staging / "taken").write_text("x")
    for rel, words in (
        ("rank-00000/model.safetensors", "resolves outside"),
        ("../x", "not a path inside"),
        ("/etc/x", "not a path inside"),
        ("taken", "same name"),
    ):
        with pytest.raises(InputError, match=words):
            path_inside(staging, rel)
    assert path_inside(staging, "shared/x") == staging / "shared" / "x"
    assert list(outside.iterdir()) == []


# ---- 2 --force removes only what the manifest lists ----------------------------------------------------
def _plant_user_file(art: Path) -> str:
    (art / "serve.sh").write_text("vllm serve .\n")
    return "serve.sh"


def _plant_in_rank_folder(art: Path) -> str:
    (art / "rank-00000" / "notes.txt").write_text("mine")
    return "rank-00000/notes.txt"


def _plant_folder(art: Path) -> str:
    (art / "mine").mkdir()
    (art / "mine" / "data.bin").write_bytes(b"\1\2")
    return "mine"


def _plant_edited_copy(art: Path) -> str:
    (art / "config.json").write_text((art / "config.json").read_text() + " ")
    return "config.json"


def _plant_folder_at_listed_path(art: Path) -> str:
    shard = next((art / "shared").iterdir())
    shard.unlink()
    shard.mkdir()
    (shard / "keep.txt").write_text("mine")
    return f"shared/{shard.name}"


@pytest.mark.parametrize(
    "plant",
    [_plant_user_file, _plant_in_rank_folder, _plant_folder, _plant_edited_copy, _plant_folder_at_listed_path],
    ids=["top-level-file", "file-in-rank-folder", "user-folder", "edited-copied-file", "folder-at-a-listed-path"],
)
def test_2_force_refuses_an_artifact_holding_files_it_does_not_list(tmp_path, artifact, plant):
    art = _copy_artifact(artifact, tmp_path / "art")
    unlisted = plant(art)
    before = snapshot(tmp_path)
    result = _convert(art, "-p", "b200", "--force")
    _refused(result, "its manifest does not list", unlisted, "nothing was touched")
    assert snapshot(tmp_path) == before


def test_2_a_manifest_copied_into_a_folder_of_user_files_is_no_licence(tmp_path, artifact):
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(artifact / MANIFEST, folder / MANIFEST)
    shutil.copy(artifact / "config.json", folder / "config.json")  # even a file of the same name and bytes
    (folder / "train.py").write_text("print('mine')\n")
    before = snapshot(tmp_path)
    _refused(_convert(folder, "--force"), "train.py", "nothing was touched")
    assert snapshot(tmp_path) == before


def test_2_force_replaces_a_damaged_artifact_of_ours_and_never_follows_its_links(tmp_path, artifact):
    art = _copy_artifact(artifact, tmp_path / "art")
    key, shard = rank_tensor(art, "w13_weight")
    flip_stored_bits(shard, key, 0, 0x01)  # damaged bytes: still ours
    outside = tmp_path / "outside.safetensors"
    other = next((art / "shared").iterdir())
    shutil.copy(other, outside)
    other.unlink()
    other.symlink_to(outside)  # a listed file replaced by a link: the link is removed, never its target
    keep = snapshot(tmp_path)["outside.safetensors"]
    result = _convert(art, "--force")
    assert result.exit_code == 0, result.stderr
    assert run_cli("verify", art).exit_code == 0
    assert snapshot(tmp_path)["outside.safetensors"] == keep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "outside.safetensors"]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_2_a_file_that_appears_in_out_during_the_replace_is_kept(tmp_path, artifact, monkeypatch, exchange):
    from mxconvert.pipeline import output

    out = _copy_artifact(artifact, tmp_path / "out")
    real = output.exchange

    def late_writer(a, b):  # a user's file lands in OUT after the check, before the swap
        (b / "late.txt").write_text("mine")
        return real(a, b) if exchange else False

    monkeypatch.setattr(output, "exchange", late_writer)
    result = _convert(out, "-p", "b200", "--force")
    assert result.exit_code == 0, result.stderr
    assert run_cli("verify", out).exit_code == 0
    (kept,) = tmp_path.glob("out.mxconvert-kept-*")
    assert snapshot(kept) == {
        "late.txt": "file:" + hashlib.sha256(b"mine").hexdigest(),
        MANIFEST: snapshot(kept)[MANIFEST],
    }


def test_2_recovery_removes_only_what_a_leftover_lists(tmp_path, artifact):
    from mxconvert.pipeline.output import recover_interrupted

    out = _copy_artifact(artifact, tmp_path / "out")
    old = _copy_artifact(artifact, tmp_path / ".out.mxconvert-old-0123abcd")
    (old / "serve.sh").write_text("mine")
    cut = tmp_path / ".out.mxconvert-staging-89ab"  # a staging folder cut short: all of it that run's
    (cut / "rank-00000").mkdir(parents=True)
    (cut / "rank-00000" / "half.safetensors").write_bytes(b"\0" * 8)
    recover_interrupted(out)
    (kept,) = tmp_path.glob("out.mxconvert-kept-*")
    assert sorted(snapshot(kept)) == [MANIFEST, "serve.sh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", kept.name]


# ---- 3 one run per OUT, across PID namespaces; leftovers only cleaned under the lock ---------------------
def _hold_lock(lock: Path) -> subprocess.Popen:
    """Another process (think: another container) holding OUT's lock until its stdin closes."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, b'pid 7 on host elsewhere')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"  # synchronised on the moment, no sleep
    return proc


def _release(proc: subprocess.Popen) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=30)


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def test_3_a_second_convert_to_the_same_out_is_refused_and_its_staging_folder_kept(tmp_path, artifact):
    out = _copy_artifact(artifact, tmp_path / "out")
    # the live run's staging folder, named as in another PID namespace: its PID is dead *here*
    live = tmp_path / f".out.mxconvert-staging-{_dead_pid()}"
    live.mkdir()
    (live / "half.safetensors").write_bytes(b"\0" * 64)
    holder = _hold_lock(tmp_path / ".out.mxconvert.lock")
    try:
        before = snapshot(tmp_path)
        for extra in (("--force",), ("-p", "b200", "--force")):
            result = _convert(out, *extra)
            _refused(result, "is being written by another mxconvert convert", "pid 7 on host elsewhere")
        assert snapshot(tmp_path) == before
        from mxconvert.core.errors import InputError
        from mxconvert.pipeline.output import recover_interrupted

        with pytest.raises(InputError, match="being written by another"):
            recover_interrupted(out)
        assert snapshot(tmp_path) == before
    finally:
        _release(holder)
    result = _convert(out, "-p", "b200", "--force")  # the holder is gone: its leftovers are cleaned
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_3_staging_names_are_random_not_pids(tmp_path, monkeypatch):
    from mxconvert.pipeline import output

    monkeypatch.setattr(os, "getpid", lambda: 4242)  # two runs with one PID (two PID namespaces)
    names = {output.staging_path(tmp_path / "out").name for _ in range(20)}
    assert len(names) == 20 and not any("4242" in n for n in names)


def test_3_a_lock_file_left_by_a_killed_run_does_not_block_and_a_planted_link_is_refused(tmp_path):
    stale = tmp_path / ".out.mxconvert.lock"
    stale.write_text("pid 1 on host gone")  # the file stays after SIGKILL; its lock does not
    result = _convert(tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    target = tmp_path / "target.txt"
    target.write_text("keep")
    (tmp_path / ".other.mxconvert.lock").symlink_to(target)
    before = snapshot(tmp_path)
    _refused(_convert(tmp_path / "other"), "lock file")
    assert snapshot(tmp_path) == before


# ---- 6 up to date means the same bytes --------------------------------------------------------------------
def _flip_rank_byte(art: Path) -> None:
    key, shard = rank_tensor(art, "w13_weight")
    flip_stored_bits(shard, key, 3, 0x10)


def _flip_copied_byte(art: Path) -> None:
    path = art / "config.json"
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))


def _link_rank_file(art: Path) -> None:
    _, shard = rank_tensor(art, "w13_weight")
    copy = art.parent / "elsewhere.safetensors"
    shutil.copy(shard, copy)
    shard.unlink()
    shard.symlink_to(copy)


def _link_rank_folder(art: Path) -> None:
    folder = art / "rank-00000"
    copy = art.parent / "elsewhere"
    shutil.copytree(folder, copy)
    shutil.rmtree(folder)
    folder.symlink_to(copy)


@pytest.mark.parametrize(
    "damage",
    [_flip_rank_byte, _flip_copied_byte, _link_rank_file, _link_rank_folder],
    ids=["rank-byte", "copied-byte", "rank-file-link", "rank-folder-link"],
)
def test_6_a_damaged_artifact_is_not_up_to_date(tmp_path, artifact, damage):
    art = _copy_artifact(artifact, tmp_path / "art")
    damage(art)
    before = snapshot(tmp_path)
    ours = damage in (_flip_rank_byte, _link_rank_file)  # --force replaces it: the refusal says so
    for extra in ((), ("--dry-run",), ("--json",)):
        result = _convert(art, *extra)
        # issue 23 item 4: --force is named only where it would then work
        _refused(result, "already exists; pass --force" if ours else "move them out of it or choose another -o")
        assert "up to date" not in result.stdout + result.stderr
    assert snapshot(tmp_path) == before
    if damage in (_flip_rank_byte, _link_rank_file):  # damaged bytes, or a link in place of a listed file:
        assert _convert(art, "--force").exit_code == 0  # still ours to replace
        assert run_cli("verify", art).exit_code == 0
        assert _convert(art).exit_code == 0  # and now it is up to date
    else:  # an edited copied file is the user's now; a folder link is not a listed file: refused
        _refused(_convert(art, "--force"), "config.json" if damage is _flip_copied_byte else "rank-00000")
        assert snapshot(tmp_path) == before


def test_6_an_out_that_is_a_link_to_an_artifact_is_not_up_to_date(tmp_path, artifact):
    link = tmp_path / "link"
    link.symlink_to(artifact)
    _refused(_convert(link), "not a folder")  # issue 23 item 4: not "pass --force", which refuses too
    _refused(_convert(link, "--force"), "not a folder")
    assert link.is_symlink()


# ---- 7 a dry run refuses what a run refuses ----------------------------------------------------------------
def _inside_source(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "model"
    shutil.copytree(EXAMPLE, src)
    return src, src / "out"


def _under_a_file(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "afile").write_text("x")
    return EXAMPLE, tmp_path / "afile" / "out"


def _under_a_file_deeper(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "afile").write_text("x")
    return EXAMPLE, tmp_path / "afile" / "a" / "out"


def _containing_the_source(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "box" / "model"
    shutil.copytree(EXAMPLE, src)
    return src, tmp_path / "box"


@pytest.mark.parametrize(
    "case, words",
    [
        (_inside_source, "must not be the source checkpoint"),
        (_containing_the_source, "must not be the source checkpoint"),
        (_under_a_file, "is not a folder"),
        (_under_a_file_deeper, "is not a folder"),
    ],
    ids=["inside-source", "contains-source", "parent-is-a-file", "ancestor-is-a-file"],
)
def test_7_dry_run_and_convert_refuse_the_same_outputs(tmp_path, case, words):
    src, out = case(tmp_path)
    before = snapshot(tmp_path)
    dry = _convert(out, "--dry-run", src=src)
    real = _convert(out, src=src)
    _refused(dry, words)
    _refused(real, words)
    assert dry.stderr == real.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_7_dry_run_refuses_a_read_only_parent_as_convert_does(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for extra in ((), ("--dry-run",)):
            _refused(_convert(ro / "out", *extra), "Permission denied")
    finally:
        ro.chmod(0o755)


# ---- 9 checkpoint files named like the artifact's own entries ------------------------------------------------
@pytest.mark.parametrize("name", ["mxconvert.json", "shared", "rank-00000", "rank-00001", "Shared", "MXCONVERT.JSON"])
def test_9_a_checkpoint_file_named_like_an_artifact_entry_is_refused_up_front(tmp_path, name):
    src = tmp_path / "model"
    shutil.copytree(EXAMPLE, src)
    (src / name).write_text("{}")
    before = snapshot(tmp_path)
    for extra in ((), ("--dry-run",), ("-p", "b200", "--tp", "2")):
        _refused(_convert(tmp_path / "out", *extra, src=src), name, "named like an entry of the artifact")
    assert snapshot(tmp_path) == before


def test_9_the_library_convert_refuses_it_too(tmp_path):
    from mxconvert.core.errors import InputError
    from mxconvert.pipeline.targets import convert

    src = tmp_path / "model"
    shutil.copytree(EXAMPLE, src)
    (src / "rank-00000").write_text("x")
    with pytest.raises(InputError, match="named like an entry"):
        convert(str(src), tmp_path / "out", profile="h100")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_library_convert_writes_what_the_cli_writes(tmp_path, artifact):
    from mxconvert.pipeline.targets import convert, plan

    (planned,) = plan(str(EXAMPLE), profile="h100")
    assert planned.plan.selection.backend.value == "TRITON"
    result = convert(str(EXAMPLE), tmp_path / "lib", profile="h100")
    (target,) = result.targets
    assert target.status == "written" and result.to_json()["schema"] == "mxconvert.convert/1"
    assert (tmp_path / "lib" / MANIFEST).read_bytes() != b""
    mine = json.loads((tmp_path / "lib" / MANIFEST).read_text())
    cli = json.loads((artifact / MANIFEST).read_text())
    assert mine["ranks"] == cli["ranks"] and mine["shared"] == cli["shared"]
    again = convert(str(EXAMPLE), tmp_path / "lib", profile="h100")
    assert again.targets[0].status == "up_to_date"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lib"]
