"""`mxconvert -h` and `mxconvert CMD -h` fit an 80-column terminal without cutting text (issue 23
item 5): no line is wider than 80 characters, nothing ends in an ellipsis, and every option's help,
every argument's help and every command's summary is there whole (only re-wrapped)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import typer.main
from helpers import ROOT

from mxconvert.cli.main import app

GROUP = typer.main.get_command(app)
COMMANDS = list(GROUP.commands)  # type: ignore[attr-defined]


def _help_at_80_columns(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "LINES")} | {"COLUMNS": "80"}
    proc = subprocess.run(
        [sys.executable, "-m", "mxconvert", *args, "-h"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _squashed(text: str) -> str:
    """`text` without whitespace: a help text wrapped over lines (at spaces, after hyphens, or in
    the middle of a long word) is still found whole in the help output."""
    return "".join(text.split())


def _assert_fits(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"
        assert "…" not in line, f"cut: {line!r}"


def test_the_command_list_fits_80_columns_and_shows_each_summary_whole():
    text = _help_at_80_columns()
    _assert_fits(text)
    for name in COMMANDS:
        summary = inspect.cleandoc(GROUP.commands[name].short_help or "")  # type: ignore[attr-defined]
        assert summary and _squashed(summary) in _squashed(text), f"{name}'s summary is cut"


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_fits_80_columns_without_cutting_option_text(command):
    text = _help_at_80_columns(command)
    _assert_fits(text)
    squashed = _squashed(text)
    params = GROUP.commands[command].params  # type: ignore[attr-defined]
    for param in params:
        for flag in param.opts:
            assert flag in text, f"{command} -h does not show {flag}"
        helptext = getattr(param, "help", None)
        if helptext:
            assert _squashed(helptext) in squashed, f"{command} -h cuts the help of {param.opts[0]}"
    assert any(getattr(p, "help", None) for p in params)  # the checks above ran on something
