#!/bin/bash
# Build the payload the serving check carries to the GPU machine, in pieces (64 MiB per call, the
# working tree included): vLLM 0.26.0 trimmed (trim_wheel.py says what is dropped and why), the
# Python packages vLLM imports that the machine lacks (DEPS: Python 3.12 manylinux wheels, installed
# there only where the machine has no equal or newer version), and an mxconvert wheel of this clone
# (its `vllm.general_plugins` entry point registers the load format).
#
#   bash tools/gpu_check/serve/pack.sh [PIECE_MB]   -> .gpu/p1, .gpu/p2, ... (ignored by git)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PIECE_MB=${1:-44}
CACHE=${MXCONVERT_WHEELS:-$HOME/.cache/mxconvert-wheels}
WORK=${WORK:-/tmp/serve-pack}
WHEEL=$(ls "$CACHE"/vllm-0.26.0-*.whl)
DEPS=(
  cloudpickle msgspec cbor2 pyzmq pybase64 cachetools openai-harmony py-cpuinfo uvloop partial-json-parser
  aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl
  openai httpx httpcore h11 anyio sniffio distro jiter httpx2 httpcore2 certifi idna
  pydantic pydantic-core annotated-types typing-inspection
  'fastapi<0.137' 'starlette>=1.0.1' annotated-doc
  'llguidance<1.8' xgrammar==0.2.7 apache-tvm-ffi==0.1.10
  blake3 setproctitle depyf==0.20.0 astor dill gguf lark==1.2.2 jsonschema referencing rpds-py
  jsonschema-specifications ijson watchfiles python-json-logger
  typer rich click shellingham markdown-it-py mdurl
  compressed-tensors==0.17.0 loguru
)
rm -rf "$WORK" && mkdir -p "$WORK/payload/deps"
python3 tools/gpu_check/serve/trim_wheel.py "$WHEEL" "$WORK/payload/vllm-0.26.0-trim.zip"
for d in "${DEPS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform any \
    $(for n in 1 5 17 24 26 27 28 31 34 35; do echo --platform manylinux_2_${n}_x86_64; done) \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WORK/payload/deps" "$d"
done
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/payload" .
(cd "$WORK" && tar cf payload.tar payload && sha256sum payload.tar | sed 's| payload.tar| payload.tar|' > payload.sha256)
rm -rf .gpu && mkdir -p .gpu
(cd "$WORK" && split -b "${PIECE_MB}M" -d payload.tar part-)
i=0
for part in "$WORK"/part-*; do
  i=$((i + 1)); mkdir -p ".gpu/p$i"; mv "$part" ".gpu/p$i/"; cp "$WORK/payload.sha256" ".gpu/p$i/"
done
ls -la .gpu/*; echo "pieces: $i"
