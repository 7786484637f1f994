"""Is OUT already this conversion? (`convert` run twice in CI exits 0 without rewriting.)

OUT is up to date when it is a sealed artifact whose manifest (of the schema `convert` writes)
says it was made by this mxconvert version, with the same digests asked for (`--file-sha256`),
from the same source (identity, layout and every source file's size and sha256) for the same
target (every target field, the selection, the ranks and the file plan), and every file it
lists is a regular file inside OUT (no link on the way) with its recorded size and digests (all
files hashed at once, on the cores available: far cheaper than writing them again). Anything
else (a different target, a changed source, a missing, resized, damaged or linked file, an
edited manifest) is not up to date, and `convert` proceeds as for any existing OUT (refused
without --force; with it, replaced when it is ours: pipeline/output.py).
"""

from __future__ import annotations

import json
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from mxconvert.artifact.manifest import SCHEMA, fingerprint, read_manifest
from mxconvert.core.digest import CHUNKED_KEY, MAX_PARALLEL_PIECE, WHOLE_KEY, file_digests, sha256_stream
from mxconvert.core.errors import MxconvertError
from mxconvert.core.parallel import default_jobs
from mxconvert.core.version import __version__


def _json_equal(a, b) -> bool:
    """Equal as JSON (tuples and lists alike), as the manifest stores them."""
    return json.loads(json.dumps(a, sort_keys=True)) == json.loads(json.dumps(b, sort_keys=True))


def up_to_date(out: Path, plan, jobs: int | None = None, file_sha256: bool = False) -> dict | None:
    """The manifest of OUT when OUT already holds exactly what `plan` would write (with the
    whole-file sha256 of every written file where `file_sha256`, without it otherwise), else None."""
    if Path(out).is_symlink():  # convert never writes through a link: neither is one up to date
        return None
    try:  # read_manifest: a regular file, well-formed, file entries inside OUT (a FIFO never blocks)
        manifest = read_manifest(Path(out))
    except MxconvertError:
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint(manifest):
        return None
    try:
        if manifest["schema"] != SCHEMA or manifest["producer"]["version"] != __version__:
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
        if any((WHOLE_KEY in f) != file_sha256 for f in written):
            return None
        if [r["rank"] for r in manifest["ranks"]] != [rp.rank for rp in plan.ranks]:
            return None
        files = written + manifest.get("aux_files", [])
        for entry in files:
            file = _regular_inside(Path(out), entry["file"])
            if file is None or file.stat().st_size != entry["size"]:
                return None
        # as it may read the source: the same bytes (hub sources: the hub's hashes)
        if not _json_equal(source["files"], plan.ckpt.describe_files()):
            return None
        # last, the most reading: every file's bytes are those recorded
        if not _digests_match(Path(out), files, jobs or default_jobs()):
            return None
    except (KeyError, TypeError, ValueError, OSError):
        return None
    return manifest


def _regular_inside(out: Path, rel: str) -> Path | None:
    """OUT/rel when every folder on the way is a real folder (not a link) and rel is a regular file."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        return None
    path = out
    for i, part in enumerate(parts):
        path = path / part
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) if i == len(parts) - 1 else stat.S_ISDIR(mode)):
            return None
    return path


def _digests_match(out: Path, files: list[dict], jobs: int) -> bool:
    """Every file's digests recorded in the manifest (tree digest, whole-file sha256) are those of
    its bytes: files hashed in parallel, the leaves of the tree digests on `jobs` threads of their own."""

    def matches(entry: dict) -> bool:
        path = out / entry["file"]
        chunked = entry.get(CHUNKED_KEY)
        if chunked is None:
            return sha256_stream(path) == entry[WHOLE_KEY]
        size = chunked.get("chunk_bytes")
        if type(size) is not int or not 64 << 10 <= size <= MAX_PARALLEL_PIECE:  # hashes nothing, or too much
            return False
        whole, got = file_digests(path, size, leaves, whole=WHOLE_KEY in entry)
        return whole == entry.get(WHOLE_KEY) and got == chunked

    if not files:
        return True
    with (
        ThreadPoolExecutor(max(1, min(jobs, len(files))), thread_name_prefix="mxconvert-uptodate") as pool,
        ThreadPoolExecutor(max(1, jobs), thread_name_prefix="mxconvert-leaf") as leaves,
    ):
        return all(pool.map(matches, files))
