#!/bin/bash
# Issue 24 item 3 on the GPU machine's host, one device call (~2 minutes): the 20b-shaped targets
# (4 layers x 32 experts, h100/b200/mi355x, best of 3, `cp -r` + `sync` in the same run) converted
# and verified with default options, this checkout and optionally an older one beside
# (BEFORE=DIR: a folder holding that version's mxconvert/). Outputs go to $OUT.
#
#   bash tools/gpu_check/targets_run.sh
#   BEFORE=before REPEAT=5 bash tools/gpu_check/targets_run.sh
#   SMOKE=1 bash tools/gpu_check/targets_run.sh      # tiny sizes: does it run?
#
# Bytecode as an installed environment has it: that machine sets PYTHONDONTWRITEBYTECODE=1 and its
# site-packages hold no bytecode, so every Python process there compiled numpy (~0.25 s of each
# convert; bench/README.md, "Start-up"). pip writes bytecode when it installs a package; here it
# goes to a prefix in /tmp, filled by one untimed warm-up run of each version.
set -u -o pipefail
ROOT=$(pwd)
OUT=${OUT:-$ROOT/targets-out}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp}
mkdir -p "$OUT"
if [ ! -f "$ROOT/bench/bench_engine.py" ]; then
  echo "run from the mxconvert repository root (no bench/bench_engine.py here: $ROOT)" >&2
  exit 2
fi
export PYTHONPATH=$ROOT
unset PYTHONDONTWRITEBYTECODE MXCONVERT_FAULT
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORK/mxconvert-pyc}
{
  date -u +%FT%TZ; echo "cores: $(nproc)"; git rev-parse HEAD 2>/dev/null; df -h "$WORK" | tail -1
  $PY -c "import sys, numpy, typer; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'typer', typer.__version__)"
} > "$OUT/machine.txt" 2>&1
warm() {  # one untimed convert + verify of the tiny example with the package in $1
  (cd "$1" && rm -rf "$WORK/warm-out" && $PY -m mxconvert convert "$ROOT/examples/tiny-gpt-oss" -o "$WORK/warm-out" \
    -p h100 && $PY -m mxconvert verify "$WORK/warm-out") >/dev/null 2>&1 || echo "warm-up failed in $1" >&2
  rm -rf "$WORK/warm-out"
}
warm "$ROOT"
[ -n "${BEFORE:-}" ] && warm "$BEFORE"
if [ "${SMOKE:-0}" = 1 ]; then SIZE="--layers 1 --experts 4"; REPEAT=1; else SIZE="--layers 4 --experts 32"; REPEAT=${REPEAT:-3}; fi
timeout 480 $PY "$ROOT/bench/bench_engine.py" $SIZE --profiles h100,b200,mi355x --repeat "$REPEAT" --tmp "$WORK" \
  ${BEFORE:+--before "$BEFORE"} --json-out "$OUT/targets.json" 2>&1 | tee "$OUT/targets.txt"
