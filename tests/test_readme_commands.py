"""The README's commands run as written (issue 23 item 5): every fenced `sh` or `python` block of the
README carries a marker saying whether it runs here, and the ones that do run, in order, in a
temporary folder holding the examples/ checkpoints, with `mxconvert` and `python` on PATH as
`make setup` puts them in .venv/bin. An output block after a command block must match what the
commands print (each of its lines appears in their output). Blocks that need the network, the
Hugging Face hub or a GPU are skipped with the marker's reason.

Markers (an HTML comment on the line before the block, invisible on GitHub):
  <!-- readme-test: run [NAME=VALUE ...] -->   run with these environment variables
  <!-- readme-test: output -->                 the output of the run block before it
  <!-- readme-test: skip REASON -->            not run here, and why
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT

README = ROOT / "README.md"
_MARKER = re.compile(r"<!-- readme-test: (run|output|skip)\b ?(.*?) -->")
_FENCE = re.compile(r"^```(\w*)$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None  # run | output | skip, or None when the block has no marker
    detail: str  # run: NAME=VALUE pairs; skip: the reason


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of the README, each with the marker on the line before it (if any)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        marker = _MARKER.fullmatch(lines[i - 1].strip()) if i else None
        blocks.append(
            Block(
                i + 1,
                fence.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
            )
        )
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
SKIPPED = [b for b in BLOCKS if b.marker == "skip"]


def test_every_command_block_says_whether_it_runs():
    """A new `sh` or `python` block without a marker fails here: it is run, or skipped with a reason."""
    for block in BLOCKS:
        if block.lang in ("sh", "bash", "shell", "python", "console"):
            assert block.marker in ("run", "skip"), f"README.md:{block.line}: a {block.lang} block without a marker"
        if block.marker == "skip":
            assert len(block.detail) > 10, f"README.md:{block.line}: say why the block is skipped"
        if block.marker == "output":
            before = BLOCKS[BLOCKS.index(block) - 1]
            assert before.marker == "run", f"README.md:{block.line}: an output block must follow a run block"
    assert sum(b.marker == "run" for b in BLOCKS) >= 3


def _path_with_the_commands(bin_dir: Path) -> dict[str, str]:
    """An environment whose PATH finds `mxconvert` and `python` as .venv/bin would (this checkout's
    package, this interpreter), offline, with no CI progress lines."""
    bin_dir.mkdir()
    for name, run in (("mxconvert", "-m mxconvert"), ("python", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {run} "$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "COLUMNS") and not k.startswith("VLLM_")}
    return env | {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HOME": str(bin_dir.parent),
    }


def _expected_lines(output: Block) -> list[str]:
    """The lines an output block shows, with the README's placeholder for the clone's path."""
    return [line.replace("/path/to/mxconvert/", f"{ROOT}/") for line in output.text.splitlines() if line.strip()]


def test_readme_commands_run_as_written(tmp_path):
    """Each run block, in README order, in one folder (a later block uses what an earlier one wrote),
    as `bash -e`: every command must succeed, and the output block after it must match."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = _path_with_the_commands(tmp_path / "bin")
    ran = 0
    for i, block in enumerate(BLOCKS):
        if block.marker != "run":
            continue
        block_env = env | dict(pair.split("=", 1) for pair in block.detail.split())
        proc = subprocess.run(
            ["bash", "-e", "-c", block.text], cwd=work, env=block_env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"README.md:{block.line} failed:\n{block.text}\n{proc.stdout}\n{proc.stderr}"
        ran += 1
        following = BLOCKS[i + 1] if i + 1 < len(BLOCKS) else None
        if following is not None and following.marker == "output":
            printed = {line.rstrip() for line in proc.stdout.splitlines()}
            missing = [line for line in _expected_lines(following) if line.rstrip() not in printed]
            assert not missing, f"README.md:{following.line}: not printed as shown: {missing}\n{proc.stdout}"
    assert ran >= 3
    # what the CI block wrote is what it says: documents whose schema and status CI can check
    assert '"schema": "mxconvert.convert/1"' in (work / "convert.json").read_text()
    assert '"ok": true' in (work / "verify.json").read_text()


@pytest.mark.parametrize("block", SKIPPED, ids=[f"README.md:{b.line}" for b in SKIPPED])
def test_blocks_that_need_the_network_or_a_gpu(block):
    """Listed so that a run names each block it does not run, and why."""
    pytest.skip(f"README.md:{block.line} not run here: {block.detail}")


def test_install_lines_name_what_a_user_can_install():
    """mxconvert is not published on PyPI: every `pip install` names the clone (`.`, `-e .`, a wheel
    built from it) or a published dependency, never `mxconvert` from the index."""
    pip_lines = [
        line
        for block in BLOCKS
        if block.lang == "sh"
        for line in block.text.splitlines()
        if re.match(r"\s*pip (install|wheel)\b", line)
    ]
    assert pip_lines
    for line in pip_lines:
        command = line.split("#", 1)[0]
        assert not re.search(r"""(^|\s)['"]?mxconvert\b""", command.split(" ", 2)[2]), line
    assert any(re.search(r"pip install -e '?\.", line) for line in pip_lines)
    assert any("pip wheel . " in line for line in pip_lines)


def test_after_make_demo_the_readme_says_how_to_run_mxconvert():
    """`make demo` / `make setup` install the package into .venv (the Makefile's VENV), whose bin
    holds the `mxconvert` script pyproject declares; the README names that command."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^VENV := \.venv$", makefile, re.M) and re.search(r"^demo: \$\(STAMP\)$", makefile, re.M)
    assert "$(BIN)/pip install -q -e '.[dev]'" in makefile
    assert 'mxconvert = "mxconvert._entry:main"' in (ROOT / "pyproject.toml").read_text()
    readme = README.read_text()
    first = BLOCKS[0]
    assert "make demo" in first.text and ".venv/bin/mxconvert" in first.text
    assert "the command is `.venv/bin/mxconvert`" in readme and "source .venv/bin/activate" in readme
