"""The rules every file read from a source obeys, written once for the readers, the hub and the
artifact checks:

- paths stay inside: an entry is a relative path without `..`, and what it resolves to (symlinks
  followed) lies inside its folder, or inside the Hugging Face cache folder of the repo the model
  came from (the hub stores snapshot files as links into `blobs/`);
- only regular files are read: a FIFO, device or folder where a file should be is refused before
  anything opens it (opening a FIFO would wait forever);
- a JSON file must hold an object, and any problem names the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from mxconvert.core import jsonio
from mxconvert.core.digest import sha256_stream
from mxconvert.core.errors import InputError


def hub_repo_folder(folder: Path) -> Path | None:
    """The repo folder of the Hugging Face cache (`.../models--org--name`) that `folder` (a
    snapshot, or a folder inside one) belongs to, or None when it is not in such a cache."""
    for parent in [folder, *folder.parents]:
        if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith(("models--", "datasets--")):
            return parent.parent.parent
    return None


def check_relative(rel: object, where: str) -> str:
    """`rel` must be a relative POSIX path that does not climb out (`..`) of its folder."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise InputError(f"{where}: file entry {rel!r} is not a relative path")
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise InputError(f"{where}: file entry {rel!r} leaves its folder (absolute path or '..'); refused")
    return rel


def resolve_inside(root: Path, rel: str, where: str, allowed: tuple[Path, ...] = ()) -> Path:
    """`root / rel`, checked lexically and after following symlinks to stay inside `root` (or one
    of the `allowed` folders, e.g. the hub cache the model came from)."""
    check_relative(rel, where)
    path = root / rel
    real = path.resolve()
    for base in (root, *allowed):
        base_real = base.resolve()
        if real == base_real or base_real in real.parents:
            return path
    raise InputError(f"{path}: resolves to {real}, outside {root}; files that leave the folder are refused")


def require_regular(path: Path, what: str = "file") -> os.stat_result:
    """stat of `path`, which must be a regular file (symlinks followed). Anything else (FIFO,
    socket, device, folder) is refused before it is opened: reading a FIFO would block."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        )
        raise InputError(f"{path}: {what} is {kind}; only regular files are read")
    return st


def read_json(path: Path) -> dict:
    """A JSON object from a regular file; any problem is an InputError naming the file."""
    require_regular(path)
    try:
        data = jsonio.loads(path.read_text())
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def read_folder_json(path: Path) -> dict:
    """A JSON file of a checkpoint folder, which must resolve inside that folder (or the hub
    cache it came from) and be a regular file."""
    repo = hub_repo_folder(path.parent)
    resolve_inside(path.parent, path.name, str(path.parent), (repo,) if repo else ())
    return read_json(path)


def sha256_file(path: Path) -> str:
    """sha256 hex of a regular file (read in 4 MiB blocks into one reused buffer)."""
    require_regular(path)
    try:
        return sha256_stream(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
