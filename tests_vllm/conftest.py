"""Tests of the vLLM plugin against vLLM itself (tools/vllm_env builds one CPU venv per release:
.venv-vllm for 0.33.0, .venv-vllm-0.26 for 0.26.0).

Every test module declares the vLLM releases its tests run against, `VLLM_RELEASES = ("0.33.0",)`;
`pytest tests_vllm` in a venv runs the modules that name the installed release and skips the others
(a module that declares none is an error), so either venv runs exactly what applies to it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's CPU platform (no GPU in CI)
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]


def installed_release() -> str | None:
    """The vLLM release of this venv (its package metadata, a local build label dropped)."""
    try:
        return importlib.metadata.version("vllm").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def pytest_collection_modifyitems(config, items):
    """Skip the tests of modules written for another vLLM release than this venv's."""
    live = installed_release()
    for item in items:
        module = getattr(item, "module", None)
        wanted = getattr(module, "VLLM_RELEASES", None)
        if wanted is None:
            raise pytest.UsageError(f"{item.nodeid}: its module declares no VLLM_RELEASES (the vLLM releases it needs)")
        if live not in wanted:
            item.add_marker(pytest.mark.skip(reason=f"needs vLLM {' or '.join(wanted)}; this venv has vLLM {live}"))


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
def vllm_platform():
    """Releases before 0.28.0 have no `VLLM_TARGET_DEVICE=cpu` detection: their CpuPlatform is put in
    place (harness_rows.use_cpu_platform); later releases detect it from the variable set above."""
    import harness_rows

    harness_rows.use_cpu_platform()


@pytest.fixture(scope="session", autouse=True)
def triton_kernels_module(vllm_platform):
    """vLLM's own import: its vendored triton_kernels (v3.5.1; v3.6 in 0.20.0-0.21.0) as the top-level
    `triton_kernels`; the generation as the plugin reads it for the installed release (adapters.py)."""
    from vllm.utils.import_utils import import_triton_kernels

    from mxconvert.runtimes.vllm.adapters import live_adapter

    import_triton_kernels()
    import harness_rows

    assert live_adapter().triton_kernels_generation() == harness_rows.vendored_triton_kernels()
