"""What the command line writes, and how: text from checkpoints, profile files and manifests shown
with its control characters escaped, and a result that cannot be written to stdout reported as
what it is, not as a mismatch or a bad input.

Names reach the terminal from files the user did not write (tensor names in a safetensors header,
a profile's `name`, a manifest's `provenance`); an ESC in one of them would let the file drive the
terminal (clear it, retitle it, hide text). Every string rich prints passes through `escaped`
(a render hook on both consoles), so a table, an error or a warning shows `\\x1b` instead. JSON
output is escaped by `json.dumps` already.

stdout can fail after the work is done: a reader that went away (`mxconvert verify ART | head -1`:
a broken pipe), a closed descriptor (`>&-`), a full disk. The command's outcome then stands (the
artifact is in place, or the check ran), but its result is not printed; the exit code says so
(docs/usage.md, "Exit codes"): 141 = 128 + SIGPIPE for a broken pipe, as for any Unix tool whose
reader left, and 4 for any other write error of stdout.
"""

from __future__ import annotations

import errno
import re
import sys
from typing import Any

#: C0 controls other than newline and tab, DEL, and the C1 controls (ESC-less CSI/OSC in 8-bit form).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: Exit code of a command whose result could not be written to stdout (broken pipe: 128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141
EXIT_OUTPUT_ERROR = 4


def escaped(text: str) -> str:
    """`text` with every control character but newline and tab written as `\\xNN` (visible, inert)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class OutputError(Exception):
    """stdout refused the command's result (closed, broken pipe, full). Not an `OSError`, so that
    the CLI does not mistake it for an error of the user's files."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause

    @property
    def exit_code(self) -> int:
        return EXIT_BROKEN_PIPE if isinstance(self.cause, BrokenPipeError) else EXIT_OUTPUT_ERROR

    def message(self, outcome: str) -> str:
        reason = "the reader closed the pipe" if isinstance(self.cause, BrokenPipeError) else _reason(self.cause)
        return (
            f"error: the result could not be written to standard output ({reason}); {outcome or 'nothing was written'}"
        )


def _reason(cause: BaseException) -> str:
    if isinstance(cause, OSError) and cause.errno is not None:
        return cause.strerror or errno.errorcode.get(cause.errno, str(cause.errno))
    return "standard output is closed" if isinstance(cause, (ValueError, AttributeError)) else str(cause)


class Stdout:
    """A file-like stdout for the command's results: every write and flush error (and a stdout the
    process started without) becomes `OutputError`."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except (OSError, ValueError, AttributeError) as exc:  # AttributeError: sys.stdout is None
            raise OutputError(exc) from None

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except (OSError, ValueError, AttributeError) as exc:
            raise OutputError(exc) from None

    def isatty(self) -> bool:
        try:
            return sys.stdout.isatty()
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


def quiet_stdout() -> None:
    """After a failed stdout: point fd-level stdout at /dev/null so that the interpreter's final
    flush does not print "Exception ignored ... BrokenPipeError" and change the exit code."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the interpreter exits


class EscapingHook:
    """A rich render hook: every renderable is rendered as usual, then the text of its segments
    has its control characters escaped (rich's own styling is in the segments' styles, not their
    text, so colours and tables are untouched)."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Escaped(r) for r in renderables]


class _Escaped:
    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        for segment in console.render(self.renderable, options):
            if segment.control or not _CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(escaped(segment.text), segment.style)
