#!/usr/bin/env bash
# Build the CPU-only environment of the SGLang loader tests (tests_sglang/): .venv-sglang.
#
#   bash tools/sglang_env/setup.sh                       # .venv-sglang
#   SGLANG_VENV=somewhere bash tools/sglang_env/setup.sh
#
# What the tests run of SGLang is its own Python source, read from the installed package and compiled
# function by function (Mxfp4MoEMethod.create_weights / process_weights_after_loading,
# GptOssForCausalLM._load_mxfp4_experts_weights, LoadConfig._verify_load_format, the plugin hook
# registry: tests_sglang/harness.py and test_plugin.py), the way tools/golden/sglang_mxfp4_*.py run
# it: importing those modules needs SGLang's serving and CUDA stack (sgl_kernel, torchvision, ...),
# which a CPU CI has not. So: the sglang 0.5.23 wheel with --no-deps (its requirements would pull a
# CUDA torch and the serving stack); FlashInfer 0.7.2 (SGLang 0.5.23's pin; its permute-index
# helpers run on CPU; --no-deps) with the pure-Python modules its import asks for (requirements.txt,
# --no-deps); torch pinned to the CPU build 2.13.0 (SGLang pins 2.14.1; the code the tests run works
# with 2.13.0; never let a resolver pick one); mxconvert itself (editable) with its own
# dependencies; pytest.
# Wheels are cached in $MXCONVERT_WHEEL_CACHE (default ~/.cache/mxconvert-wheels) and never deleted.
# Idempotent: a stamp over this file, requirements.txt and pyproject.toml skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
SGLANG=0.5.23
FLASHINFER=0.7.2
VENV=${SGLANG_VENV:-.venv-sglang}
WHEELS=${MXCONVERT_WHEEL_CACHE:-$HOME/.cache/mxconvert-wheels}
STAMP="$VENV/.installed-$( (cat "$0" pyproject.toml tools/sglang_env/requirements.txt; echo "$SGLANG $FLASHINFER") | cksum | cut -d' ' -f1)"
[ -f "$STAMP" ] && exit 0
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
$PIP install -q torch==2.13.0
mkdir -p "$WHEELS"
ls "$WHEELS"/sglang-"$SGLANG"-*.whl >/dev/null 2>&1 || $PIP download -q --no-deps "sglang==$SGLANG" -d "$WHEELS"
ls "$WHEELS"/flashinfer_python-"$FLASHINFER"-*.whl >/dev/null 2>&1 ||
    $PIP download -q --no-deps "flashinfer-python==$FLASHINFER" -d "$WHEELS"
$PIP install -q --no-deps "$WHEELS"/sglang-"$SGLANG"-*.whl "$WHEELS"/flashinfer_python-"$FLASHINFER"-*.whl
$PIP install -q --no-deps -r tools/sglang_env/requirements.txt
$PIP install -q -e .
$PIP install -q pytest
rm -f "$VENV"/.installed-*
touch "$STAMP"
