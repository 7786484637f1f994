"""The command's entry point: signal handling starts before any heavy import (torch, typer), so
a signal at any moment, start-up included, ends with exit 128 + N and one line, never a
traceback (README "Exit codes")."""

from __future__ import annotations

import sys


def main() -> None:
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
