"""A Python environment holding one vLLM release's Python files, for running its own code on CPU.

    /tmp/vllm-envs/X.Y.Z/bin/python    (VLLM_ENVS overrides the folder)

Made from the cached wheel (~/.cache/mxconvert-wheels, as record.py downloads it) by
`pip install --no-deps --no-compile`; the wheel's compiled libraries (*.so, CUDA builds) are then
deleted, since nothing compiled runs on CPU and they are most of the size (~700 MB -> ~140 MB). A
`.pth` file appends .venv-vllm's site-packages (tools/vllm_env/setup.sh: vLLM 0.33.0's CPU
dependencies, torch included), so the release's own `vllm` package comes first and its imports
find torch and the rest there. Creation runs under `flock X.Y.Z.lock` (other tools share the
folder) and ends by writing `.complete`; an environment without it is made again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = Path(os.environ.get("VLLM_ENVS", "/tmp/vllm-envs"))
WHEELS = Path(os.environ.get("MXCONVERT_WHEEL_CACHE", Path.home() / ".cache" / "mxconvert-wheels"))
#: .venv-vllm's site-packages (tools/vllm_env/setup.sh); MXCONVERT_VLLM_DEPS names another one (a
#: git worktree has no .venv-vllm of its own).
DEPS = Path(os.environ.get("MXCONVERT_VLLM_DEPS", REPO / ".venv-vllm" / "lib" / "python3.11" / "site-packages"))
#: Imported at start-up by vLLM releases before 0.24 (vllm/transformers_utils/gguf_utils.py), absent
#: from .venv-vllm; the version is 0.19.0's `gguf>=0.17.0`.
EXTRA = ("gguf==0.17.1",)
#: Bumped when the recipe changes: an environment made by another recipe is made again.
RECIPE = "2"


def _wheel(release: str) -> Path:
    found = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
    if not found:
        raise SystemExit(f"no cached wheel for vLLM {release} in {WHEELS}: run tools/vllm_releases/record.py {release}")
    return found[0]


def ensure(release: str) -> Path:
    """The python of the release's environment, made first when missing or incomplete."""
    folder = ENVS / release
    python = folder / "bin" / "python"
    ENVS.mkdir(parents=True, exist_ok=True)
    with open(ENVS / f"{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = folder / ".complete"
        if stamp.exists() and stamp.read_text().split() == [release, RECIPE] and python.exists():
            return python
        deps = DEPS
        if not deps.is_dir():
            raise SystemExit(
                f"no .venv-vllm site-packages at {DEPS}: run tools/vllm_env/setup.sh (or set MXCONVERT_VLLM_DEPS)"
            )
        site = folder / "lib" / "python3.11" / "site-packages"
        pip = [str(deps.parents[2] / "bin" / "python"), "-m", "pip", "--python", str(python)]
        if python.exists() and (site / f"vllm-{release}.dist-info").is_dir():
            # the release is there (an older recipe, or another tool's): add what this recipe adds
            subprocess.run([*pip, "install", "-q", "--no-deps", "--no-compile", *EXTRA], check=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run(["python3.11", "-m", "venv", "--without-pip", str(folder)], check=True)
            wheel = str(_wheel(release))
            subprocess.run([*pip, "install", "-q", "--no-deps", "--no-compile", wheel, *EXTRA], check=True)
        for lib in site.rglob("*.so"):
            lib.unlink()
        (site / "zz_deps.pth").write_text(f"{deps}\n")
        stamp.write_text(f"{release} {RECIPE}\n")
    return python
