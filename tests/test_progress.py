"""Progress is visible where it runs (issue 12 item 1): a bar on a terminal, plain lines with bytes,
MB/s and ETA on stderr in CI / piped / --json, and stdout stays clean JSON."""

from __future__ import annotations

import io
import json
import re

from helpers import EXAMPLE, run_cli_subprocess

from mxconvert.core.progress import Progress, choose_mode, format_line

LINE = re.compile(r"^(converting|verifying): (\d+\.\d)/(\d+\.\d) MB \((\d+)%\), (\d+\.\d) MB/s, ETA (\S+)( - .*)?$")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_is_a_bar_only_on_an_interactive_terminal(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MXCONVERT_PROGRESS", raising=False)
    assert choose_mode(False, Tty()) == "bar"
    assert choose_mode(True, Tty()) == "lines"  # --json: plain lines on stderr
    assert choose_mode(False, io.StringIO()) == "lines"  # piped
    monkeypatch.setenv("CI", "true")
    assert choose_mode(False, Tty()) == "lines"
    monkeypatch.setenv("MXCONVERT_PROGRESS", "off")
    assert choose_mode(False, Tty()) == "off"


def test_line_says_bytes_rate_and_time_left():
    line = format_line("converting", 50_000_000, 200_000_000, 10.0, "rank 0 layer 3")
    assert line == "converting: 50.0/200.0 MB (25%), 5.0 MB/s, ETA 0:00:30 - rank 0 layer 3"


def test_lines_mode_prints_periodically_and_once_at_the_end(monkeypatch):
    monkeypatch.setenv("MXCONVERT_PROGRESS_INTERVAL", "0")
    stream = io.StringIO()
    with Progress("verifying", 300, stream=stream, mode="lines") as bar:
        for _ in range(3):
            bar.advance(100, "step")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # two while running (the last advance completes), one final
    assert lines[-1].startswith("verifying: 0.0/0.0 MB (100%)") and lines[-1].endswith(" - done")


def test_bar_mode_draws_on_its_stream(monkeypatch):
    stream = Tty()
    with Progress("converting", 100, stream=stream, mode="bar") as bar:
        bar.advance(100, "layer 0")
    assert "converting" in stream.getvalue()


def test_ci_convert_and_verify_print_progress_lines_on_stderr_and_json_on_stdout(tmp_path):
    env = {"MXCONVERT_PROGRESS_INTERVAL": "0", "CI": "true"}
    out = tmp_path / "art"
    conv = run_cli_subprocess("convert", EXAMPLE, "-p", "b200", "--tp", "2", "-o", out, "--json", env=env)
    assert conv.returncode == 0, conv.stderr
    assert json.loads(conv.stdout)["artifact"] == str(out)  # stdout: only the JSON
    lines = [m for m in map(LINE.match, conv.stderr.splitlines()) if m]
    assert len(lines) >= 3 and lines[0][1] == "converting"
    final = lines[-1]
    assert final[4] == "100" and final[2] == final[3] and final.group(7) == " - done"
    done = [float(m[2]) for m in lines]
    assert done == sorted(done)  # monotone
    ver = run_cli_subprocess("verify", out, "--json", env=env)
    assert ver.returncode == 0, ver.stderr
    assert json.loads(ver.stdout)["ok"] is True
    vlines = [m for m in map(LINE.match, ver.stderr.splitlines()) if m]
    assert vlines and all(m[1] == "verifying" for m in vlines)
    assert vlines[-1][4] == "100" and vlines[-1][2] == vlines[-1][3]


def test_the_readme_ci_recipe_runs_twice_in_a_non_tty_shell(tmp_path):
    """The README's CI recipe, as written, run twice: both runs exit 0, the second is up to date,
    and the log says what happened."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    # the block after the sentence (a `<!-- readme-test: ... -->` marker line may stand between them)
    after = readme.split("A CI job that prepares deployment artifacts:\n\n", 1)[1]
    recipe = after.split("```sh\n", 1)[1].split("```", 1)[0]
    env = dict(
        os.environ,
        MODEL=str(EXAMPLE),
        ART=str(tmp_path / "art"),
        CI="true",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    runs = [
        subprocess.run(
            ["bash", "-c", recipe], cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert json.loads((tmp_path / "verify.json").read_text())["ok"] is True
    assert json.loads((tmp_path / "convert.json").read_text())["status"] == "up_to_date"
    assert "converting: " in runs[0].stderr and "verifying: " in runs[0].stderr
    assert "up to date" in runs[1].stderr and "converting: " not in runs[1].stderr
