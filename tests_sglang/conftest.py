"""Tests of the SGLang loader against SGLang 0.5.23's own code (tools/sglang_env/setup.sh builds the
CPU venv .venv-sglang: the sglang wheel, FlashInfer 0.7.2, CPU torch 2.13.0, mxconvert).

Every test here needs that venv: without SGLang 0.5.23 installed the whole folder is skipped with
the reason (the main venv stays SGLang-free), so `pytest tests_sglang` never passes by accident in a
venv that cannot run it -- `make test-sglang` runs it in .venv-sglang.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

SGLANG_RELEASE = "0.5.23"


def installed_release() -> str | None:
    try:
        return importlib.metadata.version("sglang").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def pytest_collection_modifyitems(config, items):
    live = installed_release()
    if live == SGLANG_RELEASE:
        return
    reason = f"needs SGLang {SGLANG_RELEASE} (this venv has {live or 'none'}): bash tools/sglang_env/setup.sh"
    for item in items:
        item.add_marker(pytest.mark.skip(reason=reason))
