#!/usr/bin/env python3
"""Install carried wheels into a target folder, skipping every distribution the machine's Python
already has at an equal or newer version (a carried copy would shadow it for every package that
imports it). Always installs the wheels named after the folder (mxconvert itself).

    python3 install_deps.py DEPS_DIR TARGET [EXTRA_WHEEL...]
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path


def version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.+-]", v)[:4])


def main() -> int:
    deps, target, extra = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    chosen, skipped = [], []
    for wheel in sorted(deps.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is not None and version_key(have) >= version_key(version):
            skipped.append(f"{name} {have} (carried {version})")
        else:
            chosen.append(str(wheel))
    print("install_deps: installing", len(chosen) + len(extra), "wheels; the machine has:", "; ".join(skipped))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(target),
        *chosen,
        *extra,
    ]
    return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
