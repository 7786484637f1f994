"""Is OUT already this conversion? (`convert` run twice in CI exits 0 without rewriting.)

OUT is up to date when it is a sealed artifact whose manifest says it was made by this mxconvert
version from the same source (identity, layout and every source file's size and sha256) for the
same target (every target field, the selection, the ranks and the file plan), and every file it
lists is there with its recorded size. Anything else (a different target, a changed source, a
missing or resized file, an edited manifest) is not up to date, and `convert` proceeds as before
(refusing an existing OUT without --force).
"""

from __future__ import annotations

import json
from pathlib import Path

from mxconvert.artifact.manifest import fingerprint, read_manifest
from mxconvert.core.errors import MxconvertError
from mxconvert.core.version import __version__


def _json_equal(a, b) -> bool:
    """Equal as JSON (tuples and lists alike), as the manifest stores them."""
    return json.loads(json.dumps(a, sort_keys=True)) == json.loads(json.dumps(b, sort_keys=True))


def up_to_date(out: Path, plan) -> dict | None:
    """The manifest of OUT when OUT already holds exactly what `plan` would write, else None."""
    try:  # read_manifest: a regular file, well-formed, file entries inside OUT (a FIFO never blocks)
        manifest = read_manifest(Path(out))
    except MxconvertError:
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint(manifest):
        return None
    try:
        if manifest["producer"]["version"] != __version__:
            return None
        if not _json_equal(manifest["target"], plan.target()):
            return None
        if not _json_equal(manifest["selection"], plan.selection.to_json()):
            return None
        source = manifest["source"]
        ident = plan.ckpt.identity
        recorded_ident = {
            "kind": ident.kind,
            **({"repo_id": ident.repo_id, "revision": ident.revision} if ident.kind == "hub" else {}),
        }
        if source["identity"] != recorded_ident or source["layout"] != plan.ckpt.layout:
            return None
        summary = plan.summary()
        planned_files = {(f["file"]) for r in summary["ranks"] for f in r["files"]} | {
            f["file"] for f in summary["shared_files"]
        }
        written = [f for r in manifest["ranks"] for f in r["files"]] + manifest["shared"]["files"]
        if {f["file"] for f in written} != planned_files:
            return None
        if [r["rank"] for r in manifest["ranks"]] != [rp.rank for rp in plan.ranks]:
            return None
        for entry in written + manifest.get("aux_files", []):
            file = Path(out) / entry["file"]
            if not file.is_file() or file.stat().st_size != entry["size"]:
                return None
        # last, as it may read the source: the same bytes (hub sources: the hub's hashes)
        if not _json_equal(source["files"], plan.ckpt.describe_files()):
            return None
    except (KeyError, TypeError):
        return None
    return manifest
