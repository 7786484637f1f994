"""Tests of the vLLM plugin against vLLM 0.33.0 itself (run in .venv-vllm, see tools/vllm_env)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's CPU platform (no GPU in CI)
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]


class Artifacts:
    """`mxconvert convert` of the example checkpoint, once per distinct command line."""

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[tuple, Path] = {}

    def get(self, profile: str, *args: str, source: Path | None = None) -> Path:
        key = (profile, args, str(source))
        if key not in self.made:
            out = self.root / f"art{len(self.made)}"
            cmd = [
                sys.executable,
                "-m",
                "mxconvert",
                "convert",
                str(source or REPO / "examples" / "tiny-gpt-oss"),
                "--profile",
                profile,
                *args,
                "-o",
                str(out),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            assert done.returncode == 0, done.stdout + done.stderr
            self.made[key] = out
        return self.made[key]

    def nvfp4(self, checkpoint: str, profile: str, *args: str, tps: tuple[str, ...] = ("1", "2")) -> Path:
        """`mxconvert convert` of an NVFP4 example, by default for TP=1 and TP=2 at once
        (OUT/<profile>-tp<N>/), run in this process (the NVFP4 tests make a dozen artifacts; a process
        each costs seconds)."""
        return self.in_process(REPO / "examples" / f"tiny-nvfp4-{checkpoint}-qwen3", profile, *args, tps=tps)

    def in_process(self, source: Path, profile: str, *args: str, tps: tuple[str, ...] = ("1", "2")) -> Path:
        """`mxconvert convert SOURCE` for each TP size in `tps` at once, in this process."""
        from typer.testing import CliRunner

        from mxconvert.cli.main import app

        key = ("in_process", str(source), profile, args, tps)
        if key not in self.made:
            out = self.root / f"art{len(self.made)}"
            tp_args = [a for tp in tps for a in ("--tp", tp)]
            done = CliRunner().invoke(
                app,
                ["convert", str(source), "--profile", profile, *tp_args, *args, "-o", str(out)],
                catch_exceptions=False,
            )
            assert done.exit_code == 0, done.output
            self.made[key] = out
        return self.made[key]


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    return Artifacts(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture
def opened(monkeypatch):
    """Every safetensors file the plugin opens (through mxconvert's reader or vLLM's iterator)."""
    import mxconvert.runtimes.vllm.installer as inst
    import mxconvert.storage.safetensors_io as sio

    seen: list[str] = []
    original = sio.ShardReader.__init__

    def spy(self, path, *a, **k):
        seen.append(str(path))
        return original(self, path, *a, **k)

    monkeypatch.setattr(sio.ShardReader, "__init__", spy)
    original_shared = inst.iter_shared
    monkeypatch.setattr(inst, "iter_shared", lambda files: (seen.extend(files), original_shared(files))[1])
    return seen


@pytest.fixture(scope="session", autouse=True)
def triton_kernels_module():
    """vLLM's own import: its vendored triton_kernels (v3.5.1) as the top-level `triton_kernels`."""
    from vllm.utils.import_utils import get_triton_kernels_version, import_triton_kernels

    import_triton_kernels()
    assert get_triton_kernels_version() == "3.5.1"
