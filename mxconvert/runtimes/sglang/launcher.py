"""`python -m mxconvert.runtimes.sglang ARGS`: SGLang's own server with `--load-format mxconvert`
(no SGLang import at module level; `main` imports it).

ARGS are SGLang 0.5.23's server arguments (`sglang serve` / `python -m sglang.launch_server`), with
`--model-path` an mxconvert artifact folder. The launcher adds `--load-format mxconvert` when ARGS
name no load format (and refuses another one), checks that mxconvert's SGLang plugin entry point is
installed (SGLang starts each scheduler in a fresh `spawn`ed process, which learns the load format
only through `load_plugins()`, i.e. the entry point), registers the plugin in this process, and runs
what `python -m sglang.launch_server` runs: `load_plugins()`, `prepare_server_args`, `run_server`.
The same works without the launcher: `sglang serve --model-path ART --load-format mxconvert`.
"""

from __future__ import annotations

import sys

from mxconvert.runtimes.sglang.dependency import LOAD_FORMAT

#: exit code of a refused request (the CLI's: 2)
REFUSED = 2

_FLAG = "--load-format"


def launch_argv(argv: list[str]) -> list[str]:
    """ARGS with `--load-format mxconvert` (added when absent). Raises ValueError for another format."""
    for i, arg in enumerate(argv):
        if arg == _FLAG:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith(_FLAG + "="):
            value = arg.split("=", 1)[1]
        else:
            continue
        if value.lower() != LOAD_FORMAT:
            raise ValueError(
                f"{_FLAG} {value!r}: this launcher serves mxconvert artifacts ({_FLAG} {LOAD_FORMAT}); "
                "for other formats run SGLang itself (sglang serve ...)"
            )
        return list(argv)
    return [*argv, _FLAG, LOAD_FORMAT]


def main(argv: list[str] | None = None) -> int:
    import importlib.metadata

    from mxconvert.runtimes.sglang.hook import PLUGIN_GROUP, PLUGIN_VALUE, plugin_installed
    from mxconvert.runtimes.sglang.plugin import register

    try:
        args = launch_argv(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        print(f"mxconvert: {exc}", file=sys.stderr)
        return REFUSED
    if not plugin_installed(importlib.metadata.entry_points):
        print(
            f"mxconvert: the entry point {PLUGIN_GROUP}: mxconvert = {PLUGIN_VALUE} is not installed, so SGLang's "
            "scheduler processes would not know the load format; reinstall mxconvert (pip install mxconvert) "
            "in the environment SGLang runs in",
            file=sys.stderr,
        )
        return REFUSED
    try:
        from sglang.launch_server import run_server
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.utils import kill_process_tree
    except ImportError as exc:
        from mxconvert.runtimes.sglang.dependency import missing_sglang

        print(f"mxconvert: {missing_sglang(exc)}", file=sys.stderr)
        return REFUSED
    import os

    register()
    load_plugins()  # runs the entry points (mxconvert's again: idempotent) and applies the hooks
    server_args = prepare_server_args(args)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0
