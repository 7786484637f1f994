"""Small helpers shared by the CLI tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from mxconvert.cli.main import app
from mxconvert.core.dtypes import torch_dtype

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt-oss"


def flip_stored_bits(path: Path, key: str, offset: int, mask: int) -> None:
    """XOR byte `offset` of tensor `key`'s data in the safetensors file `path` with `mask`."""
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    begin = json.loads(bytes(data[8:header]))[key]["data_offsets"][0]
    data[header + begin + offset] ^= mask
    path.write_bytes(bytes(data))


def rewrite_source_tensor(src: Path, key: str, change):
    """Replace tensor `key` of the checkpoint folder `src` by `change(tensor)` in its shard; the new tensor."""
    from safetensors.torch import load_file, save_file

    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][key]
    tensors = load_file(shard)
    tensors[key] = change(tensors[key])
    save_file(tensors, shard, metadata={"format": "pt"})
    return tensors[key]


def rank_tensor(artifact: Path, name: str) -> tuple[str, Path]:
    """(key, file) of the first rank-0 tensor of the artifact whose canonical name is `name`."""
    rank = json.loads((artifact / "mxconvert.json").read_text())["ranks"][0]
    key = next(k for k, v in rank["tensors"].items() if v["name"] == name)
    return key, artifact / rank["tensors"][key]["file"]


def run_cli(*args: str, env: dict | None = None):
    """Run the CLI in-process; returns the click Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


def run_cli_subprocess(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "mxconvert", *map(str, args)], capture_output=True, text=True, env=full_env, cwd=ROOT
    )


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path (to prove nothing changed)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def load_json(text: str):
    return json.loads(text)


def torch_specs(specs: dict) -> dict:
    """Canonical specs (dtype by name, as planning gives them) with torch dtypes, to build tensors from."""
    return {name: (torch_dtype(dtype), shape) for name, (dtype, shape) in specs.items()}


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (from the repository root).

    The list is printed on a marked last line and only that line is read: the code's own output (a
    command's text may hold words such as "torch", e.g. a backend's reason) is not taken for module names.
    """
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('MODULES: ' + ' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    last = out.stdout.splitlines()[-1]
    assert last.startswith("MODULES: "), out.stdout[-500:]
    return set(last.removeprefix("MODULES: ").split())
