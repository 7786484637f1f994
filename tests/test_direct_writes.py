"""Direct writes (issue 24; storage/output_file.py, docs/artifact.md "Writing OUT"): a file written
past the page cache holds exactly the bytes written, whatever the sizes of the pieces and of the
last block; a filesystem that refuses O_DIRECT (at open, at a write, or with a short write) gets
the same bytes through the page cache; a failed write fails the conversion closed; `--write-mode`
picks the way and never changes a byte of the artifact."""

from __future__ import annotations

import errno
import os
import random

import pytest
from helpers import EXAMPLE, run_cli, tree_digest

from mxconvert.core.errors import InputError
from mxconvert.pipeline import durable
from mxconvert.pipeline.targets import convert
from mxconvert.storage import output_file
from mxconvert.storage.output_file import OutputFile

BLOCK = 16 << 10  # small blocks: a few KB of pieces cross many of them


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(output_file, "BLOCK_BYTES", BLOCK)


@pytest.fixture
def claimed_direct(monkeypatch, small_blocks):
    """O_DIRECT as the flag 0: every filesystem opens the file, and the writer takes the direct path
    (aligned blocks, the last one padded, the file truncated) whatever the disk under the test."""
    monkeypatch.setattr(os, "O_DIRECT", 0, raising=False)


def _pieces(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 7, BLOCK - 1, 1, BLOCK, 3 * BLOCK + 5, 4095, 4097, 2 * BLOCK] + [
        rng.randrange(1, 3 * BLOCK) for _ in range(20)
    ]
    return [rng.randbytes(n) for n in sizes]


def _write(path, pieces: list[bytes], direct: bool = True) -> OutputFile:
    f = OutputFile(path, direct)
    for piece in pieces:
        f.write(memoryview(piece))
    f.close()
    return f


@pytest.mark.parametrize("cut", [0, 1, 4096, BLOCK, BLOCK + 1])
def test_the_file_holds_exactly_the_bytes_written(tmp_path, claimed_direct, cut):
    """Padding of the last block cut off: sizes ending anywhere in a block, on a block's edge, at 0."""
    pieces = _pieces(cut)
    pieces.append(b"\xff" * cut)
    f = _write(tmp_path / "f", pieces)
    assert f.direct  # the direct path ran (no fallback)
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    assert f.size == sum(map(len, pieces))


@pytest.mark.parametrize("direct", [True, False])
def test_direct_where_the_filesystem_allows_and_buffered_give_the_same_bytes(tmp_path, small_blocks, direct):
    pieces = _pieces(1)
    f = _write(tmp_path / "f", pieces, direct)
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    if not direct:
        assert not f.direct


def test_a_refused_open_writes_through_the_page_cache(tmp_path, small_blocks, monkeypatch):
    """tmpfs and some FUSE filesystems: EINVAL at open with O_DIRECT."""
    real_open = os.open

    def refusing(path, flags, mode=0o777, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        return real_open(path, flags, mode, **kwargs)

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform: always buffered")
    monkeypatch.setattr(os, "open", refusing)
    pieces = _pieces(2)
    f = _write(tmp_path / "f", pieces)
    assert not f.direct and (tmp_path / "f").read_bytes() == b"".join(pieces)


@pytest.mark.parametrize("failure", ["einval", "short"])
def test_a_refused_or_short_direct_write_goes_on_through_the_page_cache(tmp_path, claimed_direct, monkeypatch, failure):
    """EINVAL at a write (an alignment the disk wants larger), or a write that took fewer bytes:
    the descriptor drops O_DIRECT and that block and every later one are written buffered."""
    real_pwrite = os.pwrite
    calls = []

    def flaky(fd, data, offset):
        calls.append(offset)
        if len(calls) == 3:
            if failure == "einval":
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_pwrite(fd, data[: len(data) // 2 + 1], offset)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", flaky)
    pieces = _pieces(3)
    f = _write(tmp_path / "f", pieces)
    assert len(calls) > 3 and not f.direct
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_a_failed_write_raises_at_close_or_at_a_later_write(tmp_path, claimed_direct, monkeypatch):
    """ENOSPC in a writing thread reaches the caller; `abort` after it closes quietly."""

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    f = OutputFile(tmp_path / "f")
    with pytest.raises(OSError) as caught:
        for piece in _pieces(4):
            f.write(memoryview(piece))
        f.close()
    assert caught.value.errno == errno.ENOSPC
    f.abort()
    with pytest.raises(OSError):
        os.fstat(f._fd)  # closed


def test_a_failed_direct_write_fails_the_conversion_closed(tmp_path, monkeypatch):
    """ENOSPC at a write of the artifact: InputError saying nothing was written, no OUT, no staging."""
    monkeypatch.setattr(os, "O_DIRECT", 0, raising=False)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="No space left on device.*nothing was written"):
        convert(str(EXAMPLE), out, profile="h100", jobs=2, write_mode="direct")
    assert list(tmp_path.iterdir()) == []


def test_write_modes_give_byte_identical_artifacts(tmp_path):
    """direct, buffered and auto: the same files, byte for byte (the manifest included: it records
    no write mode)."""
    digests = {}
    for mode in ("direct", "buffered", "auto"):
        out = tmp_path / mode
        assert run_cli("convert", EXAMPLE, "-p", "b200", "--tp", "2", "-o", out, "--write-mode", mode).exit_code == 0
        digests[mode] = tree_digest(out)
    assert digests["direct"] == digests["buffered"] == digests["auto"]
    assert run_cli("verify", tmp_path / "direct").exit_code == 0


def test_an_unknown_write_mode_is_refused_before_anything_is_read(tmp_path):
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", tmp_path / "out", "--write-mode", "fast")
    assert result.exit_code == 2
    assert "--write-mode must be one of auto, direct, buffered, not 'fast'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_auto_writes_direct_where_cores_are_few():
    """The page cache's CPU is what a conversion on few cores waits for (bench/README.md)."""
    assert durable.direct_writes("auto", 2) and durable.direct_writes("auto", durable.WRITEBACK_MIN_CORES - 1)
    assert not durable.direct_writes("auto", durable.WRITEBACK_MIN_CORES)
    assert durable.direct_writes("direct", 64) and not durable.direct_writes("buffered", 1)


def test_direct_writes_start_no_writeback(tmp_path, monkeypatch):
    """Nothing dirty to start on: `Writeback` is not called for a direct writer."""
    monkeypatch.setattr(os, "O_DIRECT", 0, raising=False)
    started = []
    monkeypatch.setattr(durable.Writeback, "written", lambda self, path, size: started.append(path))
    convert(str(EXAMPLE), tmp_path / "direct", profile="h100", jobs=2, write_mode="direct")
    assert started == []
    convert(str(EXAMPLE), tmp_path / "buffered", profile="h100", jobs=2, write_mode="buffered")
    assert started


def test_files_get_the_mode_open_gives(tmp_path, small_blocks):
    """0o666 less the umask, as `open(path, "wb")` gave the artifact's files before."""
    with open(tmp_path / "plain", "wb"):
        pass
    for direct in (True, False):
        _write(tmp_path / f"f{direct}", [b"x"], direct)
        assert (tmp_path / f"f{direct}").stat().st_mode == (tmp_path / "plain").stat().st_mode
