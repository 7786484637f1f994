#!/usr/bin/env python3
"""What differs between two vLLM release records (docs/releases.md, "Reading a diff").

    python tools/vllm_releases/diff.py 0.33.0 0.34.0          # records/vllm-0.33.0.json vs ...0.34.0.json
    python tools/vllm_releases/diff.py path/a.json path/b.json
    python tools/vllm_releases/diff.py --nearest 0.34.0        # against the nearest older committed record

Per format: `~` a decision symbol's code changed, `+` / `-` it appeared / disappeared,
`moved` it only changed file; then the pins and the vendored triton_kernels, and whether the two
releases can share a revision row. Exit status 0 when both formats can share a row, 1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from release_records import FORMATS, Record, diff_records, group_key, load_record, version_key

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"


def resolve(arg: str, records: Path) -> Path:
    path = Path(arg)
    if path.suffix == ".json":
        return path
    path = records / f"vllm-{arg}.json"
    if not path.is_file():
        raise SystemExit(f"no record {path}: run tools/vllm_releases/record.py {arg} first")
    return path


def nearest(release: str, records: Path) -> str:
    """The newest committed release older than `release` (else the oldest newer one)."""
    known = sorted((p.stem.removeprefix("vllm-") for p in records.glob("vllm-*.json")), key=version_key)
    known = [k for k in known if k != release]
    if not known:
        raise SystemExit(f"no records in {records}")
    older = [k for k in known if version_key(k) < version_key(release)]
    return older[-1] if older else known[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="release number or record path (with --nearest: the new release)")
    parser.add_argument("b", nargs="?", help="release number or record path")
    parser.add_argument("--nearest", action="store_true", help="compare A with the nearest older committed record")
    parser.add_argument("--records", type=Path, default=RECORDS, help="default: tools/vllm_releases/records")
    args = parser.parse_args(argv)
    if args.nearest == (args.b is not None):
        parser.error("give two releases, or one with --nearest")
    if args.nearest:
        new = resolve(args.a, args.records)
        rec_b: Record = load_record(new)
        rec_a = load_record(resolve(nearest(rec_b["release"], args.records), args.records))
    else:
        rec_a, rec_b = load_record(resolve(args.a, args.records)), load_record(resolve(args.b, args.records))
    print("\n".join(diff_records(rec_a, rec_b)))
    return 0 if all(group_key(rec_a, f) == group_key(rec_b, f) for f in FORMATS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
