"""Command line: parses arguments, calls the pipeline, renders results. No logic of its own.

Exit codes (README "Exit codes"): 0 success; 1 a check found a mismatch; 2 unusable input or a
refused request; 3 an internal error (a bug); 128 + N ended by signal N. Errors are printed as
one clear line on stderr, never as a traceback; under `--json` stdout also gets the error document
(`mxconvert.error/1`), for usage errors (a bad option value, a missing or unknown option) too.

This module is the app and its error handling; the commands are in mxconvert/cli/commands.py,
their shared options in options.py, the terminal renderers in render.py, the consoles in console.py.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from mxconvert.cli import commands
from mxconvert.cli.console import STDOUT, err_console, print_json
from mxconvert.cli.startup import FastApp, FastGroup, escape
from mxconvert.cli.terminal import OutputError, quiet_stdout
from mxconvert.core.errors import (
    Interrupted,
    MxconvertError,
    install_signal_handlers,
    note_outcome,
    raise_if_lost,
    reported,
)

try:  # typer (0.2x) parses the command line with its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - depends on the installed typer: older ones run click itself
    # click is their dependency, not a declared one of ours (pyproject.toml), so it is not named here:
    # its ClickException is the base of the BadParameter every typer exports.
    ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")  # type: ignore[assignment,misc]

#: Version of the JSON printed for an error under --json (stdout; the message is on stderr too).
ERROR_JSON_SCHEMA = "mxconvert.error/1"

#: `error.kind` of the error document for a command line click refused before any command ran.
USAGE_ERROR_KIND = "UsageError"


def _asks_for_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for `--json` (among the options: a `--` ends them)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json" or arg.startswith("--json="):
            return True
    return False


class JsonUsageErrorsGroup(FastGroup):
    """The app's group: a command line that click refuses (a bad option value, a missing or
    unknown option, an extra argument) gets, under `--json`, the same error document on stdout as
    any other error; typer then prints its usual message on stderr and exits with click's code (2).
    The group sees both places click refuses a line: its own options (`make_context`) and the
    command's (parsed in `invoke`)."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        as_json = _asks_for_json(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except ClickException as exc:
            if as_json:
                _print_error_json(_usage_error_json(exc))
            raise
        ctx.meta["mxconvert.as_json"] = as_json
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClickException as exc:
            if ctx.meta.get("mxconvert.as_json"):
                _print_error_json(_usage_error_json(exc))
            raise


app = FastApp(
    cls=JsonUsageErrorsGroup,
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run.",
    pretty_exceptions_enable=False,
    # click's own help and usage errors, not typer's rich panels: click wraps every help text to the
    # terminal (80 columns included) and never cuts it, where the panels' narrow help column cut
    # long words (VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1) with an ellipsis; a usage error is then the
    # plain `Error: ...` line a CI log shows whole.
    rich_markup_mode=None,
)


def _guard(fn):
    """Turn our errors (and anything unexpected) into a one-line message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        note_outcome("")
        try:
            result = fn(*args, **kwargs)
            STDOUT.flush()  # a full or closed stdout is found while the exit code can still say so
            raise_if_lost()  # a signal whose Interrupted was swallowed still ends the run as one
            return result
        except OutputError as exc:  # the work stands; only its report is lost
            quiet_stdout()
            err_console.print(exc.message(_outcome_now()), highlight=False, markup=False)
            raise typer.Exit(exc.exit_code) from None
        except MxconvertError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
            if kwargs.get("as_json"):  # a --json consumer gets the error as JSON too
                _print_error_json(_error_json(getattr(exc, "json_kind", type(exc).__name__), str(exc), exc.exit_code))
            raise typer.Exit(exc.exit_code) from None
        except Interrupted as exc:
            reported(exc)
            err_console.print(exc.message(), highlight=False, markup=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:  # SIGINT where our handler is not installed (e.g. in-process use)
            err_console.print("interrupted by SIGINT; nothing was written")
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except OSError as exc:  # the user's disk or files, not a bug: say which file and why
            where = f"{exc.filename}: " if exc.filename else ""
            err_console.print(f"[bold red]error:[/] {escape(where + (exc.strerror or str(exc)))}", highlight=False)
            if kwargs.get("as_json"):
                _print_error_json(_error_json(type(exc).__name__, where + (exc.strerror or str(exc)), 2))
            raise typer.Exit(2) from None
        except Exception as exc:  # a bug in mxconvert: still no traceback, but say so
            err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
            err_console.print("please report this with the command you ran (set MXCONVERT_DEBUG=1 for a traceback)")
            import os

            if os.environ.get("MXCONVERT_DEBUG"):
                raise
            if kwargs.get("as_json"):
                _print_error_json(_error_json(INTERNAL_ERROR_KIND, f"{type(exc).__name__}: {exc}", 3))
            raise typer.Exit(3) from None

    return wrapper


#: `error.kind` of the error document for a bug in mxconvert (exit 3); the message names the exception.
INTERNAL_ERROR_KIND = "InternalError"


def _error_json(kind: str, message: str, exit_code: int) -> dict:
    """The error document (docs/schemas/error.schema.json): `kind` is the error class
    (`InputError`, `MismatchError`, ..., `UsageError`, `InternalError`)."""
    return {
        "schema": ERROR_JSON_SCHEMA,
        "ok": False,
        "error": {"kind": kind, "message": message, "exit_code": exit_code},
    }


def _usage_error_json(exc: ClickException) -> dict:
    """A command line click refused, as the error document: the message click prints, prefixed
    with the command it was for (`mxconvert select: Missing option '--profile' / '-p'.`)."""
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    return _error_json(USAGE_ERROR_KIND, where + exc.format_message(), exc.exit_code)


def _print_error_json(document: dict) -> None:
    """The error document on stdout; a stdout that refuses it leaves the stderr line and the exit code."""
    try:
        print_json(document)
        STDOUT.flush()
    except OutputError:
        quiet_stdout()


def _outcome_now() -> str:
    """What the output folder holds, as the run last noted it (`errors.note_outcome`)."""
    from mxconvert.core.errors import current_outcome

    return current_outcome()


def _version_callback(value: bool) -> None:
    if value:
        from mxconvert.core.version import __version__

        sys.stdout.write(f"mxconvert {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run."""


# The commands, in the order `mxconvert -h` lists them.
for _command in (
    commands.profiles,
    commands.backends,
    commands.runtimes,
    commands.select,
    commands.convert,
    commands.inspect,
    commands.verify,
):
    # the whole docstring as the short help of `mxconvert -h`, which click would cut at 45 characters
    app.command(short_help=inspect.getdoc(_command))(_guard(_command))


def main() -> None:
    install_signal_handlers(unblock=True)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
