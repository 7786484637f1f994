"""Durable writes (issue 24 item 2, docs/artifact.md "Writing OUT"): every file and folder of the
staging folder is fsynced before the rename into place, OUT's parent folder after it; the disk
writes start while the files are written (`Writeback`); `MXCONVERT_FAULT=no-fsync` turns it all off
(benchmarks only); a failing fsync fails the conversion closed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.core.errors import InputError
from mxconvert.pipeline import durable, output
from mxconvert.pipeline.targets import convert


def _record_fsyncs(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync as ("fsync", path of the descriptor), and every `output.replace` as ("replace", OUT)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, output.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(staging: Path, out: Path, force: bool) -> None:
        events.append(("replace", str(out)))
        real_replace(staging, out, force)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(output, "replace", replace)
    return events


def _artifact_entries(out: Path) -> tuple[set[str], set[str]]:
    """(files, folders) of an artifact, relative to it ("." for itself)."""
    files, folders = set(), {"."}
    for dirpath, dirnames, filenames in os.walk(out):
        base = Path(dirpath).relative_to(out)
        files |= {(base / name).as_posix() for name in filenames}
        folders |= {(base / name).as_posix() for name in dirnames}
    return files, folders


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through /proc")
def test_every_file_and_folder_is_fsynced_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    events = _record_fsyncs(monkeypatch)
    out = tmp_path / "out"
    convert(str(EXAMPLE), out, profile="h100", jobs=2)
    at = events.index(("replace", str(out)))
    before, after = events[:at], events[at + 1 :]
    staging = {Path(path).parent for _, path in before if Path(path).name == "mxconvert.json"}
    assert len(staging) == 1, before  # one staging folder, holding the manifest
    (root,) = staging
    assert root.name.startswith(".out.mxconvert-staging-") and root.parent == tmp_path
    synced = [os.path.relpath(path, root) for _, path in before]
    files, folders = _artifact_entries(out)
    assert set(synced) == files | folders  # every file and folder of what became OUT, nothing else
    assert synced[-1] == "."  # the staging folder last: after every entry in it
    assert synced.index("rank-00000") > max(synced.index(f) for f in files if f.startswith("rank-00000/"))
    assert ("fsync", str(tmp_path)) in after  # the rename itself is on disk


def test_replacing_an_artifact_syncs_the_parent_after_the_swap(tmp_path, monkeypatch):
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    out = tmp_path / "out"
    convert(str(EXAMPLE), out, profile="h100", jobs=2)
    events = _record_fsyncs(monkeypatch)
    convert(str(EXAMPLE), out, profile="b200", jobs=2, force=True)
    at = events.index(("replace", str(out)))
    assert ("fsync", str(tmp_path)) in events[at + 1 :]


def test_no_fsync_switch_turns_every_fsync_and_the_writeback_off(tmp_path, monkeypatch):
    monkeypatch.setenv("MXCONVERT_FAULT", "no-fsync")
    events = _record_fsyncs(monkeypatch)
    assert durable.Writeback()._pool is None
    convert(str(EXAMPLE), tmp_path / "out", profile="h100", jobs=2)
    assert [e for e in events if e[0] == "fsync"] == []
    assert run_cli("verify", tmp_path / "out").exit_code == 0


def test_a_failing_fsync_fails_closed(tmp_path, monkeypatch):
    """EIO at fsync (a write the disk refused, surfacing at writeback): exit 2, nothing at OUT,
    no staging folder left."""
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="nothing was written"):
        convert(str(EXAMPLE), out, profile="h100", jobs=2)
    assert list(tmp_path.iterdir()) == []
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out)
    assert result.exit_code == 2 and not out.exists()


def test_writeback_starts_each_new_step_of_a_file(tmp_path, monkeypatch):
    """`Writeback` queues the disk writes of what was written since its last start, once a step's
    worth: ranges in order, each byte once, on the file written."""
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    calls: list[tuple[str, int, int, int]] = []

    def recording(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, nbytes, flags))
        return 0

    monkeypatch.setattr(durable, "_sync_file_range", lambda: recording)
    path = tmp_path / "f"
    path.write_bytes(b"\0" * 100)
    writeback = durable.Writeback(step_bytes=40)
    for size in (10, 39, 40, 70, 100):
        writeback.written(path, size)
    writeback.close()
    assert calls == [(str(path), 0, 40, 2), (str(path), 40, 60, 2)]


def test_writeback_runs_during_a_real_conversion(tmp_path, monkeypatch):
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    calls: list[tuple[int, int]] = []
    real = durable._sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range on this platform")

    def recording(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((offset, nbytes))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(durable, "_sync_file_range", lambda: recording)
    monkeypatch.setattr(durable, "WRITEBACK_BYTES", 64 << 10)
    convert(str(EXAMPLE), tmp_path / "out", profile="h100", jobs=durable.WRITEBACK_MIN_CORES)
    assert calls and all(n >= 64 << 10 for _, n in calls)
    assert run_cli("verify", tmp_path / "out").exit_code == 0


def test_writeback_starts_early_only_where_cores_are_to_spare(monkeypatch):
    """On a small machine the early writeback takes the cores the layouts need (bench/README.md):
    the flush is left to the final fsync there; `no-writeback` turns it off everywhere."""
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    assert not durable.writeback_pays(2)
    assert durable.writeback_pays(durable.WRITEBACK_MIN_CORES) and durable.writeback_pays(16)
    monkeypatch.setenv("MXCONVERT_FAULT", "no-writeback")
    assert not durable.writeback_pays(16)
    assert durable.Writeback(enabled=False)._pool is None


def test_new_parent_folders_are_synced_in_their_parents(tmp_path, monkeypatch):
    """`-o a/b/out` with a/ and a/b/ missing: each new folder's entry is on disk too."""
    monkeypatch.delenv("MXCONVERT_FAULT", raising=False)
    events = _record_fsyncs(monkeypatch)
    out = tmp_path / "a" / "b" / "out"
    convert(str(EXAMPLE), out, profile="h100", jobs=2)
    synced = [path for kind, path in events if kind == "fsync"]
    assert str(tmp_path) in synced and str(tmp_path / "a") in synced  # a/ in tmp, b/ in a/
    assert synced.index(str(tmp_path)) < synced.index(str(tmp_path / "a"))
