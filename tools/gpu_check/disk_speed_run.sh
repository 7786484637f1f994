#!/bin/bash
# Issue 24 on the GPU machine's host (bench/README.md, "Convert at disk speed"): run from the
# repository root, no network, mxconvert not installed (PYTHONPATH=$PWD). Writes everything it
# measures to $OUT (JSON + text); nothing large goes there. Each mode finishes in < 9 minutes.
#
#   bash tools/gpu_check/disk_speed_run.sh targets    # item 3: 20b shape, 4 layers x 32 experts,
#                                                     #   h100, b200, mi355x, best of 3, cp -r + sync
#                                                     #   baseline, convert + verify, peak RSS, fsync
#                                                     #   cost (no-fsync), early writeback's effect
#                                                     #   (no-writeback) and --file-sha256 cost
#   bash tools/gpu_check/disk_speed_run.sh fullsize   # item 4: gpt-oss-20b real sizes (24 x 32) for
#                                                     #   h100 and b200; a 120b shape, as many layers
#                                                     #   as the free disk allows (at most 40 GB)
#   SMOKE=1 bash tools/gpu_check/disk_speed_run.sh targets|fullsize   # tiny sizes: does it run?
#
# Environment: OUT (default ./disk-speed-out), PYTHON (default python3), WORK (where the synthetic
# checkpoints go; default /tmp, or a folder beside the repository where /tmp is not a disk).
set -u -o pipefail
MODE=${1:-targets}
ROOT=$(pwd)
OUT=${OUT:-$ROOT/disk-speed-out}
PY=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT
unset MXCONVERT_FAULT

if [ ! -f "$ROOT/mxconvert/__init__.py" ] || [ ! -f "$ROOT/bench/bench_engine.py" ]; then
  echo "run from the mxconvert repository root (no mxconvert/ or bench/ here: $ROOT)" >&2
  exit 2
fi
. "$ROOT/tools/gpu_check/_bytecode.sh"  # bytecode as an installed environment has it
warm_bytecode "$ROOT"
# the package's dependencies (pyproject.toml [project] dependencies): fail clearly, before any work
if ! $PY - <<'EOF'
import importlib.util, sys
need = ("torch", "safetensors", "numpy", "typer", "rich", "huggingface_hub")
missing = [name for name in need if importlib.util.find_spec(name) is None]
if missing:
    print(f"missing Python packages: {', '.join(missing)} (pyproject.toml dependencies); nothing was run", file=sys.stderr)
    sys.exit(2)
import mxconvert.cli.main  # noqa: F401  the CLI imports (bench children run it)
EOF
then
  exit 2
fi

# where the checkpoints go: a real disk (fsync and `cp -r` + `sync` mean nothing on tmpfs)
if [ -z "${WORK:-}" ]; then
  WORK=/tmp
  if [ "$(stat -f -c %T /tmp)" = "tmpfs" ]; then WORK=$ROOT/../disk-speed-work; fi
fi
mkdir -p "$WORK"
AVAIL_GB=$(df -B1 --output=avail "$WORK" | tail -1 | awk '{printf "%.1f", $1 / 1e9}')

{
  echo "mode: $MODE (smoke $SMOKE)"; date -u +%FT%TZ; uname -r; nproc
  $PY -c "import os, sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cores available', len(os.sched_getaffinity(0))); print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')"
  echo "work folder $WORK: $(stat -f -c %T "$WORK") on $(df -h --output=source,size,avail "$WORK" | tail -1)"
  echo "free disk there: $AVAIL_GB GB"; free -g | head -2
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  for i in 1 2 3; do
    start=$(date +%s.%N); $PY -c "import torch"; end=$(date +%s.%N)
    awk -v s="$start" -v e="$end" 'BEGIN { printf "python -c \"import torch\": %.2f s\n", e - s }'
  done
} 2>&1 | tee "$OUT/machine-$MODE.txt"

B="$PY $ROOT/bench/bench_engine.py --tmp $WORK"
case "$MODE" in
  targets)
    if [ "$SMOKE" = 1 ]; then SIZE="--layers 1 --experts 4"; REPEAT=1; else SIZE="--layers 4 --experts 32"; REPEAT=3; fi
    timeout 500 $B $SIZE --profiles h100,b200,mi355x --repeat $REPEAT --variants default,no-fsync,no-writeback,file-sha256 \
      --json-out "$OUT/targets.json" 2>&1 | tee "$OUT/targets.txt"
    ;;
  fullsize)
    BUDGET=$($PY -c "print(round(min(40.0, 0.85 * $AVAIL_GB), 1))")
    if [ "$SMOKE" = 1 ]; then  # small stand-ins for the vocabulary and attention: a quick check that it runs
      S20="--layers 2 --experts 4"; S120="--layers 36 --experts 8"; BUDGET=0.5
    else
      S20="--layers 24 --experts 32 --real-sizes"; S120="--layers 36 --experts 128 --real-sizes"
    fi
    # gpt-oss-20b, every tensor at its real size (~13.8 GB); fewer layers only where the disk is short
    timeout 250 $B $S20 --disk-budget-gb "$BUDGET" --profiles h100,b200 --repeat 1 \
      --json-out "$OUT/fullsize-20b.json" 2>&1 | tee "$OUT/fullsize-20b.txt"
    # gpt-oss-120b shape (128 experts, 1.7 GB of experts per layer): the layers the disk holds
    timeout 270 $B $S120 --disk-budget-gb "$BUDGET" --profiles h100,b200 --repeat 1 \
      --json-out "$OUT/fullsize-120b.json" 2>&1 | tee "$OUT/fullsize-120b.txt"
    ;;
  *)
    echo "mode must be targets or fullsize, not $MODE" >&2
    exit 2
    ;;
esac
status=$?
$PY "$ROOT/bench/disk_speed_summary.py" "$OUT" 2>&1 | tee "$OUT/summary-$MODE.md"
exit $status
