"""Errors that carry an exit code, so the CLI never shows a traceback for bad input.

Exit codes are part of the CLI contract that CI pipelines rely on (README "Exit codes"):
0 success, 1 a mismatch was found (verify / diff), 2 unusable input or refused request,
3 an internal error (a bug in mxconvert), 128 + N ended by signal N (130 SIGINT, 143 SIGTERM,
129 SIGHUP) after removing what it had staged.
"""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator

#: Signals that end a run cleanly: they unwind (removing the staging folder) and exit 128 + N.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


class Interrupted(BaseException):
    """A handled signal arrived. It unwinds like KeyboardInterrupt, but derives from
    BaseException only, so no library's `except Exception` / `except KeyboardInterrupt` (click
    turns those into "Aborted!" and exit 1) swallows it; the CLI turns it into exit 128 + N.
    `state` says what the output folder holds, where a command writes one."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.state = ""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def message(self) -> str:
        name = signal.Signals(self.signum).name
        return f"interrupted by {name}; " + (self.state or "nothing was written")


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def install_signal_handlers() -> dict:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` (main thread only); returns the previous
    handlers."""
    previous = {}
    for sig in HANDLED_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _raise_interrupted)
        except (ValueError, OSError):  # not the main thread, or not settable here
            pass
    return previous


@contextlib.contextmanager
def signals_handled() -> Iterator[None]:
    """`install_signal_handlers` for the duration of a block (in-process callers get theirs back)."""
    previous = install_signal_handlers()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold handled signals back while a step that must not be cut in half runs (the rename into
    place, removing a staging folder); they are delivered right after it."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    except (AttributeError, OSError, ValueError):  # platforms without pthread_sigmask
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
