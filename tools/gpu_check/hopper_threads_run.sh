#!/bin/bash
# Issue 24 on the GPU machine's host: does the Hopper value layout's host pass (h100's TRITON
# weights, layouts/hopper_host.py) scale over 16 threads, and what block size makes convert
# fastest there? One device call, ~4 minutes; everything it measures goes to $OUT (text).
#
#   bash tools/gpu_check/hopper_threads_run.sh       (from the repository root; PYTHONPATH=$PWD)
#   SMOKE=1 bash tools/gpu_check/hopper_threads_run.sh   (tiny sizes: does it run?)
#   MICRO=0 VERIFY=0 REPS=5 VARIANTS="18:0 18:4 20:4" bash tools/gpu_check/hopper_threads_run.sh
#       (converts only: block:at-once pairs, 0 = the code's default bound, 99 = none)
#
# 1. bench/bench_hopper_threads.py: GB/s of the pass on 1-16 threads, per block size;
# 2. `cp -r` + `sync` of the 4 x 32 synthetic checkpoint, 3 times (the baseline);
# 3. convert -p h100 with block sizes and caps on the threads inside the pass at once (set in the
#    child before the CLI runs), 3 each, and -p b200 3 times; wall and CPU seconds of each child.
set -u -o pipefail
ROOT=$(pwd)
OUT=${OUT:-$ROOT/hopper-threads-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT
WORK=/tmp/hopper-threads-$$
mkdir -p "$WORK"
. "$ROOT/tools/gpu_check/_bytecode.sh"
warm_bytecode "$ROOT"
trap 'rm -rf "$WORK"' EXIT
{
  date -u +%FT%TZ; uname -r; echo "cores: $(nproc)"
  $PY -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "work folder $WORK: $(stat -f -c %T "$WORK") on $(df -h --output=source,size,avail "$WORK" | tail -1)"
} 2>&1 | tee "$OUT/machine.txt"

if [ "${SMOKE:-0}" = 1 ]; then TH="--threads 1,2 --blocks 16 --seconds 0.2"; L="--layers 1 --experts 4"; else TH="--threads 1,2,4,8,16 --blocks 16,17,18,19,20 --caps 4,6,8,12"; L="--layers 4 --experts 32"; fi
[ "${MICRO:-1}" = 1 ] && $PY "$ROOT/bench/bench_hopper_threads.py" $TH 2>&1 | tee "$OUT/threads.txt"

$PY "$ROOT/bench/synthetic.py" "$WORK/src" $L >/dev/null 2>&1 || { echo "synthetic failed"; exit 3; }
sync
for i in 1 2 3; do
  rm -rf "$WORK/cp"; sync
  start=$(date +%s.%N); cp -r "$WORK/src" "$WORK/cp" && sync; end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { printf "cp -r + sync: %.2f s\n", e - s }'
done 2>&1 | tee "$OUT/convert.txt"
rm -rf "$WORK/cp"

# one timed convert: a fresh child running the CLI, with the block size set first
run() {  # label log2block at_once profile [convert options]
  local label=$1 block=$2 at_once=$3 profile=$4; shift 4
  rm -rf "$WORK/out"; sync
  child "$label" "$block" "$at_once" convert "$WORK/src" -o "$WORK/out" -p "$profile" "$@"
}
child() {  # label log2block at_once command...
  local label=$1 block=$2 at_once=$3; shift 3
  $PY - "$block" "$at_once" "$@" <<'PYEOF' 2>&1 | sed "s/^/$label /"
import resource, subprocess, sys, time
block, at_once, *command = sys.argv[1:]
code = ("import sys, mxconvert.layouts.hopper_host as h; h._BLOCK_WORDS = 1 << int(sys.argv[1]); "
        "h._AT_ONCE = int(sys.argv[2]) or None; "
        "sys.argv = ['mxconvert'] + sys.argv[3:]; from mxconvert._entry import main; main()")
t0 = time.perf_counter()
rc = subprocess.run([sys.executable, "-c", code, block, at_once, *command],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
err = rc.stderr.strip()[-200:] if rc.returncode else ""
print(f"wall {wall:.2f} s cpu {ru.ru_utime + ru.ru_stime:.2f} s rc {rc.returncode} {err}")
PYEOF
}
# block:at_once (0: the code's default, half the cores; 99: no cap)
# VARIANTS and REPS choose other sweeps; each rep also times `cp -r` + `sync` again
for rep in $(seq "${REPS:-3}"); do
  for v in ${VARIANTS:-16:99 16:0 17:0 18:0 18:6 19:0 20:99 20:0}; do run "h100 block 2^${v%%:*} at once ${v#*:}" ${v%%:*} ${v#*:} h100; done
  run "b200 default" 16 0 b200
  rm -rf "$WORK/cp"; sync
  start=$(date +%s.%N); cp -r "$WORK/src" "$WORK/cp" && sync; end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { printf "cp -r + sync: %.2f s\n", e - s }'
  rm -rf "$WORK/cp"
done 2>&1 | tee -a "$OUT/convert.txt"
# verify (the inverse pass) of one h100 artifact
[ "${VERIFY:-1}" = 1 ] && run "h100 artifact for verify" 16 0 h100 >/dev/null
[ "${VERIFY:-1}" = 1 ] && for rep in 1 2 3; do
  for v in 16:99 16:0 18:0 20:0; do child "verify h100 block 2^${v%%:*} at once ${v#*:}" ${v%%:*} ${v#*:} verify "$WORK/out"; done
done 2>&1 | tee -a "$OUT/convert.txt"
rm -rf "$WORK/out"
