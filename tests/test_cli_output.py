"""What the command line writes (issue 'Fail closed, round 2', item 9): a stdout that fails after
the work is done is reported as such (exit 141 for a broken pipe, 4 for any other write error;
never 1 "mismatch", 2 "bad input" or a traceback) and the work stands; names from files reach
the terminal with their control characters escaped (mxconvert/cli/terminal.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLE, ROOT

from mxconvert.cli.terminal import escaped

ESC = "\x1b"


def _run(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mxconvert", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def _verifies(art: Path) -> bool:
    return _run("verify", art).returncode == 0


def test_a_closed_stdout_after_a_good_convert_is_exit_4_and_the_artifact_stands(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "mxconvert", "convert", str(EXAMPLE), "-p", "h100", "-o", str(out), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: os.close(1),  # the child starts with no stdout at all (`>&-`)
    )
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "could not be written to standard output (standard output is closed)" in proc.stderr
    assert f"{out} holds the new, complete artifact" in proc.stderr
    assert _verifies(out)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_stdout_is_exit_4_naming_the_error_and_the_artifact_stands(tmp_path):
    out = tmp_path / "out"
    with open("/dev/full", "w") as full:
        proc = _run("convert", EXAMPLE, "-p", "h100", "-o", out, stdout=full)
    assert proc.returncode == 4, proc.stderr
    assert "(No space left on device)" in proc.stderr and "Traceback" not in proc.stderr
    assert _verifies(out)


@pytest.mark.parametrize("args", [("profiles",), ("backends", "--json"), ("select", str(EXAMPLE), "-p", "b200")])
def test_a_broken_pipe_is_exit_141_with_one_line(args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes: every write is EPIPE
    try:
        proc = _run(*args, stdout=write_end)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: the result could not be written to standard output (the reader closed the pipe); nothing was written"
    )
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_verify_with_a_closed_stdout_does_not_say_mismatch(tmp_path):
    out = tmp_path / "out"
    assert _run("convert", EXAMPLE, "-p", "h100", "-o", out).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "mxconvert", "verify", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 4 and "mismatch" not in proc.stderr.lower(), proc.stderr


def _evil_profile(tmp_path: Path) -> Path:
    path = tmp_path / "evil.json"
    path.write_text(json.dumps({"base": "h100", "name": f"evil{ESC}]0;retitled", "description": f"d{ESC}[2Jcleared"}))
    return path


def test_a_profile_name_with_control_characters_reaches_the_terminal_escaped(tmp_path):
    proc = _run("select", EXAMPLE, "-p", _evil_profile(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stdout and ESC not in proc.stderr
    assert "evil\\x1b]0;retitled" in proc.stdout


def test_an_error_naming_a_path_with_control_characters_is_escaped(tmp_path):
    bad = tmp_path / f"no{ESC}[2Jsuch"
    proc = _run("inspect", bad)
    assert proc.returncode == 2
    assert ESC not in proc.stderr and "no\\x1b[2Jsuch" in proc.stderr


def test_json_output_keeps_control_characters_as_json_escapes(tmp_path):
    proc = _run("select", EXAMPLE, "-p", _evil_profile(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stdout and "evil\\u001b]0;retitled" in proc.stdout  # JSON's own escape
    assert json.loads(proc.stdout)["profile"] == f"evil{ESC}]0;retitled"  # the name itself, intact


@pytest.mark.parametrize(
    "text, shown",
    [("plain", "plain"), ("a\tb\nc", "a\tb\nc"), (f"x{ESC}[31m", "x\\x1b[31m"), ("\x00\x7f\x9b", "\\x00\\x7f\\x9b")],
)
def test_escaped_makes_every_control_character_but_newline_and_tab_visible(text, shown):
    assert escaped(text) == shown


# ---- JSON in, JSON out: no NaN or Infinity anywhere (RFC 8259) --------------------------------------
def _strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"bare {token} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "name, text",
    [
        ("nan.json", '{"base": "h100", "name": "x", "extra": {"clock": NaN}}'),
        ("inf.json", '{"base": "h100", "name": "x", "extra": {"clock": -Infinity}}'),
        ("nan.toml", 'base = "h100"\nname = "x"\n[extra]\nclock = nan\n'),
        ("inf.toml", 'base = "h100"\nname = "x"\nextra = {clock = inf}\n'),
    ],
)
def test_a_profile_with_a_non_finite_number_is_refused_naming_the_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    proc = _run("select", EXAMPLE, "-p", path, "--json")
    assert proc.returncode == 2, proc.stderr
    assert f"profile file {path}" in proc.stderr and "Traceback" not in proc.stderr
    assert "extra.clock is" in proc.stderr and (
        "not a finite number" in proc.stderr or "not a JSON number" in proc.stderr
    )
    assert _strict_json(proc.stdout)["ok"] is False  # the error document, valid JSON


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_checkpoint_config_with_a_bare_non_finite_token_is_refused_and_nothing_written(tmp_path, token):
    import shutil

    src = tmp_path / "model"
    shutil.copytree(EXAMPLE, src)
    config = src / "config.json"
    config.write_text(config.read_text().replace('"swiglu_limit": 7.0', f'"swiglu_limit": {token}', 1))
    assert token in config.read_text()
    proc = _run("convert", src, "-p", "h100", "-o", tmp_path / "out", "--json")
    assert proc.returncode == 2, proc.stderr
    assert f"{config}: not valid JSON (swiglu_limit is {token}, not a JSON number (RFC 8259))" in proc.stderr
    assert not (tmp_path / "out").exists()
    _strict_json(proc.stdout)


def test_every_json_document_of_a_good_run_is_rfc_8259_json(tmp_path):
    out = tmp_path / "out"
    for args in (
        ("profiles", "--json"),
        ("backends", "--json"),
        ("select", EXAMPLE, "-p", "b200", "--json"),
        ("convert", EXAMPLE, "-p", "b200", "-o", out, "--json"),
        ("verify", out, "--json"),
        ("inspect", out, "--json"),
    ):
        proc = _run(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        _strict_json(proc.stdout)
