#!/bin/bash
# Issue 24 item 3 on the GPU machine's host (bench/README.md, "Where convert's CPU goes"): where
# convert's CPU seconds go on 16 cores, and the change against an older mxconvert, in one call.
# Run from the repository root, no network, mxconvert not installed (PYTHONPATH=$PWD). Everything
# it measures goes to $OUT (text + JSON; nothing large). About 4 minutes; SMOKE=1: ~1 minute.
#
#   bash tools/gpu_check/convert_profile_run.sh             # 20b shape, 4 layers x 32 experts (1.70 GB)
#   SMOKE=1 bash tools/gpu_check/convert_profile_run.sh     # 1 layer x 4 experts: does it run?
#
# For the 4 x 32 synthetic checkpoint (bench/synthetic.py) and --profile h100, b200, mi355x:
#   1. `cp -r` + `sync` of the checkpoint, best of 3 (the baseline);
#   2. tools/gpu_check/convert_timeline.py: the phases' marks in time, this code and the older;
#   3. bench/convert_cpu_phases.py: CPU seconds and wall span per phase, this code and the older;
#   4. bench/bench_engine.py --before: convert wall and CPU, best of 3, both versions in one run;
#   5. py-spy flame graphs (--native) of this code's converts, where py-spy can be had: on PATH,
#      or a wheel in .whl/ (device README; tested: `python3 -m pip download --no-deps
#      --only-binary=:all: --python-version 3.12 --implementation cp --platform
#      manylinux_2_5_x86_64 -d .whl py-spy==0.4.3`, 2.9 MB, and carry .whl); skipped, saying so,
#      where it cannot.
#
# The older code: BEFORE=DIR (a folder holding its mxconvert/ package), else BEFORE_REV (default
# 8236886) exported with `git archive` where the repository's history is here; without either
# the before rows are skipped (said in $OUT/machine.txt). Where the device gets the working tree
# without its history: `mkdir before-8236886 && git archive 8236886 mxconvert | tar -x -C
# before-8236886` in the checkout (untracked, so it travels), then BEFORE=before-8236886.
# Environment: OUT (default ./convert-profile-out), PYTHON (default python3), WORK (where the
# checkpoint goes; default /tmp, or beside the repository where /tmp is tmpfs), SMOKE.
set -u -o pipefail
ROOT=$(pwd)
OUT=${OUT:-$ROOT/convert-profile-out}
PY=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
BEFORE_REV=${BEFORE_REV:-8236886}
PROFILES="h100 b200 mi355x"
mkdir -p "$OUT"
export PYTHONPATH=$ROOT
unset MXCONVERT_FAULT

if [ ! -f "$ROOT/mxconvert/__init__.py" ] || [ ! -f "$ROOT/bench/bench_engine.py" ]; then
  echo "run from the mxconvert repository root (no mxconvert/ or bench/ here: $ROOT)" >&2
  exit 2
fi
if ! $PY -c "import numpy, safetensors, typer, rich, mxconvert.cli.main" 2>"$OUT/import-error.txt"; then
  echo "the package's dependencies do not import (see $OUT/import-error.txt); nothing was run" >&2
  exit 2
fi

if [ -z "${WORK:-}" ]; then
  WORK=/tmp
  if [ "$(stat -f -c %T /tmp)" = "tmpfs" ]; then WORK=$ROOT/../convert-profile-work; fi
fi
WORK=$WORK/convert-profile-$$
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

# the older code
if [ -n "${BEFORE:-}" ]; then
  BEFORE_DIR=$(cd "$BEFORE" && pwd)
elif git -C "$ROOT" cat-file -e "$BEFORE_REV^{commit}" 2>/dev/null; then
  BEFORE_DIR=$WORK/before
  mkdir -p "$BEFORE_DIR" && git -C "$ROOT" archive "$BEFORE_REV" mxconvert | tar -x -C "$BEFORE_DIR"
else
  BEFORE_DIR=
fi
# both as installed packages start: bytecode written once, before anything is timed
. "$ROOT/tools/gpu_check/_bytecode.sh"
warm_bytecode "$ROOT"
[ -n "${BEFORE_DIR:-}" ] && warm_bytecode "$BEFORE_DIR"

# py-spy: on PATH, or installed from a carried wheel
SPY=$(command -v py-spy || true)
if [ -z "$SPY" ] && ls "$ROOT"/.whl/py_spy-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/spy" "$ROOT"/.whl/py_spy-*.whl \
    >/dev/null 2>&1 && SPY=$WORK/spy/bin/py-spy
  [ -x "$SPY" ] || SPY=
fi

{
  echo "convert_profile_run (smoke $SMOKE)"; date -u +%FT%TZ; uname -r
  echo "cores: $(nproc) available, $(getconf _NPROCESSORS_ONLN) online"
  $PY -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
  echo "transparent hugepages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null) defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"
  echo "work folder $WORK: $(stat -f -c %T "$WORK") on $(df -h --output=source,size,avail "$WORK" | tail -1)"
  free -g | head -2
  echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "before: ${BEFORE_DIR:-none (no BEFORE folder and no git history for $BEFORE_REV): before rows skipped}"
  echo "py-spy: ${SPY:-not available: flame graphs skipped}"
} 2>&1 | tee "$OUT/machine.txt"

if [ "$SMOKE" = 1 ]; then LAYERS=1; EXPERTS=4; REPEAT=1; else LAYERS=4; EXPERTS=32; REPEAT=3; fi
SRC=$WORK/src
$PY "$ROOT/bench/synthetic.py" "$SRC" --layers $LAYERS --experts $EXPERTS >"$OUT/synthetic.txt" 2>&1 || {
  echo "the synthetic checkpoint could not be written (see $OUT/synthetic.txt)" >&2
  exit 3
}
sync

# 1. the baseline
for i in $(seq 3); do
  rm -rf "$WORK/cp"; sync
  start=$(date +%s.%N); cp -r "$SRC" "$WORK/cp" && sync; end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { printf "cp -r + sync: %.2f s\n", e - s }'
done 2>&1 | tee "$OUT/cp.txt"
rm -rf "$WORK/cp"

VERSIONS="after:$ROOT"
[ -n "$BEFORE_DIR" ] && VERSIONS="before:$BEFORE_DIR $VERSIONS"
status=0
for profile in $PROFILES; do
  for entry in $VERSIONS; do
    version=${entry%%:*}; pkg=${entry#*:}
    # 2. timeline (the older tree's convert, run by this tree's timeline script)
    rm -rf "$WORK/out"; sync
    timeout 120 $PY "$ROOT/tools/gpu_check/convert_timeline.py" "$pkg" "$SRC" "$WORK/out" "$profile" \
      >"$OUT/timeline-$profile-$version.txt" 2>&1 || { echo "timeline $profile $version failed" >&2; status=1; }
    # 3. CPU by phase
    rm -rf "$WORK/out"; sync
    timeout 120 $PY "$ROOT/bench/convert_cpu_phases.py" "$SRC" "$WORK/out" --profile "$profile" --package "$pkg" \
      --json-out "$OUT/phases-$profile-$version.json" 2>&1 | grep -v '^converting' >"$OUT/phases-$profile-$version.txt" ||
      { echo "phases $profile $version failed" >&2; status=1; }
  done
  # 5. flame graph of this code's convert
  if [ -n "$SPY" ]; then
    rm -rf "$WORK/out"; sync
    timeout 120 "$SPY" record --native --rate 250 -o "$OUT/pyspy-$profile.svg" -- \
      $PY -m mxconvert convert "$SRC" -o "$WORK/out" -p "$profile" --force >"$OUT/pyspy-$profile.txt" 2>&1 ||
      echo "py-spy record failed for $profile (see $OUT/pyspy-$profile.txt); going on" | tee -a "$OUT/machine.txt"
  fi
done
rm -rf "$WORK/out"
grep -h -A16 '^convert -p' "$OUT"/phases-*.txt 2>/dev/null | tee "$OUT/phases-summary.txt"

# 4. wall and CPU, both versions in one run, best of $REPEAT
timeout 300 $PY "$ROOT/bench/bench_engine.py" --layers $LAYERS --experts $EXPERTS --profiles h100,b200,mi355x \
  --repeat $REPEAT --no-verify ${BEFORE_DIR:+--before "$BEFORE_DIR"} --tmp "$WORK" --json-out "$OUT/before-after.json" \
  2>&1 | tee "$OUT/before-after.txt" || status=1
exit $status
