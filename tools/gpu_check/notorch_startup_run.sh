#!/usr/bin/env bash
# Session 5, branch notorch (issue 11, target 6): CLI start-up on the GPU machine's 16-core host,
# before (main before the merge) and after, with both bytecode modes of bench_startup.py.
# Layout (as session4_final_run.sh): DIR/before and DIR/after are `git archive` exports of the two
# commits; the host's python3 has the run-time dependencies (session4_final_run.sh part 1 installs
# them from DIR/wheels). Run from the repository root:
#   bash tools/gpu_check/notorch_startup_run.sh .gpucheck/notorch
# Results: $OUT/startup-none.{txt,json}, $OUT/startup-cached.{txt,json}.
set -euo pipefail
DIR=$1
OUT=${OUT:-/tmp/notorch-out}
mkdir -p "$OUT"
cd "$DIR"
if compgen -G "wheels/*.whl" > /dev/null; then
  pip install -q --no-index --no-deps --break-system-packages wheels/*.whl 2>&1 | tail -2
fi
for mode in none cached; do
  timeout 280 python3 after/bench/bench_startup.py --repeat 7 --bytecode "$mode" --before before \
    --json-out "$OUT/startup-$mode.json" 2>&1 | tee "$OUT/startup-$mode.txt"
done
