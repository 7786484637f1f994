#!/usr/bin/env python3
"""Group the committed vLLM release records into would-be revision rows (docs/releases.md).

    python tools/vllm_releases/table.py                 # the Markdown table for docs/releases.md
    python tools/vllm_releases/table.py --write-groups  # (re)write tools/vllm_releases/groups.json
    python tools/vllm_releases/table.py --check         # exit 1 when groups.json is stale

Two releases fall in one group for a format when their per-format digests and the pins that matter
for that format (decision_symbols.GROUP_KEYS) agree. A group is named by its first release.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from decision_symbols import GROUP_KEYS
from release_records import FORMATS, Record, group_key, groups, load_record, version_key

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
GROUPS_FILE = HERE / "groups.json"


def load_all(records: Path) -> list[Record]:
    loaded = [load_record(p) for p in records.glob("vllm-*.json")]
    return sorted(loaded, key=lambda r: version_key(r["release"]))


def groups_document(records: list[Record]) -> dict[str, Any]:
    """The content of groups.json: per format, the groups of releases and what keys them."""
    return {
        "about": "Releases whose per-format decision-symbol digest and GROUP_KEYS pins agree "
        "(made by tools/vllm_releases/table.py --write-groups from records/; see docs/releases.md)",
        "keys": {fmt: ["format digest", *GROUP_KEYS[fmt]] for fmt in FORMATS},
        "groups": {fmt: groups(records, fmt) for fmt in FORMATS},
    }


def _why_new(prev: Record, cur: Record, fmt: str) -> str:
    """Why `cur` starts a new group after `prev`: which parts of the group key differ."""
    reasons = []
    if prev["formats"][fmt]["sha256"] != cur["formats"][fmt]["sha256"]:
        reasons.append("code")
    names = ["format digest", *GROUP_KEYS[fmt]]
    for name, a, b in zip(names[1:], group_key(prev, fmt)[1:], group_key(cur, fmt)[1:], strict=True):
        if a != b:
            label = name.split(":", 1)[1]
            if name.startswith("triton_kernels:"):
                label = "triton_kernels"
            if label not in reasons:
                reasons.append(label)
    return ", ".join(reasons)


def markdown(records: list[Record]) -> str:
    """One row per release: pins, triton_kernels generation, and per format its group (the group's
    first release) with, where a new group starts, what differs from the release before."""
    first_of: dict[str, dict[str, str]] = {
        fmt: {rel: group[0] for group in groups(records, fmt) for rel in group} for fmt in FORMATS
    }
    head = "| release | torch | flashinfer-python | triton_kernels | " + " | ".join(
        f"{fmt} group (new: what differs)" for fmt in FORMATS
    )
    lines = [head + " |", "|" + "---|" * (4 + len(FORMATS))]
    prev: Record | None = None
    for rec in records:
        cells = [
            rec["release"],
            str(rec["pins"]["torch"]).removeprefix("=="),
            str(rec["pins"]["flashinfer-python"]).removeprefix("=="),
            str(rec["triton_kernels"]["generation"]),
        ]
        for fmt in FORMATS:
            group = first_of[fmt][rec["release"]]
            if group == rec["release"] and prev is not None:
                cells.append(f"**{group}** ({_why_new(prev, rec, fmt)})")
            elif group == rec["release"]:
                cells.append(f"**{group}**")
            else:
                cells.append(f"{group} (same)")
        lines.append("| " + " | ".join(cells) + " |")
        prev = rec
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--groups", type=Path, default=GROUPS_FILE)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write-groups", action="store_true", help="write groups.json from the records")
    action.add_argument("--check", action="store_true", help="exit 1 if groups.json differs from the records")
    args = parser.parse_args(argv)
    records = load_all(args.records)
    if not records:
        raise SystemExit(f"no records in {args.records}")
    document = groups_document(records)
    text = json.dumps(document, indent=1) + "\n"
    if args.write_groups:
        args.groups.write_text(text)
        print(args.groups)
        return 0
    if args.check:
        stale = not args.groups.is_file() or json.loads(args.groups.read_text()) != document
        print(f"{args.groups}: {'stale, run table.py --write-groups' if stale else 'up to date'}")
        return 1 if stale else 0
    print(markdown(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
