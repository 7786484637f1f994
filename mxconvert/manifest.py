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

from .errors import InputError

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
    """Read and sanity-check a manifest; any problem is an `InputError` naming the file."""
    path = artifact / MANIFEST_NAME
    if not artifact.is_dir():
        raise InputError(f"{artifact}: not a directory")
    if not path.is_file():
        raise InputError(f"{artifact}: no {MANIFEST_NAME} (not an mxconvert artifact, or an unfinished one)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise InputError(f"{path}: schema is {manifest.get('schema') if isinstance(manifest, dict) else None!r}, "
                         f"expected {SCHEMA!r}")
    for key in ("target", "ranks", "model", "source", "fingerprint"):
        if key not in manifest:
            raise InputError(f"{path}: missing field {key!r}")
    return manifest


def check_fingerprint(manifest: dict, where: Path) -> None:
    """The recorded fingerprint must match the content: an edited manifest is refused."""
    from .errors import MismatchError

    actual = fingerprint(manifest)
    if manifest.get("fingerprint") != actual:
        raise MismatchError(
            f"{where / MANIFEST_NAME}: field 'fingerprint' is {manifest.get('fingerprint')} but the "
            f"manifest content hashes to {actual} (the manifest was edited)"
        )
