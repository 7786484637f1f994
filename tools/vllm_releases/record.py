#!/usr/bin/env python3
"""Make the record of one vLLM release (docs/releases.md): what decides MoE selection and weights.

    python tools/vllm_releases/record.py 0.34.0 [--wheel-cache DIR] [--out tools/vllm_releases/records]

Takes the wheel from the cache folder, or downloads it there with `pip download --no-deps`
(nothing else is installed), reads the decision files straight out of the zip and writes
OUT/vllm-VERSION.json. Then `diff.py` against the nearest covered release says what changed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from release_records import build_record, write_record

HERE = Path(__file__).resolve().parent
DEFAULT_CACHE = Path.home() / ".cache" / "mxconvert-wheels"


def find_wheel(version: str, cache: Path) -> Path | None:
    """The cached vLLM wheel of `version` (any build tag / platform), or None."""
    pattern = re.compile(rf"vllm-{re.escape(version)}(-\d+)?-[^-]+-[^-]+-[^-]+\.whl")
    hits = sorted(p for p in cache.glob(f"vllm-{version}-*.whl") if pattern.fullmatch(p.name))
    if len(hits) > 1:
        raise SystemExit(f"{cache}: more than one wheel for vllm {version}: {[p.name for p in hits]}")
    return hits[0] if hits else None


def fetch_wheel(version: str, cache: Path) -> Path:
    wheel = find_wheel(version, cache)
    if wheel is not None:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"vllm=={version}",
        "-d",
        str(cache),
    ]
    print("+", " ".join(cmd), file=sys.stderr)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise SystemExit(f"pip download of vllm=={version} failed (is that release on the package index?)")
    wheel = find_wheel(version, cache)
    if wheel is None:
        raise SystemExit(f"pip download finished but no vllm-{version} wheel is in {cache}")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="vLLM release(s), e.g. 0.26.0")
    parser.add_argument("--wheel-cache", type=Path, default=DEFAULT_CACHE, help=f"default: {DEFAULT_CACHE}")
    parser.add_argument("--out", type=Path, default=HERE / "records", help="default: tools/vllm_releases/records")
    args = parser.parse_args(argv)
    for version in args.versions:
        if not re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", version):
            raise SystemExit(f"{version!r}: expected a release number like 0.26.0")
        wheel = fetch_wheel(version, args.wheel_cache)
        path = write_record(build_record(version, wheel), args.out)
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
