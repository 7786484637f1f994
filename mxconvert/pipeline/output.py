"""OUT, the artifact folder `convert` writes: the checks before writing, the lock held while
writing, the staging folder, the atomic replace, and the recovery of what a killed run left.

The rules (docs/artifact.md, "Writing OUT"):
- `check_output` is the one check of OUT that `convert` and `convert --dry-run` both run.
- OUT may be missing or an empty folder (`mkdir -p $ART` in CI): both are written without `--force`,
  the empty folder replaced atomically like a missing OUT.
- What is *ours* (`owned_files`): the manifest and the files it lists (rank files, shared files,
  copied files). `--force` removes only those, and refuses an OUT that holds anything else.
- A run holds OUT's lock (`locked`) from its first check to its last write; every folder named
  `.OUT.mxconvert-staging-ID` / `.OUT.mxconvert-old-ID` seen while holding it was left by a run that
  is gone (whatever its host or PID namespace), so only then is it cleaned up.
- Every file is written at a path proven inside the staging folder (`path_inside`).
- Durable: every file and folder of the staging folder is fsynced before the rename into place,
  and OUT's parent after it (`sync_tree`, `replace`), so an artifact that carries its final name
  survives a crash of the machine right after `convert` returned (pipeline/durable.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mxconvert.artifact.manifest import MANIFEST_NAME, check_fingerprint, read_manifest
from mxconvert.core.errors import InputError, MxconvertError, signals_deferred
from mxconvert.core.faults import disabled as faults_disable
from mxconvert.core.faults import fault_point
from mxconvert.pipeline.durable import sync_folder
from mxconvert.storage.files import sha256_file


# ---- checks before writing -------------------------------------------------------------------------
def check_output(out: Path, source: Path, force: bool) -> None:
    """Refuse an OUT that `convert` could not or must not write, before anything is written.

    `convert` and `convert --dry-run` run this same function, so a dry run refuses exactly what a
    run would: where OUT is (`check_place`), and what is there (`check_replaceable`)."""
    check_place(out, source)
    check_replaceable(Path(os.path.abspath(out)), force)


def check_place(out: Path, source: Path) -> None:
    """Refuse an OUT that is the source checkpoint, inside it or contains it, or whose parent is
    not a folder or cannot be created or written. Depends on where OUT is, not on what it holds."""
    out = Path(os.path.abspath(out))
    src = source.resolve()
    real_out = out.resolve()
    if real_out == src or src in real_out.parents or real_out in src.parents:
        raise InputError(f"{out}: the output must not be the source checkpoint, inside it, or contain it ({src})")
    _check_parent(out)


def _check_parent(out: Path) -> None:
    """OUT's parent is a folder this process can write in, or can be created (its nearest existing
    ancestor is a folder it can write in). The staging folder and the lock file go there."""
    probe = out.parent
    while not (probe.exists() or probe.is_symlink()) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        if probe == out.parent:
            raise InputError(f"{out}: its parent {out.parent} is not a folder; choose another -o")
        raise InputError(f"{out}: cannot create its parent folder ({probe} is not a folder); choose another -o")
    if not os.access(probe, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        reason = "Read-only file system" if _read_only(probe) else os.strerror(errno.EACCES)
        raise InputError(
            f"{probe}: {reason}; nothing was written and {out} was not created. "
            "Check free space and permissions, or choose another -o"
        )


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def make_parent(out: Path) -> None:
    """Create OUT's missing parent folders; each new one's entry is fsynced in its own parent, so
    the artifact later renamed into it is reachable after a crash (pipeline/durable.py)."""
    created = [p for p in [out.parent, *out.parent.parents] if not (p.exists() or p.is_symlink())]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for folder in reversed(created):
            sync_folder(folder.parent)
    except OSError as exc:
        raise InputError(
            f"{out}: cannot create its parent folder ({exc.strerror or exc}: {exc.filename}); choose another -o"
        ) from None
    if not out.parent.is_dir():
        raise InputError(f"{out}: its parent {out.parent} is not a folder; choose another -o")


# ---- what is ours ----------------------------------------------------------------------------------
def owned_files(manifest: dict) -> dict[str, dict | None]:
    """The files of an artifact that mxconvert wrote, by relative POSIX path: the manifest, every
    rank file, every shared file and every copied file. The value is the copied file's manifest
    entry (size, sha256), None for the others. These, and the folders that hold them, are all that
    `--force` ever removes."""
    owned: dict[str, dict | None] = {MANIFEST_NAME: None}
    for rank in manifest.get("ranks", []):
        for entry in rank.get("files", []):
            owned[entry["file"]] = None
    for entry in manifest.get("shared", {}).get("files", []):
        owned[entry["file"]] = None
    for entry in manifest.get("aux_files", []):
        owned[entry["file"]] = entry
    for rel in owned:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
            raise InputError(f"{MANIFEST_NAME} lists {rel!r}, which is not a path inside the artifact")
    return owned


def not_ours(folder: Path, owned: dict[str, dict | None]) -> list[str]:
    """Entries under `folder` that are not ours, by relative path (links are not followed).

    A listed path holding a regular file is ours, whatever its bytes (a damaged rank file is still
    mxconvert's), except a copied file whose size or sha256 differs from its manifest entry (it was
    edited: it is the user's now). A listed path holding a link is ours to unlink (its target is
    never touched). A folder is ours when it is on the way to a listed file and holds nothing else.
    Anything else (an unlisted file, a folder at a listed path, a FIFO) is not."""
    folders = {str(PurePosixPath(rel).parent) for rel in owned} - {"."}
    folders |= {str(p) for rel in folders for p in PurePosixPath(rel).parents} - {"."}
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                if rel not in owned:
                    found.append(rel)
            elif path.is_dir():
                if rel not in folders:
                    found.append(rel)
                    if name in dirnames:  # named as a whole: not descended into
                        dirnames.remove(name)
            elif rel not in owned or not path.is_file() or not _copy_intact(path, owned[rel]):
                found.append(rel)
    return sorted(found)


def _copy_intact(path: Path, entry: dict | None) -> bool:
    if entry is None:
        return True
    try:
        return path.stat().st_size == entry.get("size") and sha256_file(path) == entry.get("sha256")
    except OSError:
        return False


def check_replaceable(out: Path, force: bool) -> dict[str, dict | None]:
    """May `convert` put its artifact at OUT? A missing OUT and an empty folder (`mkdir -p $ART` in
    CI) may be written without --force: the empty folder is replaced atomically like a missing OUT.
    Anything else only with --force, and only when it is ours: an mxconvert artifact (its manifest
    parses and its fingerprint checks) holding nothing but the files its manifest lists
    (`owned_files`, `not_ours`). A manifest in a folder of other files is no licence to delete them.
    A refusal says what will work: --force only where --force would then succeed. Returns what may
    be removed (nothing when OUT does not exist or is empty)."""
    if not (out.exists() or out.is_symlink()):
        return {}
    if out.is_symlink() or not out.is_dir():
        kind = "a link, not a folder" if out.is_symlink() else "not a folder"
        raise InputError(
            f"{out} exists and is {kind}; convert writes a folder and never replaces anything else (not even "
            "with --force): choose another -o"
        )
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        raise InputError(f"{out}: cannot list it ({exc.strerror or exc}); refusing to replace it") from None
    if empty:
        return {}
    try:
        manifest = read_manifest(out)
        check_fingerprint(manifest, out)
        owned = owned_files(manifest)
        others = not_ours(out, owned)
    except MxconvertError as exc:
        raise InputError(
            f"{out} is a folder that holds files and is not an intact mxconvert artifact ({exc}); convert "
            "writes only to a new or empty folder, and replaces (with --force) only its own artifacts, so "
            "nothing was touched: choose another -o (a new or empty folder), or empty this one"
        ) from None
    except OSError as exc:
        raise InputError(f"{out}: cannot list it ({exc.strerror or exc}); refusing to replace it") from None
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise InputError(
            f"{out} holds {len(others)} file(s) its manifest does not list ({shown}); --force only removes "
            "the files mxconvert wrote, so nothing was touched: move them out of it or choose another -o"
        )
    if not force:
        raise InputError(f"{out} already exists; pass --force to replace it")
    return owned


def remove_owned(folder: Path, owned: dict[str, dict | None]) -> list[str]:
    """Remove the files of `owned` from `folder`, the manifest last, then the folders left empty.
    What is not ours stays (with the manifest, so that a later run still knows what is ours);
    returns it."""
    with signals_deferred():
        others = not_ours(folder, owned) if folder.is_dir() else []
        for rel in sorted(owned, key=lambda r: r == MANIFEST_NAME):
            if others and rel == MANIFEST_NAME:
                break
            with contextlib.suppress(FileNotFoundError):
                (folder / rel).unlink()
        for dirpath, _dirs, _files in sorted(os.walk(folder), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
    return others


def path_inside(root: Path, rel: str) -> Path:
    """`root / rel` for a file about to be written, proven inside `root` at this moment: `rel` is
    relative without `..`, its folder resolves (links included) to `root` or below, and nothing is
    there yet (a staging folder starts empty: an entry already there is a collision)."""
    pure = PurePosixPath(rel)
    if pure.is_absolute() or not pure.parts or any(p in ("", ".", "..") for p in pure.parts):
        raise InputError(f"{rel!r}: not a path inside the artifact; nothing was written")
    path = root.joinpath(*pure.parts)
    real_root, real_parent = root.resolve(), path.parent.resolve()
    if real_parent != real_root and real_root not in real_parent.parents:
        raise InputError(f"{path}: resolves outside the artifact ({real_parent}); nothing was written")
    if path.exists() or path.is_symlink():
        raise InputError(f"{path}: two files of the artifact would have the same name {rel!r}; nothing was written")
    return path


# ---- the lock ---------------------------------------------------------------------------------------
def lock_path(out: Path) -> Path:
    """The lock file of OUT: `.OUT.mxconvert.lock` beside it (on OUT's filesystem, which holds the
    staging folder too; inside OUT it would be swapped away with the old artifact)."""
    return out.parent / f".{out.name}.mxconvert.lock"


@dataclass
class _Held:
    fd: int
    thread: int
    count: int


_held: dict[str, _Held] = {}
_held_guard = threading.Lock()


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold OUT's lock for the block, or refuse at once (exit 2) when another run holds it.

    An exclusive `flock` on the lock file: the kernel holds it for the open file, across PID
    namespaces (containers on one host), and releases it when the process ends, however it ends.
    Between hosts sharing a volume it holds where the filesystem implements flock across clients
    (NFSv4; NFSv3 with lockd; CephFS; Lustre mounted `flock`), not where locks are local to a host
    (NFS `local_lock=all`/`nolock`, Lustre `localflock`): docs/artifact.md says so. Reentrant within
    a thread (`convert` holds it while `execute` takes it again); another thread of this process
    is refused like another process. The file is removed on release while still locked; a run
    that locked a file since unlinked sees it is not the file at the path and tries again."""
    key = os.path.abspath(lock_path(out))
    with _held_guard:
        held = _held.get(key)
        if held is not None and held.thread == threading.get_ident():
            held.count += 1
            fd = None
        elif held is not None:
            raise InputError(f"{out} is being written by another convert in this process; choose another -o")
        else:
            fd = _acquire(Path(key), out)
            _held[key] = _Held(fd, threading.get_ident(), 1)
    try:
        yield
    finally:
        with _held_guard:
            held = _held[key]
            held.count -= 1
            if held.count == 0:
                del _held[key]
                with signals_deferred():
                    with contextlib.suppress(OSError):
                        os.unlink(key)
                    os.close(held.fd)


def _acquire(path: Path, out: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InputError(
                f"{path}: cannot open OUT's lock file ({exc.strerror or exc}); choose another -o"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise InputError(
                f"{out} is being written by another mxconvert convert ({holder}); wait for it to finish or "
                "choose another -o"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise InputError(f"{path}: cannot lock it ({exc.strerror or exc}); choose another -o") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if not same:  # unlinked by the run that released it meanwhile: lock the file now there
            os.close(fd)
            continue
        holder = f"pid {os.getpid()} on host {socket.gethostname()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
        return fd


def _read_holder(fd: int) -> str:
    """Who holds the lock, as it wrote itself into the file (for the refusal message only)."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace")
    except OSError:
        text = ""
    text = "".join(c for c in text if c.isprintable())
    return text or "holder unknown"


# ---- staging, replace, recovery --------------------------------------------------------------------
def staging_path(out: Path) -> Path:
    """A fresh staging folder's path beside OUT, named by a random id (never by PID: two runs in
    different PID namespaces can have the same one)."""
    return out.parent / f".{out.name}.mxconvert-staging-{secrets.token_hex(8)}"


def _old_path(out: Path) -> Path:
    return out.parent / f".{out.name}.mxconvert-old-{secrets.token_hex(8)}"


def _kept_path(out: Path) -> Path:
    return out.parent / f"{out.name}.mxconvert-kept-{secrets.token_hex(4)}"


_LEFTOVER = re.compile(r"(staging|old)-[0-9A-Za-z]+")


def _leftovers(out: Path) -> list[tuple[Path, str]]:
    """(folder, "staging" | "old") left next to OUT by convert runs that are gone."""
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    prefix = f".{out.name}.mxconvert-"
    found = []
    for path in entries:
        rest = path.name[len(prefix) :] if path.name.startswith(prefix) else ""
        if _LEFTOVER.fullmatch(rest) and path.is_dir() and not path.is_symlink():
            found.append((path, rest.split("-", 1)[0]))
    return found


def recover_interrupted(out: Path) -> list[str]:
    """Clean up after convert runs that were killed, under OUT's lock (it proves they are gone).

    A run killed between moving the old artifact aside and moving the new one in (only where the
    filesystem cannot exchange two folders atomically) leaves OUT missing and the old artifact in
    `.OUT.mxconvert-old-ID`: it is moved back, never deleted. Other leftovers go (`_discard`).
    Returns what was done. Refuses (exit 2) while another run holds the lock."""
    done = []
    with locked(out), signals_deferred():
        for path, kind in _leftovers(out):
            if kind == "old" and not (out.exists() or out.is_symlink()) and (path / MANIFEST_NAME).is_file():
                path.rename(out)
                done.append(f"restored the previous artifact from {path.name}")
        for path, kind in _leftovers(out):
            done.append(_discard(path, out, kind))
    return done


def _discard(path: Path, out: Path, kind: str) -> str:
    """Remove a leftover folder, keeping what is not ours. A staging folder without a readable
    manifest was cut short: everything in it was written by its run. Otherwise (an old artifact,
    a complete staging folder, or the previous OUT a run swapped out) only what the manifest lists
    goes; anything else is kept, in `OUT.mxconvert-kept-ID`."""
    owned: dict[str, dict | None] | None
    try:
        owned = owned_files(read_manifest(path)) if (path / MANIFEST_NAME).exists() else None
    except MxconvertError:
        owned = None
    if owned is None and kind == "old":  # an old artifact was checked ours: it had a manifest, or was empty
        owned = {}
    if owned is None:
        shutil.rmtree(path, ignore_errors=True)
        return f"removed {path.name} left by a killed run"
    if remove_owned(path, owned) and path.exists():
        kept = _kept_path(out)
        path.rename(kept)
        return f"kept {kept.name}: it holds files that are not mxconvert's"
    return f"removed {path.name} left by a killed run"


def cleanup(staging: Path) -> None:
    """Remove the staging folder (all of it is this run's); a second signal must not cut this short."""
    with signals_deferred():
        shutil.rmtree(staging, ignore_errors=True)


def replace(staging: Path, out: Path, force: bool) -> None:
    """Move the complete staging folder to OUT. An existing OUT (checked again: ours) is swapped
    with it in one atomic `renameat2(RENAME_EXCHANGE)` where the filesystem allows, else moved aside
    first and moved back on failure; a kill between the two renames is repaired by
    `recover_interrupted`. Of the previous OUT, only what is ours is removed. Once OUT carries the
    new artifact, OUT's parent folder is fsynced (the rename itself is then on disk; the staging
    folder's contents were synced before: `sync_tree`)."""
    if not (out.exists() or out.is_symlink()):
        fault_point("rename", out)
        staging.rename(out)
        sync_folder(out.parent)
        return
    owned = check_replaceable(out, force)
    fault_point("rename", out)
    if exchange(staging, out):
        sync_folder(out.parent)
        _discard_previous(staging, out, owned)  # the staging path now holds the previous OUT
        return
    old = _old_path(out)
    out.rename(old)
    try:
        fault_point("rename", out)
        staging.rename(out)
    except BaseException:
        old.rename(out)
        raise
    sync_folder(out.parent)
    _discard_previous(old, out, owned)


def _discard_previous(folder: Path, out: Path, owned: dict[str, dict | None]) -> None:
    """The previous OUT, moved aside: what was checked ours goes; anything that appeared in it
    since the check stays, in a folder beside OUT named `OUT.mxconvert-kept-ID`. Never raises: the
    new artifact is in place by now, and what could not be removed is found by the next run."""
    try:
        if remove_owned(folder, owned) and folder.exists():
            folder.rename(_kept_path(out))
    except OSError:
        pass


def _is_empty_folder(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two folders (Linux renameat2 RENAME_EXCHANGE). False where unsupported."""
    if faults_disable("exchange") or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def state(out: Path, previous: bool, replaced: bool) -> str:
    """What OUT holds after a failed or interrupted run (the replace itself is atomic)."""
    if replaced:
        return f"{out} holds the new, complete artifact"
    if previous and _is_empty_folder(out):
        return f"{out} is still the empty folder it was"
    if previous:
        return f"{out} still holds the previous artifact"
    return f"{out} was not created"
