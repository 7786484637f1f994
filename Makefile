# Two entry points for a fresh clone: `make demo` and `make test`. Each sets up .venv itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
EXAMPLE := examples/tiny-gpt-oss
DEMO := demo-out

.PHONY: setup demo test test-vllm test-sglang bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch pinned first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO)
	$(BIN)/mxconvert select $(EXAMPLE) --profile h100
	$(BIN)/mxconvert convert $(EXAMPLE) --profile h100 -o $(DEMO)/h100
	$(BIN)/mxconvert select $(EXAMPLE) --profile b200
	$(BIN)/mxconvert convert $(EXAMPLE) --profile b200 -o $(DEMO)/b200
	$(BIN)/mxconvert convert $(EXAMPLE) --profile h100 --runtime vllm-0.20 --tp 2 -o $(DEMO)/h100-vllm-0.20-tp2
	@echo; echo "written:"; find $(DEMO) -type f | sort
	$(BIN)/mxconvert verify $(DEMO)/h100
	$(BIN)/mxconvert verify $(DEMO)/b200
	$(BIN)/mxconvert verify $(DEMO)/h100-vllm-0.20-tp2
	$(BIN)/mxconvert inspect $(DEMO)/b200 --layer 0
	$(BIN)/mxconvert inspect $(DEMO)/h100 $(DEMO)/b200 --layer 0 || test $$? -eq 1
	# NVFP4 (ModelOpt and compressed-tensors) through the same pipeline
	$(BIN)/mxconvert convert examples/tiny-nvfp4-modelopt-qwen3 --profile b200 -o $(DEMO)/nvfp4-b200
	$(BIN)/mxconvert convert examples/tiny-nvfp4-ct-deepseek --profile h100 -o $(DEMO)/nvfp4-ct-h100
	$(BIN)/mxconvert verify $(DEMO)/nvfp4-b200
	$(BIN)/mxconvert verify $(DEMO)/nvfp4-ct-h100

test: $(STAMP)
	$(BIN)/python -m pytest
	$(MAKE) test-vllm
	$(MAKE) test-sglang

# The SGLang loader against SGLang 0.5.23's own code, CPU-only, in .venv-sglang (tools/sglang_env).
test-sglang:
	bash tools/sglang_env/setup.sh
	.venv-sglang/bin/python -m pytest tests_sglang

# The vLLM plugin against vLLM itself, CPU-only, one venv per release (.venv stays vLLM-free):
# 0.33.0 in .venv-vllm, 0.26.0 in .venv-vllm-0.26, and the oldest and newest release of every other
# row the plugin serves in thin venvs over .venv-vllm (tools/vllm_env/ci_releases.py lists them;
# tools/vllm_env/release_env.sh builds them). In each venv `pytest tests_vllm` runs the test modules
# written for that release (their VLLM_RELEASES) and skips the others.
test-vllm:
	bash tools/vllm_env/setup.sh
	.venv-vllm/bin/python -m pytest tests_vllm
	VLLM_VERSION=0.26.0 bash tools/vllm_env/setup.sh
	.venv-vllm-0.26/bin/python -m pytest tests_vllm
	set -e; for v in $$(.venv-vllm/bin/python tools/vllm_env/ci_releases.py); do \
		VLLM_VERSION=$$v bash tools/vllm_env/setup.sh; \
		.venv-vllm-$$v/bin/python -m pytest tests_vllm; \
	done

# Lint (ruff, configured in pyproject.toml) and type check (mypy, over every module of the package:
# pyproject's [tool.mypy] files); `.ci/run` runs `lint` before the tests. ruff checks and formats the
# whole tree (pyproject excludes tests/golden: the references' output) with no per-file exceptions.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/bench_layouts.py

clean:
	rm -rf $(DEMO) .pytest_cache
