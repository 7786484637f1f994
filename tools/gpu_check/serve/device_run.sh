#!/bin/bash
# One device call of the serving check: gather this call's payload piece; once the payload is whole,
# install and run serve_check.py with the given arguments. Results and logs go to $OUT.
#   bash tools/gpu_check/serve/device_run.sh [serve_check.py args...]
set -uo pipefail
: "${OUT:=/tmp/serve-out}"; mkdir -p "$OUT"
source tools/gpu_check/serve/setup_remote.sh
[ "$SERVE_READY" = 1 ] || exit 0
export PYTHONPATH=$PWD:$PYTHONPATH  # mxconvert from this call's tree (the wheel carried its entry point)
W=/tmp/serve026/work; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton, vllm, mxconvert; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__, 'mxconvert', mxconvert.__version__)"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
PYTHONUNBUFFERED=1 python3 tools/gpu_check/serve/serve_check.py --work $W --out $OUT "$@" 2>&1 | tee $OUT/serve-check.log | grep -v "^INFO\|^WARNING\|^DEBUG" | tail -80
(cd $W && tar czf $OUT/runs.tgz run-*.log run-*.json partial.json 2>/dev/null)
