"""Where the command's output goes: stdout for results (tables, JSON), stderr for errors, warnings
and notes. Both rich consoles are made on their first print (`--version` and `--json` output never
import rich), and both escape control characters in names from files (mxconvert/cli/terminal.py).
"""

from __future__ import annotations

import json
import os

from mxconvert.cli.startup import LazyConsole
from mxconvert.cli.terminal import EscapingHook, Stdout

#: The command's results go through this stdout: a write that fails is an `OutputError`.
STDOUT = Stdout()


def _make_out_console():
    from rich.console import Console

    console = Console(soft_wrap=True, file=STDOUT)
    if not console.is_terminal and not os.environ.get("COLUMNS"):  # piped or in CI: tables do not wrap
        console = Console(soft_wrap=True, width=200, file=STDOUT)
    console.push_render_hook(EscapingHook())  # names from files never drive the terminal
    return console


def _make_err_console():
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    console.push_render_hook(EscapingHook())
    return console


#: rich is imported on the first print (`--version` and `--json` output never import it).
out_console = LazyConsole(_make_out_console)
err_console = LazyConsole(_make_err_console)


def print_json(data: object) -> None:
    """JSON as RFC 8259 has it: a NaN or infinity reaching here is a bug (inputs refuse them)."""
    STDOUT.write(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def warn_line(text: str) -> None:
    """Print a warning about the checkpoint (e.g. NVFP4 gate/up global scales that differ) on stderr."""
    err_console.print(f"[yellow]warning:[/] {text}", highlight=False)
