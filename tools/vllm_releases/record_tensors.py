#!/usr/bin/env python3
"""Record, per vLLM release, a digest of every tensor its own weight processing lays out on CPU.

    python tools/vllm_releases/record_tensors.py mxfp4 0.26.0 0.33.0     # or: nvfp4 ...; or: all
    python tools/vllm_releases/record_tensors.py mxfp4 --all

For each release it builds (once, shared with the selection records' tools) a CPU environment

    python3.11 -m venv --without-pip /tmp/vllm-envs/X.Y.Z          (under flock X.Y.Z.lock)
    pip --python ... install --no-deps --no-compile <cached vllm wheel>
    zz_deps.pth -> the 0.33.0 environment's site-packages (torch, triton, ...; tools/vllm_env/setup.sh;
                   $MXCONVERT_VLLM_BASE_SITE, default .venv-vllm/lib/python3.11/site-packages here)

plus, in /tmp/vllm-envs/extras/ (flock extras.lock), the FlashInfer release the wheel pins
(`pip install --no-deps --target`), put first on PYTHONPATH so the release runs the Python of its
own FlashInfer, and the few pure-Python modules old releases import that 0.33.0's environment
lacks. Then it runs tools/golden/release_<format>_tensors.py in that environment and writes
tests/golden/tensors/vllm-X.Y.Z-<format>.json: per (backend, device family, shape[, rank]) the
padded sizes, the canonical inputs' sha256, and per laid-out tensor its dtype, shape and sha256
(entries a CUDA op without a recorded GPU result would decide say "unrecorded"). See
docs/releases.md, "Tensor records".

Which rows' bytes each record equals: tools/vllm_releases/tensor_table.py (run with the repository's
.venv; it also writes tests/golden/tensors/expected_rows.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "golden" / "tensors"
RECORDS = Path(__file__).resolve().parent / "records"
WHEELS = Path(os.environ.get("MXCONVERT_WHEEL_CACHE", Path.home() / ".cache" / "mxconvert-wheels"))
ENVS = Path(os.environ.get("MXCONVERT_VLLM_ENVS", "/tmp/vllm-envs"))
BASE_SITE = Path(
    os.environ.get("MXCONVERT_VLLM_BASE_SITE", REPO / ".venv-vllm" / "lib" / "python3.11" / "site-packages")
)
PIP = [sys.executable, "-m", "pip"]
#: pure-Python modules some releases import at load time that the 0.33.0 environment lacks
EXTRA_DEPS = ("gguf",)
#: NVIDIA's CUTLASS DSL: FlashInfer's CuteDSL helpers (`convert_sf_to_mma_layout`, pure torch) sit in a
#: module that imports it; the version vLLM 0.33.0 pins, CPU-importable with the CUDA 12 libs
CUTLASS_DSL = "4.8.0"
CUTLASS_DSL_REQS = (
    f"nvidia-cutlass-dsl=={CUTLASS_DSL}",
    f"nvidia-cutlass-dsl-libs-base=={CUTLASS_DSL}",
    f"nvidia-cutlass-dsl-libs-core=={CUTLASS_DSL}",
    f"nvidia-cutlass-dsl-libs-cu12=={CUTLASS_DSL}",
    "cuda-bindings==12.9.10",
    "cuda-pathfinder==1.9.1",
)
CUTLASS_DSL_WHEELS = (
    f"nvidia_cutlass_dsl-{CUTLASS_DSL}-py3-none-any.whl",
    f"nvidia_cutlass_dsl_libs_base-{CUTLASS_DSL}-cp311-cp311-manylinux_2_28_x86_64.whl",
    f"nvidia_cutlass_dsl_libs_core-{CUTLASS_DSL}-py3-none-any.whl",
    f"nvidia_cutlass_dsl_libs_cu12-{CUTLASS_DSL}-cp311-cp311-manylinux_2_28_x86_64.whl",
    "cuda_bindings-12.9.10-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    "cuda_pathfinder-1.9.1-py3-none-any.whl",
)
AITER_WHEEL = "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
RUNNERS = {"mxfp4": "release_mxfp4_tensors.py", "nvfp4": "release_nvfp4_tensors.py"}
#: releases each format is recorded for (issue 22: MXFP4 from 0.19.0, NVFP4 from 0.15.0)
FIRST = {"mxfp4": "0.19.0", "nvfp4": "0.15.0"}


def key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def known_releases(fmt: str) -> list[str]:
    """Every release with a decision-symbol record (tools/vllm_releases/records/), from FIRST[fmt]."""
    names = [p.stem.removeprefix("vllm-") for p in RECORDS.glob("vllm-*.json")]
    return sorted((r for r in names if key(r) >= key(FIRST[fmt])), key=key)


def flashinfer_pin(release: str) -> str:
    pin = json.loads((RECORDS / f"vllm-{release}.json").read_text())["pins"]["flashinfer-python"]
    if not pin or not pin.startswith("=="):
        raise SystemExit(f"vLLM {release}: no exact flashinfer-python pin in its record ({pin!r})")
    return pin[2:]


def _locked(lock: Path, script: str) -> None:
    subprocess.run(["flock", str(lock), "bash", "-c", script], check=True)


def release_env(release: str) -> Path:
    """The release's environment (made if missing; same recipe and folder as the selection tools)."""
    env = ENVS / release
    ENVS.mkdir(parents=True, exist_ok=True)
    wheels = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
    if not wheels:
        raise SystemExit(f"no cached wheel for vLLM {release} in {WHEELS} (tools/vllm_releases/record.py downloads it)")
    site = env / "lib" / "python3.11" / "site-packages"
    script = (
        f"set -e; if ! ls {site}/vllm-{release}.dist-info >/dev/null 2>&1; then "
        f"python3.11 -m venv --without-pip {env}; "
        f"{' '.join(PIP)} --python {env}/bin/python install -q --no-deps --no-compile {wheels[0]}; fi; "
        f"test -f {site}/zz_deps.pth || echo {BASE_SITE} > {site}/zz_deps.pth"
    )
    _locked(ENVS / f"{release}.lock", script)
    return env


def extras(flashinfer: str) -> tuple[Path, Path, Path, Path]:
    """(FlashInfer `version` target folder, extra deps folder, aiter shuffle.py, CUTLASS DSL site
    folder), made if missing."""
    root = ENVS / "extras"
    fi_dir, deps, aiter = (
        root / f"flashinfer-{flashinfer}",
        root / "deps",
        root / "aiter" / "aiter" / "ops" / "shuffle.py",
    )
    root.mkdir(parents=True, exist_ok=True)
    fi_wheels = sorted(WHEELS.glob(f"flashinfer_python-{flashinfer}-*.whl"))
    fetch = "" if fi_wheels else f"{' '.join(PIP)} download -q --no-deps flashinfer-python=={flashinfer} -d {WHEELS}; "
    script = (
        f"set -e; {fetch}"
        f"test -d {fi_dir}/flashinfer || {' '.join(PIP)} install -q --no-deps --no-compile --target {fi_dir} "
        f"{WHEELS}/flashinfer_python-{flashinfer}-*.whl; "
        f"test -d {deps}/gguf || {' '.join(PIP)} install -q --no-deps --target {deps} {' '.join(EXTRA_DEPS)}"
    )
    cutlass = root / f"cutlass-dsl-{CUTLASS_DSL}"
    wheels = " ".join(f"{WHEELS}/{w}" for w in CUTLASS_DSL_WHEELS)
    script += (
        f"; if ! test -d {cutlass}/nvidia_cutlass_dsl; then "
        f"ls {wheels} >/dev/null 2>&1 || "
        f"{' '.join(PIP)} download -q --no-deps {' '.join(CUTLASS_DSL_REQS)} -d {WHEELS}; "
        f"{' '.join(PIP)} install -q --no-deps --no-compile --target {cutlass} {wheels}; fi"
    )
    _locked(root / "extras.lock", script)
    if not aiter.exists():
        aiter_wheel = WHEELS / AITER_WHEEL
        if not aiter_wheel.exists():
            raise SystemExit(f"{aiter_wheel} missing (tools/vllm_env/setup.sh downloads it)")
        zipfile.ZipFile(aiter_wheel).extract("aiter/ops/shuffle.py", root / "aiter")
    return fi_dir, deps, aiter, cutlass


def run_release(fmt: str, release: str) -> dict:
    env = release_env(release)
    pin = flashinfer_pin(release)
    fi_dir, deps, aiter, cutlass = extras(pin)
    cmd = [str(env / "bin" / "python"), str(REPO / "tools" / "golden" / RUNNERS[fmt])]
    cmd += ["--flashinfer", pin, "--aiter-shuffle", str(aiter), "--site-dir", str(cutlass)]
    run_env = dict(os.environ, PYTHONPATH=f"{fi_dir}:{deps}", VLLM_LOGGING_LEVEL="ERROR", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env, cwd="/tmp")
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"vLLM {release} {fmt}: the release run failed (exit {proc.returncode})")
    result = json.loads(proc.stdout)
    if result["vllm"] != release:
        raise SystemExit(f"vLLM {release}: the environment imported vLLM {result['vllm']}")
    return result


def input_key(case: dict) -> str:
    """The key of a case's canonical inputs in a record's `inputs` table."""
    dims = "_".join(f"{k}{case[k]}" for k in ("E", "H", "I", "Hp", "Ip", "K", "N") if k in case)
    return (
        f"{dims}_s{case['seed']}"
        + ("_w4a16" if case.get("w4a16") else "")
        + ("_ungated" if case.get("gated") is False else "")
    )


def compact(cases: list[dict]) -> tuple[dict, list[dict]]:
    """Move every case's `canonical_sha256` into one `inputs` table (many cases share inputs)."""
    inputs: dict[str, dict] = {}
    out = []
    for case in cases:
        case = dict(case)
        digests = case.pop("canonical_sha256", None)
        if digests is not None:
            k = input_key(case)
            if inputs.setdefault(k, digests) != digests:
                raise SystemExit(f"two cases with inputs {k} hold different canonical inputs")
            case["inputs"] = k
        out.append(case)
    return inputs, out


def record(fmt: str, release: str) -> Path:
    result = run_release(fmt, release)
    inputs, cases = compact(result.pop("cases"))
    result["cases"] = cases
    result["inputs"] = inputs
    doc = {
        "about": (
            f"Digests of the tensors vLLM {release}'s own {fmt.upper()} weight processing lays out on CPU "
            "(made by tools/vllm_releases/record_tensors.py; docs/releases.md, 'Tensor records')"
        ),
        "release": release,
        "format": fmt,
        **{k: v for k, v in result.items() if k != "cases"},
        "cases": result["cases"],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"vllm-{release}-{fmt}.json"
    lines = ",\n".join("  " + json.dumps(c, sort_keys=True) for c in doc["cases"])
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1, sort_keys=True)[:-2]
    path.write_text(head + ',\n "cases": [\n' + lines + "\n ]\n}\n")
    bad = [c for c in doc["cases"] if "error" in c]
    unrec = [c for c in doc["cases"] if "unrecorded" in c]
    print(f"{path.relative_to(REPO)}: {len(doc['cases'])} cases, {len(unrec)} unrecorded, {len(bad)} errors")
    for c in bad:
        print(f"  error {c['backend']} {c['target_key']} {c['shape']}: {c['error']}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("format", choices=sorted(RUNNERS))
    ap.add_argument("releases", nargs="*", help="X.Y.Z ...")
    ap.add_argument("--all", action="store_true", help="every release with a decision-symbol record, from FIRST")
    args = ap.parse_args(argv)
    releases = known_releases(args.format) if args.all else args.releases
    if not releases:
        ap.error("name releases or pass --all")
    for release in releases:
        record(args.format, release)
    return 0


if __name__ == "__main__":
    sys.exit(main())
