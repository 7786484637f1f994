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
# Every process runs with the bytecode an installed environment has (tools/gpu_check/_bytecode.sh).
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
unset MXCONVERT_FAULT
. "$ROOT/tools/gpu_check/_bytecode.sh"
{
  date -u +%FT%TZ; echo "cores: $(nproc)"; git rev-parse HEAD 2>/dev/null; df -h "$WORK" | tail -1
  $PY -c "import sys, numpy, typer; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'typer', typer.__version__)"
} > "$OUT/machine.txt" 2>&1
warm_bytecode "$ROOT"
[ -n "${BEFORE:-}" ] && warm_bytecode "$BEFORE"
if [ "${SMOKE:-0}" = 1 ]; then SIZE="--layers 1 --experts 4"; REPEAT=1; else SIZE="--layers 4 --experts 32"; REPEAT=${REPEAT:-3}; fi
timeout 480 $PY "$ROOT/bench/bench_engine.py" $SIZE --profiles h100,b200,mi355x --repeat "$REPEAT" --tmp "$WORK" \
  ${BEFORE:+--before "$BEFORE"} --json-out "$OUT/targets.json" 2>&1 | tee "$OUT/targets.txt"
