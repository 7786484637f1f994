"""Start-up (issue 11, target 6): values the parser already typed skip typer's pydantic coercion
and give what it gives; anything else still goes through it (its checks and messages); the
quick commands import neither torch nor pydantic, and `select` (planning) neither torch nor numpy
nor pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLE, ROOT, modules_after, run_cli
from typer._coercion import build_runtime_param
from typer.main import get_command

from mxconvert.cli.main import app
from mxconvert.cli.startup import _NOT_PLAIN, plain_value

SAMPLES = (
    None,
    "b200",
    "",
    "2",
    "02",
    "0",
    "10",
    "-1",
    "+3",
    " 4",
    "4 ",
    "1_0",
    "\u0663",
    "2.0",
    1,
    0,
    -1,
    True,
    False,
    ("b200",),
    ("a", "b"),
    (),
    (1, 2),
    ("2", "4"),
    ("2", "x"),
    ("0",),
    ["x"],
    2.5,
    ".",
    "/",
    "tests",
    "README.md",
    "no/such/path",
    "a\0b",
    "~/x",
)


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


def test_quick_commands_import_neither_torch_nor_pydantic():
    quick = (
        "from mxconvert.cli.main import app\n"
        "for args in (['profiles'], ['profiles', '--json'], ['--help'], ['--version'], ['backends'],\n"
        "             ['select', '--help']):\n"
        "    try:\n        app(args)\n    except SystemExit as e:\n        assert e.code == 0, args\n"
    )
    loaded = modules_after(quick)
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "pydantic", "numpy")}


#: Run in a fresh interpreter: the command line's entry (`_entry.main`, what `mxconvert` runs) for
#: each argv of ARGS, then the heavy modules loaded so far; one JSON line per run.
_RUN_AND_REPORT = """
import io, json, sys, contextlib
from mxconvert._entry import main
for args in json.loads(sys.argv[1]):
    sys.argv = ["mxconvert", *args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "pydantic"})
    print(json.dumps({"args": args, "code": code, "heavy": heavy, "json": out.getvalue()[:1]}))
"""


def test_select_and_dry_run_import_neither_torch_nor_numpy_on_every_example(tmp_path):
    """Planning runs on dtypes by name and shapes alone (mxconvert/dtypes.py, layouts/shapes.py):
    `select` (text and --json) and `convert --dry-run` for every example and built-in profile load
    no torch, numpy or pydantic (`convert`'s `-o` path takes the plain path too); every run is
    checked, refusals (exit 2) included. The select runs come first: a module loaded by one run
    stays loaded for the next."""
    import json

    from mxconvert.target.profiles import BUILTIN_PROFILES

    examples = sorted(p for p in (ROOT / "examples").iterdir() if (p / "config.json").is_file())
    runs = [
        ["select", str(example), "-p", prof.name, *(["--json"] if i % 2 else [])]
        for example in examples
        for i, prof in enumerate(BUILTIN_PROFILES)
    ]
    runs += [["select", str(example), "-p", "b200", "--tp", "2", "--json"] for example in examples]
    for example in examples:
        runs.append(["convert", str(example), "-p", "b200", "-o", str(tmp_path / "out"), "--dry-run", "--json"])
        runs.append(["convert", str(example), "-p", "h100", "-o", str(tmp_path / "out"), "--dry-run"])
    runs.append(["verify", str(tmp_path / "no-artifact")])  # its path argument, without pydantic
    out = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, json.dumps(runs)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["args"] for r in reports] == runs
    for report in reports:
        allowed = {"numpy"} if report["args"][0] == "verify" else set()  # verify loads its modules first
        assert report["code"] in (0, 2) and set(report["heavy"]) <= allowed, report
        assert ("--json" in report["args"]) == (report["json"] == "{"), report  # the JSON document, or text
    assert sum(r["code"] == 0 for r in reports) > len(runs) // 2 and any(r["code"] == 2 for r in reports)
    assert not list(tmp_path.iterdir())  # --dry-run wrote nothing


def test_a_path_that_exists_unreadable_goes_to_typer(monkeypatch):
    """typer's one default path check (readable, where the path exists) stays typer's: such a
    value is not plain. (Tests run as root here, where every path is readable.)"""
    desc = dict(_parameters())["convert out"].type_descriptor
    assert plain_value(desc.annotation, desc.parameter_info, ".") == Path(".")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert plain_value(desc.annotation, desc.parameter_info, ".") is _NOT_PLAIN
    assert plain_value(desc.annotation, desc.parameter_info, "no/such/path") == Path("no/such/path")


def test_defaults_and_plain_strings_take_the_plain_path_paths_and_ranges_do_not():
    by_name = {label: p for label, p in _parameters()}
    for label, value in (
        ("select profile", ("b200",)),
        ("select tp", 1),
        ("select backend", "auto"),
        ("select runtime", "vllm-0.33"),
        ("select env", ()),
        ("convert tp", (1, 2)),
    ):
        desc = by_name[label].type_descriptor
        assert plain_value(desc.annotation, desc.parameter_info, value) is not _NOT_PLAIN, label
    for label, value in (
        ("select tp", "2"),
        ("convert tp", ("1", "2")),
        ("convert threads", "3"),
        ("convert out", "x"),
        ("convert out", "."),
        ("verify artifact", "no/such/artifact"),
    ):
        desc = by_name[label].type_descriptor
        assert plain_value(desc.annotation, desc.parameter_info, value) is not _NOT_PLAIN, label
    for label, value in (
        ("convert out", "a\0b"),
        ("convert threads", "0"),
        ("select tp", "+2"),
        ("select tp", " 2"),
    ):
        desc = by_name[label].type_descriptor
        assert plain_value(desc.annotation, desc.parameter_info, value) is _NOT_PLAIN, label


_ENTRY_ENV = """
import os, sys
from mxconvert._entry import main
sys.argv = ["mxconvert", "--version"]
try:
    main()
except SystemExit:
    pass
print("OPENBLAS_NUM_THREADS=" + os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
"""


@pytest.mark.parametrize("given, expected", [(None, "1"), ("4", "4")])
def test_the_command_line_starts_blas_with_one_thread_unless_told(given, expected):
    """numpy's OpenBLAS spins one thread per core at import for ~0.1 s, and no command runs BLAS:
    the entry point asks for one thread before anything imports numpy; a user's own setting wins."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", _ENTRY_ENV], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"OPENBLAS_NUM_THREADS={expected}"
