"""Progress of long work (convert, verify, inspect of large files), visible wherever it runs.

On a terminal: a rich bar on stderr. Elsewhere (piped, CI, `--json`): a plain line on stderr
every few seconds and one at the end, with bytes done, MB/s and the time left, so a CI log shows
that the job is alive and how far it got. stdout is never touched (it may carry `--json`).

`MXCONVERT_PROGRESS`: `auto` (default), `bar`, `lines` or `off`;
`MXCONVERT_PROGRESS_INTERVAL`: seconds between plain lines (default 10; 0 prints every update).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

MODES = ("auto", "bar", "lines", "off")


def choose_mode(json_mode: bool, stream: TextIO | None = None) -> str:
    """bar on an interactive terminal; lines in CI, when piped and under --json; as asked by
    MXCONVERT_PROGRESS otherwise."""
    asked = os.environ.get("MXCONVERT_PROGRESS", "auto").strip().lower() or "auto"
    if asked not in MODES:
        asked = "auto"
    if asked != "auto":
        return asked
    stream = stream or sys.stderr
    interactive = hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("CI")
    return "bar" if interactive and not json_mode else "lines"


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("MXCONVERT_PROGRESS_INTERVAL", "10")))
    except ValueError:
        return 10.0


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_line(label: str, done: int, total: int, elapsed: float, detail: str = "") -> str:
    """`label: 12.3/45.6 MB (27%), 8.1 MB/s, ETA 0:00:04 - detail`"""
    rate = done / elapsed if elapsed > 0 else 0.0
    pct = 100.0 * done / total if total else 100.0
    eta = _clock((total - done) / rate) if rate > 0 and total >= done else "?"
    text = f"{label}: {done / 1e6:.1f}/{total / 1e6:.1f} MB ({pct:.0f}%), {rate / 1e6:.1f} MB/s, ETA {eta}"
    return text + (f" - {detail}" if detail else "")


class Progress:
    """Bytes done out of `total`, shown as a bar or as periodic plain lines (see `choose_mode`).

    Use as a context manager; `advance(nbytes, detail)` after each piece of work."""

    def __init__(
        self, label: str, total: int, *, json_mode: bool = False, stream: TextIO | None = None, mode: str | None = None
    ) -> None:
        self.label, self.total = label, max(0, int(total))
        self.stream = stream or sys.stderr
        self.mode = mode or choose_mode(json_mode, self.stream)
        self.done = 0
        self.detail = ""
        self._start = self._last = time.monotonic()
        self._interval = _interval()
        self._bar: Any = None  # rich's Progress while shown (rich is imported only then)
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._start = self._last = time.monotonic()
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def advance(self, nbytes: int, detail: str = "") -> None:
        self.done += int(nbytes)
        self.detail = detail or self.detail
        if self.mode == "bar" and self._bar is not None:
            self._bar.update(self._task, advance=int(nbytes), description=f"{self.label} {detail}".strip())
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self._last >= self._interval and self.done < self.total:
                self._last = now
                self._print(now)

    def _print(self, now: float) -> None:
        self.stream.write(format_line(self.label, self.done, self.total, now - self._start, self.detail) + "\n")
        self.stream.flush()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
            self._bar = None
        elif self.mode == "lines" and exc_type is None:
            self.detail = "done"
            self._print(time.monotonic())
