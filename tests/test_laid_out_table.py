"""target/backends.py `LAID_OUT` (what `mxconvert backends` marks as written by convert, read
without importing layouts/) is exactly the set of backends layouts/registry.py lays out."""

from __future__ import annotations

import pytest

from mxconvert.layouts import supported_backends
from mxconvert.target.backends import LAID_OUT


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_the_table_is_the_registry(fmt):
    assert LAID_OUT[fmt] == supported_backends(fmt)
    assert set(LAID_OUT) == {"mxfp4", "nvfp4"}
