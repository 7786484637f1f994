#!/usr/bin/env python3
"""Releases x rows x record entry counts: the table of docs/releases.md, "Rows by release".

    PYTHONPATH=. .venv/bin/python tools/vllm_releases/rows_table.py

For every vLLM release a row claims (`releases`, mxconvert/target/revisions.py): the row, how many
entries its selection record holds (tests/golden/selection/, every one reproduced by the row:
tests/test_selection_records.py), how many cases its tensor record holds and how many of them the
row writes byte for byte (tests/golden/tensors/, tests/test_tensor_records.py; the rest are cases
of backends in the row's `unproven_layouts`, which convert refuses), and those backends.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import selection_records as sr  # noqa: E402
import tensor_table as tt  # noqa: E402

from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend  # noqa: E402
from mxconvert.target.releases import covered  # noqa: E402

#: A row's `unproven_layouts` names backends of both formats by value; each format's own.
VALUES = {"mxfp4": {m.value for m in Mxfp4Backend}, "nvfp4": {m.value for m in Nvfp4Backend}}

FORMAT_NAMES = {"mxfp4": "GPT-OSS MXFP4", "nvfp4": "NVFP4"}


def _tensor_counts(fmt: str, release: str, unproven: set[str]) -> tuple[int, int]:
    """(recorded cases, cases of backends the row writes) of the release's tensor record."""
    doc = tt.load(tt.TENSORS / f"vllm-{release}-{fmt}.json")
    cases = [c for c in doc["cases"] if "tensors" in c or "raises" in c]
    return len(cases), sum(1 for c in cases if c["backend"] not in unproven)


def table(fmt: str) -> str:
    lines = [
        f"| {FORMAT_NAMES[fmt]} release | row | selection entries | tensor cases (written) | refused (bytes differ) |",
        "|---|---|---|---|---|",
    ]
    for release, row in covered(fmt):
        entries = len(sr.entries(sr.load(sr.RECORDS_DIR / f"vllm-{release}-{fmt}.json")))
        unproven = dict(row.unproven_layouts)
        refused = sorted(b for b in unproven if b in VALUES[fmt])
        cases, written = _tensor_counts(fmt, release, set(refused))
        lines.append(f"| {release} | {row.name} | {entries} | {cases} ({written}) | {', '.join(refused) or '-'} |")
    return "\n".join(lines)


def main() -> int:
    print("\n\n".join(table(fmt) for fmt in sr.FORMATS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
