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
            cmd = [sys.executable, "-m", "mxconvert", "convert", str(source or REPO / "examples" / "tiny-gpt-oss"),
                   "--profile", profile, *args, "-o", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            assert done.returncode == 0, done.stdout + done.stderr
            self.made[key] = out
        return self.made[key]


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    return Artifacts(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture(scope="session", autouse=True)
def triton_kernels_module():
    """vLLM's own import: its vendored triton_kernels (v3.5.1) as the top-level `triton_kernels`."""
    from vllm.utils.import_utils import get_triton_kernels_version, import_triton_kernels

    import_triton_kernels()
    assert get_triton_kernels_version() == "3.5.1"
