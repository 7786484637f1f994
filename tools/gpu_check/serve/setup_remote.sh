#!/bin/bash
# On the GPU machine: gather the carried pieces (.gpu/pN of this call) under /tmp/serve026; once all
# are there (the sha256 of the whole payload matches), unpack vLLM and install what the machine lacks
# into /tmp/serve026/site. Idempotent: a later call on the same warm machine finds it installed.
#   source tools/gpu_check/serve/setup_remote.sh   (exports PYTHONPATH when ready; sets SERVE_READY=1)
S=/tmp/serve026
mkdir -p $S/parts
for d in .gpu/p*; do [ -d "$d" ] && cp -f "$d"/* $S/parts/; done
SERVE_READY=0
if [ -f $S/site/.installed ]; then
  SERVE_READY=1
elif (cd $S && cat parts/part-* > payload.tar && sha256sum -c parts/payload.sha256 >/dev/null 2>&1); then
  (cd $S && tar xf payload.tar && rm payload.tar)
  mkdir -p $S/site
  python3 -m zipfile -e $S/payload/vllm-0.26.0-trim.zip $S/site/
  python3 tools/gpu_check/serve/install_deps.py $S/payload/deps $S/site $S/payload/mxconvert-*.whl || return 1
  # Pieces carried beside the payload: more of the wheel (zip of vllm/ members) and more wheels.
  for z in $S/parts/*.zip; do [ -f "$z" ] && python3 -m zipfile -e "$z" $S/site/; done
  ls $S/parts/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --target $S/site $S/parts/*.whl
  touch $S/site/.installed && SERVE_READY=1
else
  echo "serve026: pieces so far: $(ls $S/parts | tr '\n' ' ')"
fi
if [ "$SERVE_READY" = 1 ]; then export PYTHONPATH=$S/site; echo "serve026: ready (PYTHONPATH=$PYTHONPATH)"; fi
