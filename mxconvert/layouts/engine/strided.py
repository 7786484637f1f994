"""Strided descriptions of a move: the same move as one strided view, where it is one.

A move that is a reshape / permute / flip of whole dimensions (plus padding) takes every element
along a fixed stride pattern; `_strided_of` finds that pattern from the move's gather index
(plans.py), and a copy through it reads no index at all. The description is checked against the
index it replaces (`_check_describes`), so a copy through it is exact by construction.

This module imports numpy when a description is first built, never torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
else:  # imported when a plan is first built (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


@dataclass(frozen=True)
class Strided:
    """Flat positions within one expert as one strided view: the position of index `i` of
    `shape` (row-major) is `offset + sum(i[k] * strides[k])` (strides in elements, may be
    negative: a flipped dimension). A move that is a reshape / permute / flip of whole
    dimensions has one; copying through it reads no index (8 bytes per element moved for a
    gather) and copies each run of consecutive elements at once."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def run(self) -> int:
        """Elements at consecutive positions at the innermost level (1: every element alone)."""
        return self.shape[-1] if self.strides[-1] == 1 else 1

    def word_view(self, flat: np.ndarray) -> np.ndarray:
        """`view` over words of up to 16 bytes where the innermost runs, every other stride and
        the offset allow: each run is then copied as a few wide words instead of element by
        element (numpy copies a dtype to itself bit for bit; the AITER 16-byte runs gain ~2x).
        The caller views the words of `flat` the same way (`flat.view(result.dtype)`)."""
        item, size = flat.itemsize, flat.shape[1]
        for width in (16, 8, 4, 2):
            k = width // item
            if width % item or k <= 1 or self.strides[-1] != 1:
                continue
            if self.shape[-1] % k or size % k or self.offset % k or any(s % k for s in self.strides[:-1]):
                continue
            words = Strided(
                (*self.shape[:-1], self.shape[-1] // k), (*(s // k for s in self.strides[:-1]), 1), self.offset // k
            )
            return words.view(flat.view(_WORDS[width]))
        return self.view(flat)

    def view(self, flat: np.ndarray) -> np.ndarray:
        """`[E, *shape]` view of the experts of `flat` (`[E, per-expert size]`, C-contiguous)."""
        experts, size = flat.shape
        item = flat.itemsize
        if not flat.flags.c_contiguous:  # a reshape would copy, and writes would be lost
            raise AssertionError("Strided.view needs a C-contiguous array")
        if experts == 0:
            return np.empty((0, *self.shape), dtype=flat.dtype)
        return np.lib.stride_tricks.as_strided(
            flat.reshape(-1)[self.offset :],
            shape=(experts, *self.shape),
            strides=(size * item, *(s * item for s in self.strides)),
        )


#: Word dtypes for bit copies (complex128: a 16-byte word numpy copies without arithmetic).
_WORDS: dict[int, str] = {2: "uint16", 4: "uint32", 8: "uint64", 16: "complex128"}


@dataclass(frozen=True)
class StridedMove:
    """The strided descriptions of a plan (see `Strided`), where its move has them with
    innermost runs of at least `STRIDED_MIN_RUN` elements (shorter runs gather faster).

    `inverse`: canonical order -> buffer positions (every move without one has no `StridedMove`);
    `forward`: buffer order -> canonical positions (None where the move pads);
    `pad`: the padding positions of the buffer (None: none, or not strided: use `plan.pad`)."""

    inverse: Strided
    forward: Strided | None
    pad: Strided | None


def _strided_of(index: np.ndarray, min_run: int = 1) -> Strided | None:
    """The `Strided` whose positions, in row-major order, are exactly `index`, or None.

    Peels the innermost dimension off at a time: its size is the longest run from the start
    with a constant step, and every other run must have that size and step; the run starts
    are the next level's positions. Only exact matches are kept (each level is checked over
    all positions), so a move it describes is copied bit-exactly. O(n). `min_run`: None at once
    where the innermost runs are shorter (decided from the first few positions)."""
    if index.size == 0:
        return None
    if min_run > 1:
        head = index[:min_run]
        if head.size > 1 and not (np.diff(head) == 1).all():
            return None
    offset = int(index[0])
    dims: list[tuple[int, int]] = []
    cur = index
    while cur.size > 1:
        step = int(cur[1]) - int(cur[0])
        breaks = np.flatnonzero(np.diff(cur) != step)
        size = int(breaks[0]) + 1 if breaks.size else cur.size
        if cur.size % size or ((breaks + 1) % size).any():
            return None
        cur = cur[::size]  # each run's first position: the next level's positions
        dims.append((size, step))
    if not dims:
        return Strided((1,), (1,), offset)
    dims.reverse()
    return Strided(tuple(d for d, _ in dims), tuple(s for _, s in dims), offset)


#: Shortest innermost run (elements) for which the strided copy beats a gather (bench_forward.py
#: --engines: runs of 1-4 bytes gather faster, runs of 16 bytes and more copy faster).
STRIDED_MIN_RUN = 16


def _strided_move(forward: np.ndarray, inverse: np.ndarray, pad: np.ndarray) -> StridedMove | None:
    inv = _strided_of(inverse, STRIDED_MIN_RUN)
    if inv is None or inv.run < STRIDED_MIN_RUN:  # a gather is faster for short runs
        return None
    move = StridedMove(inv, None if pad.size else _strided_of(forward), _strided_of(pad) if pad.size else None)
    for description, index in ((move.inverse, inverse), (move.forward, forward), (move.pad, pad)):
        _check_describes(description, index)
    return move


def _check_describes(description: Strided | None, index: np.ndarray) -> None:
    """The strided view must reproduce the plan's index exactly at this shape: convert's forward
    and verify's inverse both copy through it, so an error in it would round-trip unseen.
    Checked once per plan by viewing the positions themselves."""
    if description is None:
        return
    positions = np.arange(int(index.max()) + 1 if index.size else 1, dtype=index.dtype)[None]
    seen = description.view(positions).reshape(-1)
    if not np.array_equal(seen, index):
        raise AssertionError(f"strided description {description} does not reproduce its move's index")
