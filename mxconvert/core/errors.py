"""Errors that carry an exit code, so the CLI never shows a traceback for bad input.

Exit codes are part of the CLI contract that CI pipelines rely on (README "Exit codes"):
0 success, 1 a mismatch was found (verify / diff), 2 unusable input or refused request,
3 an internal error (a bug in mxconvert), 128 + N ended by signal N (130 SIGINT, 143 SIGTERM,
129 SIGHUP) after removing what it had staged.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

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


def current_outcome() -> str:
    """What the run last noted the output holds ("" when it noted nothing)."""
    return _outcome


_deferring = 0
_pending: int | None = None
#: The last signal raised as `Interrupted` that no handler has reported yet (see `raise_if_lost`).
_raised: int | None = None


def _interrupted(signum: int) -> Interrupted:
    global _raised
    _raised = signum
    return Interrupted(signum)


def reported(exc: Interrupted) -> None:
    """The handler that reports `exc` (exit 128 + N) calls this: the signal was not lost."""
    global _raised
    _raised = None


def _quiet_lost_interrupted(unraisable: Any) -> None:
    """`sys.unraisablehook`: a swallowed `Interrupted` is not printed as "Exception ignored ...
    Traceback"; `raise_if_lost` raises it again. Every other unraisable goes to the previous hook."""
    if isinstance(unraisable.exc_value, Interrupted):
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def raise_if_lost() -> None:
    """Raise again a signal whose `Interrupted` was swallowed: the handler may run inside a
    `__del__`, a weakref callback or another spot where Python only prints "Exception ignored"
    and goes on. Called before a step that commits (the rename into place) and when a command
    returns, so a lost signal still ends the run with exit 128 + N."""
    if _raised is not None:
        raise Interrupted(_raised)


#: How often a signal that arrived during an import checks whether the import has finished.
_IMPORT_POLL_S = 0.02


def _inside_import(frame: FrameType | None) -> bool:
    """Whether the main thread is executing a module's import. An exception raised there can
    leave a half-initialised module behind (numpy then refuses to load twice: "cannot load module
    more than once per process") or be rewrapped (`__set_name__` turns it into RuntimeError), so
    the interruption must wait until the import is over."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _deferring:
        _pending = _pending or signum
        return
    if _inside_import(frame):
        _pending = _pending or signum
        signal.setitimer(signal.ITIMER_REAL, _IMPORT_POLL_S)  # `_raise_after_import` polls
        return
    raise _interrupted(signum)


def _raise_after_import(_alarm: int, frame: FrameType | None) -> None:
    """SIGALRM handler: raise the signal held back by an import once the import has finished."""
    global _pending
    if _pending is None or _deferring:  # nothing held, or `signals_deferred` raises it on exit
        return
    if _inside_import(frame):
        signal.setitimer(signal.ITIMER_REAL, _IMPORT_POLL_S)
        return
    signum, _pending = _pending, None
    raise _interrupted(signum)


def ignore_signals() -> None:
    """The run is over (its result printed or its error reported): a late signal changes
    nothing, so it is ignored rather than turned into a traceback during interpreter exit."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)  # no poll for a signal held back by an import
    for sig in (*HANDLED_SIGNALS, signal.SIGALRM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass


def install_signal_handlers(unblock: bool = False) -> dict:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` (main thread only; during an import, right
    after it, through a SIGALRM poll); returns the previous handlers. `unblock`: also deliver
    those signals if the parent started us with them blocked (a pending one is raised at once)."""
    global _raised, _previous_unraisablehook
    _raised = None
    if sys.unraisablehook is not _quiet_lost_interrupted:
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_lost_interrupted
    previous = {}
    handlers = {sig: _raise_interrupted for sig in HANDLED_SIGNALS} | {signal.SIGALRM: _raise_after_import}
    for sig, handler in handlers.items():
        try:
            previous[sig] = signal.signal(sig, handler)
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
            raise _interrupted(signum)
