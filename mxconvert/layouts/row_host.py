"""Moves of whole rows on the host without a gather plan: a `layouts/base.py` `HostMove` for
moves that only reorder dim 1 of `[E, N, ...]` (the TRTLLM row orders, the identity).

A gather plan indexes every element of an expert: for a gpt-oss value tensor that is ~9 M
positions, ~0.4-0.9 s of CPU and ~200 MB to build, at the start of every convert and verify
(bench/README.md; the b200 plans were 14% of a 2-core convert's CPU), although such a move
needs one index per row. `RowMove` runs the layout's own arrange function on the row positions
`0..N-1` alone (a `[1, N]` `Positions`), which gives the row order of the whole move because the
function treats the dims after the rows as opaque (`e, n, *rest = x.shape`); the layout author
declares that by attaching it, and tests/test_hs_speed_paths.py checks it against the plan's
bytes. A move that pads rows is refused here (it has no row permutation); it keeps its plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mxconvert.core.parallel import host_buffer
from mxconvert.layouts.engine.positions import Positions

if TYPE_CHECKING:
    import numpy as np
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


@dataclass(frozen=True)
class RowMove:
    """The host move of `arrange`, a reordering of dim 1 alone (no padding, no codec)."""

    arrange: Any  # the layout's move (layouts/base.py `Arrange`), run on row positions

    def forward(self, elements: np.ndarray, fill: int) -> np.ndarray:
        """The rows of `elements` (`[E, N, ...]`) in the move's order."""
        order = _row_orders(self.arrange, elements.shape[1])[0]
        if order is None:  # the identity: no copy (as the strided engine's)
            return np.ascontiguousarray(elements)
        out = host_buffer(elements.nbytes).view(elements.dtype).reshape(elements.shape)
        return np.take(elements, order, axis=1, out=out, mode="clip")  # a permutation: in range

    def inverse(self, buffer: np.ndarray, element_shape: tuple[int, ...], fill: int) -> tuple[np.ndarray, int | None]:
        """The canonical rows of a stored buffer (no padding to check)."""
        stored = np.ascontiguousarray(buffer).reshape(element_shape)
        back = _row_orders(self.arrange, element_shape[1])[1]
        if back is None:
            return stored, None
        out = host_buffer(stored.nbytes).view(stored.dtype).reshape(element_shape)
        return np.take(stored, back, axis=1, out=out, mode="clip"), None


@lru_cache(maxsize=64)
def _row_orders(arrange: Any, rows: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(forward, inverse) row indices of the move for `rows` rows; (None, None) for the identity."""
    dtype = np.int32 if rows < 2**31 else np.int64
    moved: Positions = arrange(Positions(np.arange(rows, dtype=dtype).reshape(1, rows)), -1)
    order = moved.flat().astype(np.intp)
    if order.size != rows or not np.array_equal(np.sort(order), np.arange(rows)):
        raise AssertionError("a RowMove's arrange must be a permutation of the rows (no padding)")
    if np.array_equal(order, np.arange(rows)):
        return None, None
    back = np.empty(rows, dtype=np.intp)
    back[order] = np.arange(rows, dtype=np.intp)
    return order, back
