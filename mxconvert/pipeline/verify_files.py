"""`verify`'s file checks: the size and digests of every file the manifest lists (inside the
artifact, regular files only; the tree digest and the whole-file sha256, each where recorded),
and the source checkpoint to compare with (the one given, else the one the manifest records)
and its files' hashes against those recorded at conversion."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from mxconvert.artifact.manifest import artifact_file
from mxconvert.core.digest import CHUNKED_KEY, WHOLE_KEY
from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.formats.registry import open_model
from mxconvert.pipeline.verify_report import Problem, VerifyReport


def check_files(root: Path, entries: list[dict], report: VerifyReport, hashes: dict, progress=None):
    """Size and digests of each file (each digest the manifest records). Returns the files that
    are unreadable as safetensors (known at once) and the checksum comparisons as a deferred
    check: `hashes` maps each path to the future of its digests (computed in parallel, see
    `_hash_all`), and waiting for them here would keep the workers idle while one thread hashes
    a multi-GB file; `_verify` runs the deferred check after the tensor checks and puts its
    problems where they would have been."""
    broken = set()
    to_compare = []
    for entry in entries:
        report.files_checked += 1
        if progress is not None:
            progress.advance(int(entry.get("size") or 0), "checksums")
        path = root / entry["file"]
        if not (path.exists() or path.is_symlink()):
            report.problems.append(Problem("file", f"{entry['file']}: missing", entry["file"]))
            broken.add(entry["file"])
            continue
        try:
            path = artifact_file(root, entry["file"])
        except MxconvertError as exc:
            report.problems.append(Problem("file", str(exc), entry["file"]))
            broken.add(entry["file"])
            continue
        to_compare.append((entry, path, path.stat().st_size))

    def compare() -> list[Problem]:
        problems = []
        for entry, path, size in to_compare:
            if size != entry["size"]:
                problems.append(
                    Problem("file", f"{entry['file']}: size {size} bytes, manifest says {entry['size']}", entry["file"])
                )
            elif WHOLE_KEY in entry and hashes[path].result()[0] != entry[WHOLE_KEY]:
                problems.append(Problem("file", f"{entry['file']}: sha256 differs from the manifest", entry["file"]))
            elif CHUNKED_KEY in entry and hashes[path].result()[1] != entry[CHUNKED_KEY]:
                problems.append(
                    Problem(
                        "file",
                        f"{entry['file']}: chunked sha256 differs from the manifest (load_artifact would refuse it)",
                        entry["file"],
                    )
                )
        return problems

    return broken, compare


def tree_only(root: Path, files: list[dict]) -> set[Path]:
    """The files whose manifest entry has a tree digest and no whole-file sha256 (the default of a
    schema /2 convert): verify hashes their leaves in parallel and never streams the whole file."""
    return {root / f["file"] for f in files if isinstance(f.get(CHUNKED_KEY), dict) and WHOLE_KEY not in f}


def files_inside(root: Path, files: list[dict]) -> list[Path]:
    """The manifest's files that `check_files` will accept (inside the artifact, regular): only
    those are read for their checksums. An edited manifest naming a file outside the folder is
    reported by `check_files` and never read."""
    paths = []
    for entry in files:
        try:
            paths.append(artifact_file(root, entry["file"]))
        except (MxconvertError, KeyError, TypeError):
            continue
    return paths


def source_hash_check(hashed: Future, recorded: dict, differs: Problem) -> Callable[[], list[Problem]]:
    """The deferred comparison of one source file's sha256 (hashing overlaps the tensor checks)."""
    return lambda: [differs] if hashed.result()[0] != recorded["sha256"] else []


def open_source(manifest: dict, source: str | None, *, revision: str | None = None, cache_dir: str | None = None):
    """The source checkpoint to compare with: `source` (folder or hub repo id), else the one the
    manifest records. A hub source defaults to the commit recorded in the manifest (a hub id given
    as `source` too, when it is the recorded repo), so an artifact made from `--revision v2` is
    checked against v2, not against today's `main`.

    `provenance.source_path` is outside the fingerprint: it is only where to look, never trusted.
    What is found there is compared with the sealed source file hashes like any `--source`, and
    a path that is not printable text is refused rather than shown."""
    layout = manifest["source"].get("layout")
    ident = manifest["source"].get("identity") or {}
    if not isinstance(ident, dict):
        raise InputError("the manifest's source identity is malformed; pass --source")
    recorded_commit = ident.get("revision") if ident.get("kind") == "hub" else None
    if source is None:
        provenance = manifest.get("provenance") or {}
        source = provenance.get("source_path") if isinstance(provenance, dict) else None
        if not isinstance(source, (str, type(None))) or (source is not None and not source.isprintable()):
            raise InputError("the manifest's provenance is malformed; pass --source")
        if ident.get("kind") == "hub" and not (source and Path(source).is_dir() and revision is None):
            return open_model(
                ident["repo_id"], revision=revision or recorded_commit, cache_dir=cache_dir, layout=layout
            )
        if not source or not Path(source).is_dir():
            raise InputError(
                f"the source checkpoint recorded in the manifest ({source}) is not available; pass --source"
            )
        return open_model(source, layout=layout)
    if Path(source).expanduser().exists():
        if revision is not None:
            raise InputError(f"--revision {revision}: --source {source} is a local folder, which has no revisions")
        return open_model(source, layout=layout)
    if revision is None and ident.get("repo_id") == source:
        revision = recorded_commit
    return open_model(source, revision=revision, cache_dir=cache_dir, layout=layout)
