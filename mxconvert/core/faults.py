"""A deterministic fault-injection hook, so tests can prove that every write and rename of
`convert` fails closed (tests/test_fail_closed.py).

`MXCONVERT_FAULT=KIND:N[:ACTION]` makes the N-th (1-based) fault point of KIND fail:
KIND is `write` (a tensor written to a staging file, a file copied, the manifest) or `rename`
(a rename of the staging or old artifact folder); ACTION is `eio` (default: an OSError, as a
failing disk gives), `enospc` (disk full), `kill` (SIGKILL: no cleanup at all), `term` (SIGTERM),
`int` (SIGINT) or `lost-term` (SIGTERM inside a finaliser, where Python swallows the exception).
A comma-separated `no-exchange` item also turns off the atomic folder exchange (testing the
two-rename fallback). Unset, every fault point costs one dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import signal

_counts: dict[str, int] = {}


def _items() -> list[str]:
    return [item for item in os.environ.get("MXCONVERT_FAULT", "").split(",") if item]


def disabled(feature: str) -> bool:
    """`MXCONVERT_FAULT=...,no-FEATURE` turns a feature off (e.g. `no-exchange`: the atomic
    folder exchange, so that the two-rename fallback can be tested on Linux too)."""
    return f"no-{feature}" in _items()


def _spec() -> tuple[str, int, str] | None:
    items = [item for item in _items() if not item.startswith("no-")]
    if not items:
        return None
    parts = items[0].split(":")
    try:
        return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "eio"
    except (IndexError, ValueError):
        return None


def fault_point(kind: str, what: object = "") -> None:
    """Count one `kind` operation; fail it if MXCONVERT_FAULT names this one."""
    spec = _spec()
    if spec is None or spec[0] != kind:
        return
    _counts[kind] = _counts.get(kind, 0) + 1
    if _counts[kind] != spec[1]:
        return
    action = spec[2]
    if action in ("kill", "term", "int"):
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[action])
        return
    if action == "lost-term":
        _SignalInFinaliser()  # dropped at once: its __del__ swallows the Interrupted
        return
    code = errno.ENOSPC if action == "enospc" else errno.EIO
    raise OSError(code, os.strerror(code), str(what))


class _SignalInFinaliser:
    """SIGTERM delivered while a finaliser runs, where Python prints "Exception ignored" and drops
    the handler's `Interrupted`: the run must still end as interrupted (`errors.raise_if_lost`)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at one of these steps, inside __del__
            pass


def reset() -> None:
    """Start counting again (in-process tests)."""
    _counts.clear()
