"""Command line: parses arguments, calls the pipeline, renders results. No logic of its own.

Exit codes (README "Exit codes"): 0 success; 1 a check found a mismatch; 2 unusable input or a
refused request; 3 an internal error (a bug); 128 + N ended by signal N. Errors are printed as
one clear line on stderr, never as a traceback.

This module is the app and its error handling; the commands are in mxconvert/cli/commands.py,
their shared options in options.py, the terminal renderers in render.py, the consoles in console.py.
"""

from __future__ import annotations

import functools
import sys
from typing import Annotated

import typer

from mxconvert.cli import commands
from mxconvert.cli.console import STDOUT, err_console, print_json
from mxconvert.cli.startup import FastApp, escape
from mxconvert.cli.terminal import OutputError, quiet_stdout
from mxconvert.core.errors import (
    Interrupted,
    MxconvertError,
    install_signal_handlers,
    note_outcome,
    raise_if_lost,
    reported,
)

app = FastApp(
    add_completion=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Pre-lay-out FP4 MoE expert weights offline for the kernel a runtime will run.",
    pretty_exceptions_enable=False,
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
                try:
                    print_json(_error_json(exc))
                    STDOUT.flush()
                except OutputError:
                    quiet_stdout()  # the error is on stderr; its exit code stands
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
            raise typer.Exit(2) from None
        except Exception as exc:  # a bug in mxconvert: still no traceback, but say so
            err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
            err_console.print("please report this with the command you ran (set MXCONVERT_DEBUG=1 for a traceback)")
            import os

            if os.environ.get("MXCONVERT_DEBUG"):
                raise
            raise typer.Exit(3) from None

    return wrapper


#: Version of the JSON printed for an error under --json (stdout; the message is on stderr too).
ERROR_JSON_SCHEMA = "mxconvert.error/1"


def _error_json(exc: MxconvertError) -> dict:
    return {
        "schema": ERROR_JSON_SCHEMA,
        "ok": False,
        "error": {
            "kind": getattr(exc, "json_kind", type(exc).__name__),
            "message": str(exc),
            "exit_code": exc.exit_code,
        },
    }


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
    app.command()(_guard(_command))


def main() -> None:
    install_signal_handlers(unblock=True)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
