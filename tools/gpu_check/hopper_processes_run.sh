#!/bin/bash
# The Hopper pass in worker processes (bench/hopper_processes_probe.py, measured and dropped in
# session 16) against the in-process pass, on the GPU machine's host, one device call (~1 minute):
# `cp -r` + `sync`, then h100 converts with 0 (in process), 8, 12 and 16 workers and a b200
# convert, REPS rounds; the last 16-worker artifact is verified. LAYERS=1 EXPERTS=4 REPS=1: smoke.
#
#   bash tools/gpu_check/hopper_processes_run.sh
set -u -o pipefail
ROOT=$(pwd); OUT=${OUT:-$ROOT/hopper-processes-out}; PY=${PYTHON:-python3}; mkdir -p "$OUT"
export PYTHONPATH=$ROOT
WORK=/tmp/proto-$$; mkdir -p $WORK; trap 'rm -rf $WORK' EXIT
{ date -u; nproc; nvidia-smi -L 2>/dev/null | head -1; } | tee $OUT/machine.txt
. "$ROOT/tools/gpu_check/_bytecode.sh"  # bytecode as an installed environment has it
warm_bytecode "$ROOT"
$PY bench/synthetic.py $WORK/src --layers ${LAYERS:-4} --experts ${EXPERTS:-32} >/dev/null 2>&1 || { echo synth failed; exit 3; }
sync
child() { # label pool profile
  local label=$1 pool=$2 prof=$3
  rm -rf $WORK/out; sync
  $PY - "$pool" convert $WORK/src -o $WORK/out -p $prof <<'PYEOF' 2>&1 | sed "s/^/$label /"
import resource, subprocess, sys, time
pool, *command = sys.argv[1:]
code = ("import sys; n = int(sys.argv[1]);\n"
        "if n:\n sys.path.insert(0, 'bench'); import hopper_processes_probe as p; p.install(n)\n"
        "sys.argv = ['mxconvert'] + sys.argv[2:]; from mxconvert._entry import main; main()")
t0 = time.perf_counter()
rc = subprocess.run([sys.executable, "-c", code, pool, *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"wall {wall:.2f} s cpu {ru.ru_utime + ru.ru_stime:.2f} s rc {rc.returncode} {rc.stderr.strip()[-300:] if rc.returncode else ''}")
PYEOF
}
for rep in $(seq ${REPS:-4}); do
  rm -rf $WORK/cp; sync
  s=$(date +%s.%N); cp -r $WORK/src $WORK/cp && sync; e=$(date +%s.%N)
  awk -v s=$s -v e=$e 'BEGIN{printf "cp -r + sync: %.2f s\n", e-s}'
  rm -rf $WORK/cp
  for v in ${VARIANTS:-0 8 12 16}; do child "h100 pool $v" $v h100; done
  child "b200" 0 b200
done 2>&1 | tee $OUT/convert.txt
child "h100 pool 16 (for verify)" 16 h100 >/dev/null
$PY -m mxconvert verify $WORK/out > $OUT/verify.txt 2>&1; echo "verify rc $?" | tee -a $OUT/convert.txt
