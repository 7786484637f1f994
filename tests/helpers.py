"""Small helpers shared by the CLI tests."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from mxconvert.cli import app
from mxconvert.dtypes import torch_dtype

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt-oss"


def run_cli(*args: str, env: dict | None = None):
    """Run the CLI in-process; returns the click Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


def run_cli_subprocess(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "mxconvert", *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=ROOT)


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path (to prove nothing changed)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


def load_json(text: str):
    return json.loads(text)


def torch_specs(specs: dict) -> dict:
    """Canonical specs (dtype by name, as planning gives them) with torch dtypes, to build tensors from."""
    return {name: (torch_dtype(dtype), shape) for name, (dtype, shape) in specs.items()}
