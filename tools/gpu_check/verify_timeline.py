"""Phase timeline of one `mxconvert verify` (the CLI entry, in this process): the artifact's and the
source's digests, the layout plans, the chunk checks, the dequantized samples and the pass-through
tensors (bench/CHANGELOG.md, "Session 7").

    python3 tools/gpu_check/verify_timeline.py PKGROOT ARTIFACT [verify options...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timeline import mark, run_cli, when_imported, wrap  # noqa: E402 - after its folder is on the path


def _patch() -> None:
    import mxconvert.pipeline.verify as verify

    for name, label in (
        ("file_digests", "file_digests"),
        ("sha256_file", "sha256_file"),
        ("prepare_all", "prepare_all"),
        ("_dequant_check", "dequant"),
        ("_check_completeness", "completeness"),
    ):
        wrap(verify, name, label)
    wrap(verify, "_check_chunk", "first check_chunk", first_only=True)
    wrap(verify, "_check_passthrough", "first passthrough", first_only=True)
    real_map = verify.ordered_map

    def ordered(*args, **kwargs):
        mark("ordered_map start")
        yield from real_map(*args, **kwargs)
        mark("ordered_map end")

    verify.ordered_map = ordered


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    mark("python up")
    when_imported("mxconvert.pipeline.verify", "verify_artifact", _patch)
    run_cli(["verify", *sys.argv[2:]])
