"""The command's entry point: signal handling starts before any heavy import (torch, typer), so
a signal at any moment, start-up included, ends with exit 128 + N and one line, never a
traceback (README "Exit codes")."""

from __future__ import annotations

import os
import sys

#: numpy's OpenBLAS starts one thread per core when numpy is imported, and each spins ~0.1 s for
#: work before it sleeps. No command runs BLAS (the host layouts are gathers, copies and bit
#: operations), so on the GPU machine's 16-core host that was 1.2-1.5 CPU-seconds of every
#: command (`import numpy` alone: 1.2-1.5 s user against 0.10-0.13 with one thread;
#: bench/README.md, "Start-up"). A value the user set is kept. Set for the command line only:
#: a program using the library keeps its own BLAS threads.
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}


def main() -> None:
    for name, value in BLAS_THREADS.items():
        os.environ.setdefault(name, value)  # before anything imports numpy
    from mxconvert.core.errors import Interrupted, ignore_signals, install_signal_handlers, reported

    try:
        try:
            install_signal_handlers(unblock=True)
            from mxconvert.cli.main import main as cli_main

            cli_main()
        finally:
            ignore_signals()
    except Interrupted as exc:
        reported(exc)
        from mxconvert.cli.terminal import escaped

        sys.stderr.write(escaped(exc.message()) + "\n")  # OUT's name is the user's: shown inert
        sys.exit(exc.exit_code)
