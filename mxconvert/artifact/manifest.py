"""The artifact manifest (`mxconvert.json`): what was converted, for which target, and the size,
sha256, dtype, shape, view and layout descriptor of everything written, sealed by a fingerprint.

The fingerprint is the sha256 of the canonical JSON of the manifest without `fingerprint` and
without `provenance` (where and when it was made), so two conversions of the same source for the
same target have the same fingerprint wherever they ran.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mxconvert.core.errors import InputError
from mxconvert.storage.files import check_relative, require_regular, resolve_inside

MANIFEST_NAME = "mxconvert.json"
SCHEMA = "mxconvert.artifact/1"
_UNSEALED = ("fingerprint", "provenance")


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def fingerprint(manifest: dict) -> str:
    sealed = {k: v for k, v in manifest.items() if k not in _UNSEALED}
    return "sha256:" + hashlib.sha256(canonical_json(sealed)).hexdigest()


def seal(manifest: dict) -> dict:
    manifest = dict(manifest)
    manifest["fingerprint"] = fingerprint(manifest)
    return manifest


def write_manifest(folder: Path, manifest: dict) -> Path:
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def read_manifest(artifact: Path) -> dict:
    """Read a manifest and check its structure: every field that verify, inspect and the loader
    use has the right type, file entries stay inside the artifact, and each tensor lives in a
    file its rank (or `shared`) lists (so it is checksum-verified). Any problem is an
    `InputError` naming the file and the field."""
    path = artifact / MANIFEST_NAME
    if not artifact.is_dir():
        raise InputError(f"{artifact}: not a directory" + _interrupted_hint(artifact))
    if not (path.exists() or path.is_symlink()):
        raise InputError(f"{artifact}: no {MANIFEST_NAME} (not an mxconvert artifact, or an unfinished one)")
    resolve_inside(artifact, MANIFEST_NAME, str(artifact))
    require_regular(path, MANIFEST_NAME)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise InputError(
            f"{path}: schema is {manifest.get('schema') if isinstance(manifest, dict) else None!r}, expected {SCHEMA!r}"
        )
    for key in ("target", "ranks", "model", "source", "fingerprint"):
        if key not in manifest:
            raise InputError(f"{path}: missing field {key!r}")
    _check_structure(manifest, path)
    return manifest


def _interrupted_hint(artifact: Path) -> str:
    """Where a killed `convert --force` left the previous artifact aside, say so."""
    try:
        left = sorted(p.name for p in artifact.parent.glob(f".{artifact.name}.mxconvert-old-*"))
    except OSError:
        left = []
    if not left:
        return ""
    return (
        f" (an interrupted convert left the previous artifact in {artifact.parent / left[0]}; "
        "running the convert again restores or replaces it)"
    )


def _need(obj: object, key: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(
            f"{where}: field {key!r} is {type(value).__name__}, expected {getattr(kind, '__name__', 'another type')}"
        )
    return value


def _int_list(value: object, field: str, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputError(f"{where}: field {field!r} must be a list of whole numbers")


def _files(entries: object, where: str) -> set[str]:
    if not isinstance(entries, list):
        raise InputError(f"{where}: 'files' must be a list")
    names = set()
    for entry in entries:
        rel = check_relative(_need(entry, "file", str, where), where)
        _need(entry, "size", int, f"{where}: {rel}")
        _need(entry, "sha256", str, f"{where}: {rel}")
        if rel in names:
            raise InputError(f"{where}: file {rel} is listed twice")
        names.add(rel)
    return names


def _check_structure(manifest: dict, path: Path) -> None:
    where = str(path)
    target = _need(manifest, "target", dict, where)
    for key in ("backend", "runtime_revision", "profile"):
        _need(target, key, str, f"{where}: target")
    for key in ("tp_size", "ep_size", "hidden_size_padded", "intermediate_size_padded"):
        _need(target, key, int, f"{where}: target")
    _need(manifest, "model", dict, where)
    _need(manifest, "fingerprint", str, where)
    source = _need(manifest, "source", dict, where)
    if "files" in source:
        _files(source["files"], f"{where}: source")
    ranks = _need(manifest, "ranks", list, where)
    if not ranks:
        raise InputError(f"{where}: 'ranks' is empty")
    seen: set[int] = set()
    for entry in ranks:
        rank = _need(entry, "rank", int, f"{where}: ranks")
        if rank in seen:
            raise InputError(f"{where}: rank {rank} is listed twice")
        seen.add(rank)
        at = f"{where}: rank {rank}"
        plan = _need(entry, "plan", dict, at)
        for key in (
            "rank",
            "tp_size",
            "tp_rank",
            "ep_size",
            "ep_rank",
            "expert_start",
            "expert_end",
            "i_start",
            "i_end",
        ):
            _need(plan, key, int, f"{at} plan")
        files = _files(_need(entry, "files", list, at), at)
        tensors = _need(entry, "tensors", dict, at)
        part_keys: set[str] = set()
        for key, info in tensors.items():
            t_at = f"{at} tensor {key}"
            if isinstance(info, dict) and "parts" in info:
                _check_parts(info, files, tensors, part_keys, t_at)
            elif _need(info, "file", str, t_at) not in files:
                raise InputError(f"{t_at}: its file {info['file']!r} is not among the rank's files")
            _need(info, "layer", int, t_at)
            _need(info, "name", str, t_at)
            layout = _need(info, "layout", dict, t_at)
            _need(layout, "dtype", str, f"{t_at} layout")
            _need(layout, "steps", list, f"{t_at} layout")
            for field in ("buffer_shape", "view_shape", "view_stride"):
                _int_list(_need(layout, field, list, f"{t_at} layout"), field, f"{t_at} layout")
    shared = _need(manifest, "shared", dict, where)
    shared_files = _files(_need(shared, "files", list, f"{where}: shared"), f"{where}: shared")
    for key, info in _need(shared, "tensors", dict, f"{where}: shared").items():
        if isinstance(info, dict) and "parts" in info:
            raise InputError(f"{where}: shared tensor {key}: has 'parts'; pass-through tensors are never split")
        if _need(info, "file", str, f"{where}: shared tensor {key}") not in shared_files:
            raise InputError(f"{where}: shared tensor {key}: its file {info['file']!r} is not among the shared files")
    _files(manifest.get("aux_files", []), f"{where}: aux_files")


def _check_parts(info: dict, files: set[str], tensors: dict, part_keys: set[str], where: str) -> None:
    """A tensor split by --max-shard-size (docs/artifact.md): no `file`, and `parts` that each lie
    in a file of the rank under a key of their own, with a digest, and together cover the rows of
    dim 0 of its buffer in order, each row once."""
    if "file" in info:
        raise InputError(f"{where}: has both 'file' and 'parts'; a tensor is stored whole or in parts")
    shape = _need(info, "shape", list, where)
    _int_list(shape, "shape", where)
    parts = _need(info, "parts", list, where)
    if not parts or not shape:
        raise InputError(f"{where}: 'parts' must list the parts of a tensor of at least one dimension")
    expected_start = 0
    for i, part in enumerate(parts):
        p_at = f"{where} part {i}"
        if _need(part, "file", str, p_at) not in files:
            raise InputError(f"{p_at}: its file {part['file']!r} is not among the rank's files")
        key = _need(part, "key", str, p_at)
        if key in part_keys or key in tensors:
            raise InputError(f"{p_at}: key {key!r} is used twice")
        part_keys.add(key)
        _need(part, "sha256", str, p_at)
        rows = _need(part, "experts", list, p_at)
        _int_list(rows, "experts", p_at)
        if len(rows) != 2 or rows[0] != expected_start or rows[1] <= rows[0]:
            raise InputError(
                f"{p_at}: experts {rows} do not continue the parts before it (expected "
                f"[{expected_start}, stop] with stop > {expected_start})"
            )
        expected_start = rows[1]
    if expected_start != shape[0]:
        raise InputError(f"{where}: its parts cover experts 0..{expected_start - 1}, its buffer has {shape[0]}")


def artifact_file(artifact: Path, rel: str) -> Path:
    """A file of the artifact: inside it (symlinks followed) and a regular file."""
    path = resolve_inside(artifact, rel, str(artifact / MANIFEST_NAME))
    require_regular(path)
    return path


def check_fingerprint(manifest: dict, where: Path) -> None:
    """The recorded fingerprint must match the content: an edited manifest is refused."""
    from mxconvert.core.errors import MismatchError

    actual = fingerprint(manifest)
    if manifest.get("fingerprint") != actual:
        raise MismatchError(
            f"{where / MANIFEST_NAME}: field 'fingerprint' is {manifest.get('fingerprint')} but the "
            f"manifest content hashes to {actual} (the manifest was edited)"
        )
