#!/usr/bin/env bash
# Build a thin CPU venv for one vLLM release (0.19.0 .. 0.32.0) over the shared 0.33.0 base venv, for
# the vLLM plugin tests (tests_vllm/) and tools/vllm_releases/plugin_check.py:
#
#   VLLM_VERSION=0.27.0 bash tools/vllm_env/release_env.sh              # .venv-vllm-0.27.0
#   VLLM_VERSION=0.26.0 bash tools/vllm_env/release_env.sh              # .venv-vllm-0.26 (setup.sh's name)
#   VLLM_VERSION=0.27.0 VLLM_VENV=somewhere bash tools/vllm_env/release_env.sh
#
# (`VLLM_VERSION=X.Y.Z bash tools/vllm_env/setup.sh` runs this for every release but 0.33.0.)
#
# The base ($VLLM_BASE_VENV, default .venv-vllm; built by setup.sh when it has no python yet, else
# left as it is: `make test-vllm` runs setup.sh for it first) holds what
# every release's Python code runs with: torch 2.13.0 CPU, triton 3.9.0, the pure-Python modules of
# requirements.txt, pytest and mxconvert (editable, with its `vllm.general_plugins` entry point). The
# release's venv holds only
#   * vLLM's wheel, its Python files (compiled libraries, *.so, are not extracted: nothing compiled
#     runs on CPU, and they are most of the wheel; `import vllm._C` fails as on any CPU host);
#   * the Python files of the FlashInfer release the wheel pins (tools/vllm_releases/records/
#     vllm-X.Y.Z.json `pins`), so the release runs its own FlashInfer's helpers;
#   * gguf 0.17.1 (0.19.0's `gguf>=0.17.0`), which releases before 0.24.0 import at start-up and the
#     base lacks;
#   * zz_deps.pth: the base's site-packages, appended to sys.path after the release's own folder, so
#     `vllm` and `flashinfer` (and their package metadata) are the release's, the rest the base's.
# Only what Python runs is extracted: compiled libraries and executables (*.so, ELF files such as
# vllm/vllm-rs) and C++/CUDA sources and headers (FlashInfer's JIT tree, vLLM's third_party) are
# left in the wheel; nothing compiled runs on CPU, and they are two thirds of what stays on disk
# (0.32.0's venv: 383 MB with them, ~100 MB without).
# Wheels are cached in $MXCONVERT_WHEEL_CACHE (default ~/.cache/mxconvert-wheels) and never deleted.
# With MXCONVERT_KEEP_WHEELS=0 (.ci/run sets it) a wheel the cache lacks is downloaded into a
# temporary folder and deleted once extracted: a clean CI machine then never holds more than one
# release's wheels (~0.3-0.5 GB) instead of all of them (~9 GB).
# Idempotent: a stamp over this file, the base's recipe and the release skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=${VLLM_VERSION:?set VLLM_VERSION=X.Y.Z}
BASE=${VLLM_BASE_VENV:-.venv-vllm}
WHEELS=${MXCONVERT_WHEEL_CACHE:-$HOME/.cache/mxconvert-wheels}
RECORD=tools/vllm_releases/records/vllm-$VERSION.json
GGUF=gguf==0.17.1
case "$VERSION" in
    0.33.0)
        echo "tools/vllm_env/release_env.sh: vLLM 0.33.0 is the base venv itself (bash tools/vllm_env/setup.sh)" >&2
        exit 2
        ;;
    0.26.0) DEFAULT_VENV=.venv-vllm-0.26 ;;
    *) DEFAULT_VENV=.venv-vllm-$VERSION ;;
esac
if [ ! -f "$RECORD" ]; then
    echo "tools/vllm_env/release_env.sh: no record $RECORD for vLLM $VERSION (tools/vllm_releases/record.py makes one)" >&2
    exit 2
fi
VENV=${VLLM_VENV:-$DEFAULT_VENV}
STAMP="$VENV/.installed-$( (cat "$0" tools/vllm_env/setup.sh pyproject.toml tools/vllm_env/requirements.txt; echo "$VERSION $BASE") | cksum | cut -d' ' -f1)"
[ -f "$STAMP" ] && exit 0
test -x "$BASE/bin/python" || VLLM_VERSION=0.33.0 VLLM_VENV="$BASE" bash tools/vllm_env/setup.sh
BASE_PY="$BASE/bin/python"
FLASHINFER=$("$BASE_PY" -c "import json, sys; pin = json.load(open(sys.argv[1]))['pins']['flashinfer-python'] or ''
assert pin.startswith('=='), f'no exact flashinfer-python pin: {pin!r}'
print(pin[2:])" "$RECORD")
mkdir -p "$WHEELS"
DOWNLOADS=$WHEELS
if [ "${MXCONVERT_KEEP_WHEELS:-1}" = 0 ]; then
    DOWNLOADS=$(mktemp -d)
    trap 'rm -rf "$DOWNLOADS"' EXIT
fi
# wheel NAME-VERSION PIP-SPEC: the path of that wheel, from the cache or downloaded into $DOWNLOADS
wheel() {
    local found
    found=$(ls "$WHEELS/$1"-*.whl "$DOWNLOADS/$1"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$found" ]; then
        "$BASE_PY" -m pip download -q --no-deps --no-cache-dir "$2" -d "$DOWNLOADS" >&2
        found=$(ls "$DOWNLOADS/$1"-*.whl | head -n 1)
    fi
    echo "$found"
}
VLLM_WHEEL=$(wheel "vllm-$VERSION" "vllm==$VERSION")
FLASHINFER_WHEEL=$(wheel "flashinfer_python-$FLASHINFER" "flashinfer-python==$FLASHINFER")
GGUF_WHEEL=$(wheel gguf-0.17.1 "$GGUF")
rm -rf "$VENV"
"$BASE_PY" -m venv --without-pip "$VENV"
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
BASE_SITE=$("$BASE_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# the wheels' files but compiled code and C++/CUDA sources (a wheel is a zip of its site-packages
# tree); then each
# top-level package the base's FlashInfer ships and the release's does not (0.7.2.post1's `b12x`, a
# shim that loads `flashinfer/experimental/b12x/` of whichever FlashInfer comes first) is shadowed by
# one that raises ImportError, as in an install of the release's own FlashInfer
"$VENV/bin/python" - "$SITE" "$BASE_SITE" "$VLLM_WHEEL" "$FLASHINFER_WHEEL" "$GGUF_WHEEL" <<'EOF'
import sys, zipfile
from pathlib import Path

site, base, wheels = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
NATIVE_SOURCES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".inl")


def python_runs(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """False for compiled code (shared libraries, ELF executables) and C++/CUDA sources."""
    name = info.filename.rsplit("/", 1)[-1]
    if info.is_dir() or name.endswith(".so") or ".so." in name or name.endswith(NATIVE_SOURCES):
        return False
    with z.open(info) as f:
        return f.read(4) != b"\x7fELF"


for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site, [i for i in z.infolist() if python_runs(z, i)])


def top_level(site_dir: Path) -> set[str]:
    (record,) = site_dir.glob("flashinfer_python-*.dist-info/RECORD")
    names = {line.split(",", 1)[0].split("/", 1)[0] for line in record.read_text().splitlines() if line}
    return {n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data")) and n != ".."}


for name in sorted(top_level(base) - top_level(site)):
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(
        f"raise ImportError('{name} is not part of the FlashInfer this vLLM release pins "
        "(tools/vllm_env/release_env.sh)')\n"
    )
EOF
echo "$(cd "$BASE_SITE" && pwd)" >"$SITE/zz_deps.pth"
"$VENV/bin/python" -c "import importlib.metadata as m, sys; v = m.version('vllm'); sys.exit(0 if v.split('+')[0] == sys.argv[1] else f'the venv has vLLM {v}')" "$VERSION"
touch "$STAMP"
