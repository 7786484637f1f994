#!/bin/bash
# Direct writes (issue 24; bench/README.md, "Direct writes") on the GPU machine's host, one device
# call (~4 minutes): the write probe (buffered + fsync against O_DIRECT blocks), the 20b-shaped
# targets (4 layers x 32 experts, h100/b200/mi355x, best of 3) converted the default way (`auto`:
# buffered on 16 cores) and with --write-mode direct, and gpt-oss-20b at its real sizes (h100) both
# ways. Run from the repository root; writes its outputs to $OUT (default ./direct-writes-out).
#
#   bash tools/gpu_check/direct_writes_run.sh
#   SMOKE=1 bash tools/gpu_check/direct_writes_run.sh     # tiny sizes: does it run?
set -u -o pipefail
ROOT=$(pwd)
OUT=${OUT:-$ROOT/direct-writes-out}
PY=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
WORK=${WORK:-/tmp}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT
unset MXCONVERT_FAULT
if [ ! -f "$ROOT/bench/bench_engine.py" ]; then
  echo "run from the mxconvert repository root (no bench/bench_engine.py here: $ROOT)" >&2
  exit 2
fi
{ date -u +%FT%TZ; nproc; git rev-parse HEAD 2>/dev/null; df -h "$WORK" | tail -1; } > "$OUT/machine.txt" 2>&1
. "$ROOT/tools/gpu_check/_bytecode.sh"  # bytecode as an installed environment has it
warm_bytecode "$ROOT"
if [ "$SMOKE" = 1 ]; then
  GB=0.1; SIZE="--layers 1 --experts 4"; REPEAT=1; FULL="--layers 2 --experts 4"
else
  GB=1.9; SIZE="--layers 4 --experts 32"; REPEAT=3; FULL="--layers 24 --experts 32 --real-sizes"
fi
B="$PY $ROOT/bench/bench_engine.py --tmp $WORK"
timeout 100 $PY "$ROOT/bench/bench_direct_io.py" "$WORK" --gb $GB --repeat 2 --ways 8x3,32x2 2>&1 | tee "$OUT/probe.txt"
timeout 240 $B $SIZE --profiles h100,b200,mi355x --repeat $REPEAT --variants default,direct \
  --json-out "$OUT/targets.json" 2>&1 | tee "$OUT/targets.txt"
timeout 220 $B $FULL --profiles h100 --repeat 1 --variants default,direct --disk-budget-gb 40 \
  --json-out "$OUT/fullsize-20b.json" 2>&1 | tee "$OUT/fullsize-20b.txt"
