"""JSON as RFC 8259 defines it, for everything mxconvert reads: a checkpoint's config and index,
a profile file, a manifest.

Python's `json` accepts the bare tokens `NaN`, `Infinity` and `-Infinity`, which are not JSON; a
value read that way would travel into a manifest or `--json` output that no other JSON reader
accepts (issue 'Fail closed, round 2', item 9). TOML has `nan` and `inf` floats of its own;
`first_non_finite` finds them in what a TOML profile holds.
"""

from __future__ import annotations

import json
import math


class _NonFinite(ValueError):
    pass


def _refuse_constant(token: str) -> None:
    raise _NonFinite(token)


def loads(text: str) -> object:
    """`json.loads` that refuses NaN / Infinity tokens (ValueError, as for any malformed JSON,
    naming the field that holds one: `swiglu_limit is Infinity, not a JSON number (RFC 8259)`)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NonFinite as exc:
        where = first_non_finite(json.loads(text))  # parsed again, permissively, only to say where
        raise ValueError(f"{where or 'a value'} is {exc}, not a JSON number (RFC 8259)") from None


def first_non_finite(value: object, where: str = "") -> str | None:
    """The path (`a.b[2]`) of the first NaN or infinite float inside `value`, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(the value)"
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_non_finite(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = first_non_finite(item, f"{where}[{i}]")
            if found:
                return found
    return None
