#!/usr/bin/env python3
"""The committed selection records against mxconvert's rows, as the table docs/releases.md shows.

    python tools/vllm_releases/selection_table.py            # markdown table
    python tools/vllm_releases/selection_table.py --diff 0.22.0 vllm-0.26 [--format mxfp4]
    python tools/vllm_releases/selection_table.py --nearest 0.34.0 [--format nvfp4]

For every record (tests/golden/selection/vllm-X.Y.Z-FORMAT.json): its entry count, the row that
covers the release (`--runtime vllm==X.Y.Z`, if any), and the rows (and selection styles no row
uses yet, on a copy of a row: selection_records.UNUSED_STYLES, shown `row+style`) whose selection
reproduces every entry. `--matrix`: every record against every row and style, `=` or the number
of differences. `--diff RELEASE ROW` prints what differs between one record and one of those.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import selection_records as sr  # noqa: E402

from mxconvert.target.releases import row_for_release  # noqa: E402


def table() -> str:
    """Per format: release | entries | the row covering it | the rows and styles that reproduce it."""
    lines = []
    for fmt in sr.FORMATS:
        files = [p for p in sr.record_files() if p.stem.endswith(fmt)]
        if not files:
            continue
        lines += [
            f"| {fmt} release | entries | covered by (`vllm==X.Y.Z`) | selection reproduced by |",
            "|---|---|---|---|",
        ]
        for path in files:
            record = sr.load(path)
            covering = row_for_release(record["vllm"], fmt)
            hits = [label for label, row in sr.mirrors(fmt).items() if sr.reproduces(row, record)]
            lines.append(
                f"| {record['vllm']} | {len(sr.entries(record))} | {covering.name if covering else '-'} | "
                + (", ".join(f"`{h}`" for h in hits) or "**none**")
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def matrix() -> str:
    """Per format: release x every row and style, `=` or the number of entries that differ."""
    lines = []
    for fmt in sr.FORMATS:
        rows = sr.mirrors(fmt)
        files = [p for p in sr.record_files() if p.stem.endswith(fmt)]
        if not files:
            continue
        lines += [f"| {fmt} release | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
        for path in files:
            record = sr.load(path)
            cells = [
                "**=**" if sr.reproduces(row, record) else str(sum(1 for _ in sr.differences(row, record)))
                for row in rows.values()
            ]
            lines.append(f"| {record['vllm']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--diff", nargs=2, metavar=("RELEASE", "ROW"))
    parser.add_argument("--nearest", metavar="RELEASE", help="the column closest to RELEASE's record, and what differs")
    parser.add_argument("--format", default="mxfp4", choices=sr.FORMATS)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--matrix", action="store_true", help="every record against every row and style")
    args = parser.parse_args(argv)
    if args.nearest:
        record = sr.load(sr.RECORDS_DIR / f"vllm-{args.nearest}-{args.format}.json")
        counts = {label: sum(1 for _ in sr.differences(row, record)) for label, row in sr.mirrors(args.format).items()}
        best = min(counts, key=lambda label: counts[label])
        print(f"vLLM {args.nearest} ({args.format}): nearest {best}, {counts[best]} differences")
        print("\n".join(sr.differences(sr.mirrors(args.format)[best], record, limit=args.limit)))
        return 1 if counts[best] else 0
    if args.diff:
        release, row = args.diff
        record = sr.load(sr.RECORDS_DIR / f"vllm-{release}-{args.format}.json")
        diffs = list(sr.differences(sr.mirrors(args.format)[row], record, limit=args.limit))
        print("\n".join(diffs) or f"{row} reproduces vLLM {release} ({args.format})")
        return 1 if diffs else 0
    print(matrix() if args.matrix else table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
