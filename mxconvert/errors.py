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
        return f"interrupted by {name}; " + (self.state or _outcome or "nothing was written")


_outcome = ""


def note_outcome(text: str) -> None:
    """What the output holds now, for the message of a signal that arrives later in the run
    (e.g. while the result is printed, after the artifact is in place)."""
    global _outcome
    _outcome = text


_deferring = 0
_pending: int | None = None


def _raise_interrupted(signum: int, frame: object) -> None:
    global _pending
    if _deferring:
        _pending = _pending or signum
        return
    raise Interrupted(signum)


def ignore_signals() -> None:
    """The run is over (its result printed or its error reported): a late signal changes
    nothing, so it is ignored rather than turned into a traceback during interpreter exit."""
    for sig in HANDLED_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass


def install_signal_handlers(unblock: bool = False) -> dict:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` (main thread only); returns the previous
    handlers. `unblock`: also deliver those signals if the parent started us with them blocked
    (one that is already pending is raised at once)."""
    previous = {}
    for sig in HANDLED_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _raise_interrupted)
        except (ValueError, OSError):  # not the main thread, or not settable here
            pass
    if unblock and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
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
    place, removing a staging folder); the first one is raised as `Interrupted` right after.
    Done in the Python handler, not with a thread signal mask: the kernel may deliver a signal to
    any thread (torch starts some), and Python runs the handler in the main thread anyway."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)
