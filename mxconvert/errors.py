"""Errors that carry an exit code, so the CLI never shows a traceback for bad input.

Exit codes are part of the CLI contract that CI pipelines rely on:
0 success, 1 a mismatch was found (verify / diff), 2 unusable input or refused request.
"""
from __future__ import annotations


class MxconvertError(Exception):
    """Base class: a user-facing error with a specific message and exit code."""

    exit_code: int = 2


class InputError(MxconvertError):
    """The input (checkpoint, artifact, profile, option) is not what it claims or is unusable."""

    exit_code = 2


class UnsupportedError(MxconvertError):
    """A request the target cannot run (e.g. an explicit backend the profile does not support)."""

    exit_code = 2


class MismatchError(MxconvertError):
    """A check found a difference: an artifact does not match its source or expectation."""

    exit_code = 1
