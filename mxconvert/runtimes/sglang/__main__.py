"""`python -m mxconvert.runtimes.sglang ARGS`: launcher.py."""

from __future__ import annotations

import sys

from mxconvert.runtimes.sglang.launcher import main

if __name__ == "__main__":
    sys.exit(main())
