# Sourced by the GPU-host scripts: every Python process gets the bytecode an installed environment
# has. The GPU machine sets PYTHONDONTWRITEBYTECODE=1 and its site-packages may hold no bytecode,
# so each process there compiled numpy at start-up (~0.25 s of every convert; bench/README.md,
# "Start-up"); pip writes bytecode when it installs a package. Here it goes to a prefix under
# $WORK (default /tmp), filled by `warm_bytecode DIR` (one untimed convert + verify of the tiny
# example with the package in DIR) before anything is timed.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${WORK:-/tmp}/mxconvert-pyc}
warm_bytecode() {
  local pkg=$1 root=${ROOT:-$(pwd)} work=${WORK:-/tmp}
  (cd "$pkg" && rm -rf "$work/warm-out" && ${PY:-python3} -m mxconvert convert "$root/examples/tiny-gpt-oss" \
    -o "$work/warm-out" -p h100 && ${PY:-python3} -m mxconvert verify "$work/warm-out") >/dev/null 2>&1 \
    || echo "bytecode warm-up failed in $pkg" >&2
  rm -rf "$work/warm-out"
}
