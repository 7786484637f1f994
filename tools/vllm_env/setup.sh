#!/usr/bin/env bash
# Build a CPU-only vLLM venv for the vLLM plugin tests (tests_vllm/), for one vLLM release:
#
#   bash tools/vllm_env/setup.sh                                     # vLLM 0.33.0 in .venv-vllm
#   VLLM_VERSION=0.26.0 bash tools/vllm_env/setup.sh                 # vLLM 0.26.0 in .venv-vllm-0.26
#   VLLM_VERSION=0.26.0 VLLM_VENV=somewhere bash tools/vllm_env/setup.sh
#   VLLM_VERSION=0.27.0 bash tools/vllm_env/setup.sh                 # any release 0.19.0 .. 0.32.0
#
# Every release but 0.33.0 gets a thin venv over .venv-vllm (tools/vllm_env/release_env.sh: only the
# release's and its FlashInfer's Python files; torch and the rest from .venv-vllm). For 0.33.0:
# vLLM's wheel is installed with --no-deps (its requirements would pull a CUDA torch), together with
# the pure-Python modules `import vllm.model_executor...` asks for at load time (requirements.txt,
# the same pins for every release: the plugin tests ran with them), the FlashInfer the release pins
# (its layout helpers run on CPU; Python only, --no-deps), triton 3.9.0 (imported by the
# triton_kernels copy vLLM vendors) and mxconvert itself, editable, so that its
# `vllm.general_plugins` entry point is registered. torch is pinned to the CPU build 2.13.0 for every
# release (vLLM 0.26.0 pins 2.11.0 and 0.33.0 pins 2.14.0; the Python code the tests run works with
# 2.13.0): never let a resolver pick one.
# vLLM 0.33.0 only, for the ROCm tests (tests_vllm/test_rocm.py): the one pure-torch file
# `aiter/ops/shuffle.py` of the amd-aiter 0.1.7.post2.dev18 wheel (AITER's weight/scale shuffles;
# `import aiter` itself needs ROCm), extracted to $VENV/aiter-0.1.7.post2.dev18/ -- NOT on sys.path,
# the harness loads it by file.
# Wheels are cached in $MXCONVERT_WHEEL_CACHE (default ~/.cache/mxconvert-wheels) and never deleted.
# Idempotent: a stamp over this file, pyproject.toml and the release skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
VERSION=${VLLM_VERSION:-0.33.0}
case "$VERSION" in
    0.33.0) FLASHINFER=0.7.2.post1 AITER_FILE=yes DEFAULT_VENV=.venv-vllm ;;
    *) exec bash tools/vllm_env/release_env.sh ;;
esac
VENV=${VLLM_VENV:-$DEFAULT_VENV}
WHEELS=${MXCONVERT_WHEEL_CACHE:-$HOME/.cache/mxconvert-wheels}
STAMP="$VENV/.installed-$( (cat "$0" pyproject.toml tools/vllm_env/requirements.txt; echo "$VERSION") | cksum | cut -d' ' -f1)"
[ -f "$STAMP" ] && exit 0
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
$PIP install -q torch==2.13.0
mkdir -p "$WHEELS"
ls "$WHEELS"/vllm-"$VERSION"-*.whl >/dev/null 2>&1 || $PIP download -q --no-deps "vllm==$VERSION" -d "$WHEELS"
$PIP install -q --no-deps "$WHEELS"/vllm-"$VERSION"-*.whl
$PIP install -q --no-deps "flashinfer-python==$FLASHINFER" triton==3.9.0 -r tools/vllm_env/requirements.txt
$PIP install -q --no-deps -e .
$PIP install -q pytest numpy
if [ "$AITER_FILE" = yes ]; then
    AITER=amd_aiter-0.1.7.post2.dev18-py3-none-any.whl
    ls "$WHEELS/$AITER" >/dev/null 2>&1 || $PIP download -q --no-deps --pre amd-aiter==0.1.7.post2.dev18 -d "$WHEELS"
    "$VENV/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('aiter/ops/shuffle.py', sys.argv[2])" \
        "$WHEELS/$AITER" "$VENV/aiter-0.1.7.post2.dev18"
fi
rm -f "$VENV"/.installed-*
touch "$STAMP"
