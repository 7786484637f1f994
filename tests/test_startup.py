"""Start-up (issue 11, target 6): values the parser already typed skip typer's pydantic coercion
and give what it gives; anything else still goes through it (its checks and messages); the
quick commands import neither torch nor pydantic, and `select` no pydantic."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import EXAMPLE, ROOT, run_cli
from typer._coercion import build_runtime_param
from typer.main import get_command

from mxconvert._startup import _NOT_PLAIN, plain_value
from mxconvert.cli import app

SAMPLES = (None, "b200", "", "2", 1, 0, True, False, ("b200",), ("a", "b"), (), (1, 2), ["x"], 2.5)


def _parameters():
    group = get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if hasattr(param, "type_descriptor"):
                yield f"{name} {param.name}", param


@pytest.mark.parametrize("label, param", list(_parameters()), ids=lambda x: x if isinstance(x, str) else "")
def test_a_plain_value_is_what_typers_own_coercion_returns(label, param):
    desc = param.type_descriptor
    own = build_runtime_param(desc)
    for value in (param.default, *SAMPLES):
        if value is None:
            continue
        plain = plain_value(desc.annotation, desc.parameter_info, value)
        if plain is _NOT_PLAIN:
            continue
        got = own._coerce_value(value, param=param, ctx=None)
        assert plain == got and type(plain) is type(got), (label, value, plain, got)


def test_values_that_need_parsing_still_go_through_typer():
    assert run_cli("select", EXAMPLE, "-p", "b200", "--tp", "2", "--json").exit_code == 0
    bad = run_cli("select", EXAMPLE, "-p", "b200", "--tp", "two")
    assert bad.exit_code == 2 and "Invalid value for '--tp'" in bad.stderr and "valid integer" in bad.stderr
    zero = run_cli("convert", EXAMPLE, "-p", "b200", "-o", "unused", "--jobs", "0", "--dry-run")
    assert zero.exit_code == 2 and "--jobs" in zero.stderr


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return set(out.stdout.split())


def test_quick_commands_import_neither_torch_nor_pydantic_and_select_no_pydantic():
    quick = ("from mxconvert.cli import app\n"
             "for args in (['profiles'], ['profiles', '--json'], ['--help'], ['--version'], ['backends'],\n"
             "             ['select', '--help']):\n"
             "    try:\n        app(args)\n    except SystemExit as e:\n        assert e.code == 0, args\n")
    loaded = _modules_after(quick)
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "pydantic", "numpy")}
    select = ("from mxconvert.cli import app\n"
              f"try:\n    app(['select', {str(EXAMPLE)!r}, '-p', 'b200', '--json'])\n"
              "except SystemExit as e:\n    assert e.code == 0\n")
    loaded = _modules_after(select)
    assert "mxconvert.selection" in loaded and not {m for m in loaded if m.split(".")[0] == "pydantic"}


def test_defaults_and_plain_strings_take_the_plain_path_paths_and_ranges_do_not():
    by_name = {label: p for label, p in _parameters()}
    for label, value in (("select profile", ("b200",)), ("select tp", 1), ("select backend", "auto"),
                         ("select runtime", "vllm-0.33"), ("select env", ()), ("convert tp", (1, 2))):
        desc = by_name[label].type_descriptor
        assert plain_value(desc.annotation, desc.parameter_info, value) is not _NOT_PLAIN, label
    for label, value in (("convert out", "x"), ("convert threads", 2), ("select tp", "2")):
        desc = by_name[label].type_descriptor
        assert plain_value(desc.annotation, desc.parameter_info, value) is _NOT_PLAIN, label
