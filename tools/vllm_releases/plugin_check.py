#!/usr/bin/env python3
"""Run the vLLM plugin's path A = path B tests in vLLM releases and record the outcome, per release.

    python tools/vllm_releases/plugin_check.py 0.27.0 0.30.0       # or: --all (PLUGIN_PROVEN's MXFP4 releases)
    python tools/vllm_releases/plugin_check.py --all --base /path/to/.venv-vllm
    python tools/vllm_releases/plugin_check.py --format nvfp4 --all  # NVFP4: test_release_rows_nvfp4.py

For each release it builds (or reuses) the release's thin CPU venv (tools/vllm_env/release_env.sh: the
release's and its FlashInfer's Python files over the 0.33.0 base venv `--base`, default .venv-vllm;
for 0.33.0 the base itself), runs the format's test module there (`TEST_MODULES`: MXFP4
tests_vllm/test_release_rows.py, NVFP4 tests_vllm/test_release_rows_nvfp4.py) with this checkout's
mxconvert first on the path, and writes tests/golden/plugin/vllm-X.Y.Z-FORMAT.json: the release, the
row `--runtime vllm==X.Y.Z` writes for that format, each test with its outcome, the counts, the
mxconvert commit and the date. The records are committed; tests/test_plugin_records.py holds
`PLUGIN_PROVEN`'s releases of each format to exactly those whose record of that format passed.

The tests run only where `PLUGIN_PROVEN` (mxconvert/runtimes/vllm/dependency.py) lists the release
(the plugin refuses every other release, and tests_vllm/conftest.py skips test modules not written
for the venv's release): to check a new release, add it to its row there (and its row's adapter to
mxconvert/runtimes/vllm/adapters.py), run this tool, and keep the entry only if its record passed.
A release whose tests did not run (all skipped, or a session error) is recorded as not passed.
The envs stay in --envs (default /tmp/vllm-plugin-envs, 250-400 MB each, made in 2-8 s from cached
wheels) for the next run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "golden" / "plugin"
#: format -> the path A = path B test module run in each release of that format
TEST_MODULES = {"mxfp4": "tests_vllm/test_release_rows.py", "nvfp4": "tests_vllm/test_release_rows_nvfp4.py"}
#: format -> a second module run after the first, recorded in the record's "backends" section (its skips, each
#: with its reason, are allowed): MXFP4's other backends and EP 2 (tests_vllm/test_release_rows_backends.py)
BACKEND_MODULES = {"mxfp4": "tests_vllm/test_release_rows_backends.py"}
#: the checkpoints each format's tests load, for the messages
CHECKPOINTS = {"mxfp4": "GPT-OSS MXFP4", "nvfp4": "NVFP4"}


def _mxconvert(code: str) -> str:
    """Evaluate `code` with this checkout's mxconvert (the repository's own .venv need not be the caller)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    return done.stdout.strip()


def proven_releases(fmt: str) -> list[str]:
    """The releases `PLUGIN_PROVEN` lists for `fmt` (the records must show each passing)."""
    return json.loads(
        _mxconvert(
            "import json; from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN; "
            "from mxconvert.target.releases import release_key; "
            f"print(json.dumps(sorted({{r for f in PLUGIN_PROVEN.values() for r in f.get({fmt!r}, ())}}, "
            "key=release_key)))"
        )
    )


def covered_releases(fmt: str) -> list[str]:
    """Every release a row covers for `fmt` (mxconvert/target/releases.py), oldest first."""
    return json.loads(
        _mxconvert(
            "import json; from mxconvert.target.releases import covered; "
            f"print(json.dumps([r for r, _ in covered({fmt!r})]))"
        )
    )


def row_of(release: str, fmt: str) -> str:
    return _mxconvert(
        f"from mxconvert.target.releases import row_for_release; print(row_for_release({release!r}, {fmt!r}).name)"
    )


def release_python(release: str, base: Path, envs: Path) -> Path:
    """The release's venv python (tools/vllm_env/release_env.sh; the base itself for 0.33.0)."""
    if release == "0.33.0":
        return base / "bin" / "python"
    venv = envs / release
    env = dict(os.environ, VLLM_VERSION=release, VLLM_VENV=str(venv), VLLM_BASE_VENV=str(base))
    subprocess.run(["bash", str(REPO / "tools" / "vllm_env" / "release_env.sh")], check=True, env=env)
    return venv / "bin" / "python"


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from pytest's JUnit XML."""
    found: dict[str, str] = {}
    if not junit.exists():
        return found
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            outcome = "failed"
        elif "error" in kinds:
            outcome = "error"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # a test that passed and then errored in teardown is listed twice: the worse outcome stays
        if found.get(name) in (None, "passed", "skipped"):
            found[name] = outcome
    return found


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=REPO)
    # the records this tool rewrites (tests/golden/plugin/) are its output, not the code that ran
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":!{OUT.relative_to(REPO)}"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_backends(python: Path, fmt: str, tmp: Path, run_env: dict) -> dict | None:
    """The format's `BACKEND_MODULES` run, as the record's "backends" section: each test's outcome, the counts,
    and "passed" where it ran with no failure or error (skips name their reason in the module)."""
    module = BACKEND_MODULES.get(fmt)
    if module is None:
        return None
    junit = tmp / "junit-backends.xml"
    cmd = [str(python), "-m", "pytest", module, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=run_env)
    tests = outcomes(junit)
    counts = {k: sum(1 for v in tests.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
    passed = done.returncode == 0 and counts["passed"] > 0 and counts["failed"] == counts["error"] == 0
    if not passed:
        sys.stdout.write(done.stdout[-3000:] + done.stderr[-2000:])
    return {
        "test_module": module,
        "tests": dict(sorted(tests.items())),
        **counts,
        "pytest_exit": done.returncode,
        "result": "passed" if passed else "not passed",
        "seconds": round(time.monotonic() - started),
    }


def check(release: str, fmt: str, base: Path, envs: Path) -> Path:
    test_module = TEST_MODULES[fmt]
    started = time.monotonic()
    python = release_python(release, base, envs)
    built = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plugin-check-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [str(python), "-m", "pytest", test_module, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        run_env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="ERROR")
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=run_env)
        tests = outcomes(junit)
        backends = run_backends(python, fmt, Path(tmp), run_env)
    ran = time.monotonic()
    counts = {k: sum(1 for v in tests.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
    passed = done.returncode == 0 and counts["passed"] > 0 and counts["failed"] == counts["error"] == 0
    passed = passed and (backends is None or backends["result"] == "passed")
    doc = {
        "about": (
            f"The mxconvert vLLM plugin's path A = path B tests ({test_module}) run in vLLM {release}'s thin CPU "
            "venv (made by tools/vllm_releases/plugin_check.py; docs/vllm-plugin.md)"
        ),
        "release": release,
        "format": fmt,
        "row": row_of(release, fmt),
        "test_module": test_module,
        "tests": dict(sorted(tests.items())),
        **counts,
        "pytest_exit": done.returncode,
        "result": "passed" if passed else "not passed",
        **({"backends": backends} if backends is not None else {}),
        "mxconvert_commit": commit(),
        "date": datetime.date.today().isoformat(),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"vllm-{release}-{fmt}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"vLLM {release} ({doc['row']}): {doc['result']}: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors, {counts['skipped']} skipped; env {built - started:.0f} s, tests {ran - built:.0f} s"
        f" -> {path.relative_to(REPO)}"
    )
    if not passed:
        sys.stdout.write(done.stdout[-3000:] + done.stderr[-2000:])
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("releases", nargs="*", help="X.Y.Z ...")
    ap.add_argument("--all", action="store_true", help="every release PLUGIN_PROVEN lists for the format")
    ap.add_argument("--format", choices=tuple(TEST_MODULES), default="mxfp4", help="the checkpoint format (mxfp4)")
    ap.add_argument(
        "--base", type=Path, default=REPO / ".venv-vllm", help="the 0.33.0 base venv (tools/vllm_env/setup.sh)"
    )
    ap.add_argument("--envs", type=Path, default=Path("/tmp/vllm-plugin-envs"), help="where the release venvs live")
    args = ap.parse_args(argv)
    known = covered_releases(args.format)
    releases = proven_releases(args.format) if args.all else args.releases
    if not releases:
        ap.error("name releases or pass --all")
    unknown = [r for r in releases if r not in known]
    if unknown:
        what = CHECKPOINTS[args.format]
        ap.error(f"not covered for {what}: {', '.join(unknown)} (covered: {', '.join(known)})")
    for release in releases:
        check(release, args.format, args.base.absolute(), args.envs.absolute())
    return 0


if __name__ == "__main__":
    sys.exit(main())
