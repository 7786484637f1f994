"""What keeps the command line's start-up small: typer without pydantic for values that are
already typed, and rich imported on the first print.

typer (0.2x) coerces every parameter value through a pydantic `TypeAdapter`, built on first use,
even for a value the parser already produced in the right type: a `--help` flag that was not
given (None), a default such as `tp=1` or `backend="auto"`, a `--profile b200` string. Importing
pydantic and building those adapters was most of `mxconvert profiles`'s start-up
(bench/CHANGELOG.md, "Session 4: start-up"), and ~0.1 s of every `convert` and `verify` on a
2-core machine, for their one path each (`-o OUT`, `ARTIFACT`). `FastApp` gives every parameter a
coercion that returns such a value as it is (exactly what the adapter returns for it) and builds
typer's own adapter, with its messages and checks, for anything else (`--tp 2` arrives as the
string "2": a string of digits inside the option's range is `int()`-ed here; a path without
typer's path checks is `Path()`-ed, as typer does; anything else goes to typer). With a typer
that has no such machinery (older versions), nothing is changed.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer's coercion layer (typer >= 0.2x); absent in older versions, which need nothing here
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None  # type: ignore[assignment,misc]

_NOT_PLAIN = object()


def _plain_int(info: Any, value: Any) -> Any:
    """An `int` option's value as typer returns it, without pydantic: an int, or a string of ASCII
    digits alone ("2", "02": `int()` of it; `--tp 2` arrives as a string), inside the option's
    `min` / `max` when it has them. `_NOT_PLAIN` for anything else (signs, spaces, underscores,
    out-of-range values), which typer parses and checks with its own messages."""
    if type(value) is str and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is not int:
        return _NOT_PLAIN
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if (low is not None and value < low) or (high is not None and value > high):
        return _NOT_PLAIN
    return value


#: typer's defaults for a path parameter's checks: a parameter with any other setting goes to typer.
_PATH_DEFAULTS = {
    "exists": False,
    "file_okay": True,
    "dir_okay": True,
    "writable": False,
    "readable": True,
    "resolve_path": False,
    "allow_dash": False,
    "path_type": None,
}


def _plain_path(info: Any, value: Any) -> Any:
    """A `Path` parameter's value as typer returns it, without pydantic, where the parameter has
    typer's default checks: `Path(value)` of a string (pydantic's `Path` validation), and typer's
    one default check, that a path which exists is readable. `_NOT_PLAIN` for anything else (a
    path that exists unreadable, a NUL byte, other checks or types), which typer parses and checks
    with its own messages."""
    if type(value) is not str or "\0" in value:
        return _NOT_PLAIN
    if any(getattr(info, key, default) != default for key, default in _PATH_DEFAULTS.items()):
        return _NOT_PLAIN
    path = Path(value)
    try:
        os.stat(path)
    except OSError:  # typer checks nothing more for a path that does not exist
        return path
    return path if os.access(path, os.R_OK) else _NOT_PLAIN


def plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """`value` as typer's pydantic adapter would return it, when that needs no conversion beyond
    `int()` of a string of digits, and no check: a str for `str`, an int (or a string of digits)
    for `int` inside its range, a bool for `bool` (each also under `X | None`), a list or tuple of
    those for `list[X]` (returned as a list), a `Path` of a string for `Path` (`_plain_path`).
    `_NOT_PLAIN` for anything else (strings to parse, paths with checks, enums, custom parsers,
    bounds of other types), which goes to typer."""
    if getattr(info, "parser", None) is not None:
        return _NOT_PLAIN
    bounded = getattr(info, "min", None) is not None or getattr(info, "max", None) is not None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return _NOT_PLAIN
        annotation, origin = args[0], typing.get_origin(args[0])
    if origin is list:
        (item,) = typing.get_args(annotation) or (None,)
        if not isinstance(value, (list, tuple)):
            return _NOT_PLAIN
        if item is int:
            items = [_plain_int(info, v) for v in value]
            return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
        if item in (str, bool) and not bounded and all(type(v) is item for v in value):
            return list(value)
        return _NOT_PLAIN
    if annotation is int:
        return _plain_int(info, value)
    if annotation is Path and not bounded:
        return _plain_path(info, value)
    if annotation in (str, bool) and not bounded and type(value) is annotation:
        return value
    return _NOT_PLAIN


if RuntimeParam is not None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _PlainFirst(RuntimeParam):
        """Returns plain values as they are; hands anything else to typer's own coercion."""

        descriptor: TypeDescriptor = None  # type: ignore[assignment]

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, self.parameter_info, value)
            if plain is not _NOT_PLAIN:
                return plain
            typer_own = build_runtime_param(self.descriptor)
            param._runtime_param = typer_own  # built once, as typer itself caches it
            return typer_own._coerce_value(value, param=param, ctx=ctx)


def _plain_first(params: list) -> list:
    """Give each typer parameter whose coercion is not built yet the plain-first one."""
    if RuntimeParam is None:  # pragma: no cover
        return params
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if isinstance(descriptor, TypeDescriptor) and getattr(param, "_runtime_param", False) is None:
            try:
                param._runtime_param = _PlainFirst(descriptor.parameter_info, descriptor.annotation, descriptor)
            except (TypeError, AttributeError):  # pragma: no cover - a typer whose private layer changed
                return params  # typer's own coercion, unchanged: slower start-up, same behaviour
    return params


class FastGroup(TyperGroup):
    def get_params(self, ctx):
        return _plain_first(super().get_params(ctx))


class FastCommand(TyperCommand):
    def get_params(self, ctx):
        return _plain_first(super().get_params(ctx))


class FastApp(typer.Typer):
    """`typer.Typer` whose group and commands use the plain-first coercion (see the module doc)."""

    def __init__(self, cls: type[FastGroup] = FastGroup, **kwargs: Any) -> None:
        super().__init__(cls=cls, **kwargs)

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Callable:
        return super().command(*args, cls=cls or FastCommand, **kwargs)


class LazyConsole:
    """A rich `Console` made by `make` on first use (importing rich costs ~0.1-0.2 s; `--version`
    and `--json` output never need it)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = self._make()
        return getattr(self._console, name)


def escape(text: str) -> str:
    """rich's markup escape, imported on use."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
