"""The artifact manifest (`mxconvert.json`): what was converted, for which target, and the size,
sha256, dtype, shape, view and layout descriptor of everything written, sealed by a fingerprint.

The fingerprint is the sha256 of the canonical JSON of the manifest without `fingerprint` and
without `provenance` (where and when it was made), so two conversions of the same source for the
same target have the same fingerprint wherever they ran.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from mxconvert.artifact.manifest_schema import READABLE_SCHEMAS, check_manifest, shown
from mxconvert.artifact.manifest_schema import SCHEMA as SCHEMA  # what convert writes (re-exported)
from mxconvert.artifact.manifest_schema import SCHEMA_V1 as SCHEMA_V1
from mxconvert.core import jsonio
from mxconvert.core.errors import InputError
from mxconvert.storage.files import require_regular, resolve_inside

MANIFEST_NAME = "mxconvert.json"
_UNSEALED = ("fingerprint", "provenance")
#: The format of a target that names none: manifests written before NVFP4 support are GPT-OSS
#: MXFP4 (docs/artifact.md, "target").
UNNAMED_TARGET_FORMAT = "mxfp4"


def target_format(target: dict) -> str:
    """The checkpoint format (a `mxconvert.formats.registry` name) a target was converted from."""
    return str(target.get("format", UNNAMED_TARGET_FORMAT))


def canonical_json(data: object) -> bytes:
    """The bytes the fingerprint hashes: RFC 8259 JSON (no NaN or Infinity), sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def require_finite(data: object, where: str, at: str = "") -> None:
    """Refuse NaN and infinities anywhere in `data`: JSON (RFC 8259) has no token for them, so a
    manifest holding one (a profile's or a config's `inf`) would not be JSON other tools read."""
    if isinstance(data, float) and not math.isfinite(data):
        raise InputError(
            f"{where}: field {at or '(top)'} is {data}; mxconvert.json is RFC 8259 JSON, which has no NaN or "
            "Infinity (check the profile and the checkpoint's config for a non-finite number)"
        )
    if isinstance(data, dict):
        for key, value in data.items():
            require_finite(value, where, f"{at}.{key}" if at else str(key))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            require_finite(value, where, f"{at}[{i}]")


def fingerprint(manifest: dict) -> str:
    sealed = {k: v for k, v in manifest.items() if k not in _UNSEALED}
    return "sha256:" + hashlib.sha256(canonical_json(sealed)).hexdigest()


def seal(manifest: dict) -> dict:
    """The manifest with its `fingerprint`; a non-finite number anywhere is an `InputError`."""
    require_finite(manifest, MANIFEST_NAME)
    manifest = dict(manifest)
    manifest["fingerprint"] = fingerprint(manifest)
    return manifest


def write_manifest(folder: Path, manifest: dict) -> Path:
    require_finite(manifest, MANIFEST_NAME)
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return path


def read_manifest(artifact: Path) -> dict:
    """Read a manifest and check it against its strict schema (artifact/manifest_schema.py): every
    field that verify, inspect, the loader and the plugin use has the right type and agrees with
    what the others imply, file entries stay inside the artifact, and each tensor lives in a file
    its rank (or `shared`) lists (so it is checksum-verified). Any problem is an `InputError`
    naming the file and the field; the file must be RFC 8259 JSON (no bare NaN or Infinity)."""
    path = artifact / MANIFEST_NAME
    if not artifact.is_dir():
        raise InputError(f"{artifact}: not a directory" + _interrupted_hint(artifact))
    if not (path.exists() or path.is_symlink()):
        raise InputError(f"{artifact}: no {MANIFEST_NAME} (not an mxconvert artifact, or an unfinished one)")
    resolve_inside(artifact, MANIFEST_NAME, str(artifact))
    require_regular(path, MANIFEST_NAME)
    try:
        manifest = jsonio.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") not in READABLE_SCHEMAS:
        raise InputError(
            f"{path}: schema is {shown(repr(manifest.get('schema') if isinstance(manifest, dict) else None))}, "
            f"expected {SCHEMA!r} (or {SCHEMA_V1!r}, still read)"
        )
    for key in ("target", "ranks", "model", "source", "fingerprint"):
        if key not in manifest:
            raise InputError(f"{path}: missing field {key!r}")
    check_manifest(manifest, str(path))
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
            f"{where / MANIFEST_NAME}: field 'fingerprint' is {shown(manifest.get('fingerprint'))} but the "
            f"manifest content hashes to {actual} (the manifest was edited)"
        )
