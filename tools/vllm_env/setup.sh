#!/usr/bin/env bash
# Build .venv-vllm: vLLM 0.33.0 CPU-only, for the vLLM plugin tests (tests_vllm/).
#
# vLLM's wheel is installed with --no-deps (its requirements would pull a CUDA torch), together with
# the pure-Python modules `import vllm.model_executor...` asks for at load time, FlashInfer 0.7.2.post1
# (the version vLLM 0.33.0 pins; its layout helpers run on CPU), triton 3.9.0 (imported by the
# triton_kernels copy vLLM vendors) and mxconvert itself, editable, so that its
# `vllm.general_plugins` entry point is registered. torch is pinned: never let a resolver pick one.
# For the ROCm tests (tests_vllm/test_rocm.py): the one pure-torch file `aiter/ops/shuffle.py` of the
# amd-aiter 0.1.7.post2.dev18 wheel (AITER's weight/scale shuffles; `import aiter` itself needs ROCm),
# extracted to $VENV/aiter-0.1.7.post2.dev18/ -- NOT on sys.path, the harness loads it by file.
# Idempotent: a stamp over this file skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
WHEELS=${MXCONVERT_WHEEL_CACHE:-$HOME/.cache/mxconvert-wheels}
STAMP="$VENV/.installed-$(cat "$0" pyproject.toml | cksum | cut -d' ' -f1)"
[ -f "$STAMP" ] && exit 0
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
$PIP install -q torch==2.13.0
mkdir -p "$WHEELS"
ls "$WHEELS"/vllm-0.33.0-*.whl >/dev/null 2>&1 || $PIP download -q --no-deps vllm==0.33.0 -d "$WHEELS"
$PIP install -q --no-deps "$WHEELS"/vllm-0.33.0-*.whl
$PIP install -q --no-deps flashinfer-python==0.7.2.post1 triton==3.9.0 -r tools/vllm_env/requirements.txt
$PIP install -q --no-deps -e .
$PIP install -q pytest numpy
AITER=amd_aiter-0.1.7.post2.dev18-py3-none-any.whl
ls "$WHEELS/$AITER" >/dev/null 2>&1 || $PIP download -q --no-deps --pre amd-aiter==0.1.7.post2.dev18 -d "$WHEELS"
"$VENV/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('aiter/ops/shuffle.py', sys.argv[2])" \
    "$WHEELS/$AITER" "$VENV/aiter-0.1.7.post2.dev18"
rm -f "$VENV"/.installed-*
touch "$STAMP"
