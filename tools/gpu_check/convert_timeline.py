"""Phase timeline of one `mxconvert convert` (the CLI entry, in this process): imports, the source
digests, the layout plans, the first chunks, each output file's close (its whole-file sha256 done).
The marks wrap functions once the command imports `mxconvert.convert` (bench/CHANGELOG.md, "Session 7").

    python3 tools/gpu_check/convert_timeline.py PKGROOT CHECKPOINT OUT PROFILE [convert options...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timeline import mark, run_cli, when_imported, wrap  # noqa: E402 - after its folder is on the path


def _patch() -> None:
    import mxconvert.layouts.engine.plans as base
    import mxconvert.pipeline.convert as convert
    import mxconvert.storage.safetensors_io as io

    wrap(convert, "_write_staging", "write_staging")
    wrap(base, "prepare_all", "prepare_all")
    wrap(io.StreamingWriter, "close", "writer close")
    real_step, done = convert._run_step, {"n": 0}

    def step(*args, **kwargs):
        out = real_step(*args, **kwargs)
        done["n"] += 1
        if done["n"] in (1, 2, 8):
            mark(f"chunk {done['n']} laid out")
        return out

    convert._run_step = step


def _patch_digests() -> None:
    import mxconvert.core.digest as digest
    import mxconvert.storage.files as source

    wrap(digest, "sha256_stream", "sha256")
    source.sha256_stream = digest.sha256_stream


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    mark("python up")
    _patch_digests()
    when_imported("mxconvert.pipeline.convert", "_write_staging", _patch)
    root, checkpoint, out, profile, *extra = sys.argv[1:]
    run_cli(["convert", checkpoint, "-o", out, "-p", profile, "--force", *extra])
