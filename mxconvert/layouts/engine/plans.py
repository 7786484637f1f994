"""Gather plans: a layout's move as gather indices, built once per shape and cached.

A move (`arrange`, layouts/base.py) only moves elements and pads, so run on the positions
`0..n-1` of one expert (fill -1; a numpy `Positions`, positions.py) it yields the gather index
of the whole move. `GatherPlan` holds that index, its inverse, the padding positions and, where
the move has one, its strided description (strided.py). Plans are built under a lock per plan
(`gather_plan`, `ready_plan`) and cached; `device_index` keeps a plan's indices on a torch device.
moves.py runs the plans on numpy arrays.

The engine reads two things of a layout (`Move`): its move and how its canonical tensor is split
into moved elements. It imports numpy when a plan is first built, torch only for `expert_index`
and `device_index`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from mxconvert.core.dtypes import DType
from mxconvert.layouts.engine.positions import Positions
from mxconvert.layouts.engine.strided import Strided, StridedMove, _check_describes, _strided_move, _strided_of

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a plan is first built: planning only builds layouts (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch

#: A move: `arrange(x, fill)` moves the elements of `x` (`[E, ...]`) and pads with `fill`. Run on
#: torch tensors, `ShapeOnly` (shapes.py) and `Positions` alike, hence typed loosely here.
MoveFn = Callable[[Any, int], Any]


class _SplitsShape(Protocol):
    def split_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]: ...


class Move(Protocol):
    """What the engine reads of a layout (layouts/base.py `TensorLayout`): its move, and the split
    that turns its canonical tensor into the elements moved (a plan depends on shapes alone)."""

    @property
    def arrange(self) -> MoveFn: ...

    @property
    def split(self) -> _SplitsShape: ...

    @property
    def needs_plan(self) -> bool:
        """False where the host runs the move without a plan (a fused host move): not prepared."""
        ...


@dataclass(frozen=True)
class GatherPlan:
    """The move of one expert as gather indices (numpy intp), built once per shape and cached.

    `forward[i]`: element of the (split) canonical expert that buffer position i holds, or `n`
    (one past the end: the pad slot). `inverse[j]`: buffer position of canonical element j.
    `pad`: the buffer positions that are padding. `strided`: the same move as strided views,
    where it is one (found from the indices themselves, so it is exact by construction)."""

    forward: np.ndarray
    inverse: np.ndarray
    pad: np.ndarray
    arranged_shape: tuple[int, ...]
    #: Average length of the runs of consecutive source elements the move keeps together.
    mean_run: float
    strided: StridedMove | None = None
    #: Elements the move keeps together in aligned blocks (8, 4, 2 or 1): it then also moves
    #: `unit`-element words, by the word indices `forward_units` / `inverse_units` (`unit`
    #: times shorter; a padding word is `n // unit`). The 128x4 scale swizzles move 4-byte words.
    unit: int = 1
    forward_units: np.ndarray | None = None
    inverse_units: np.ndarray | None = None
    #: The padding positions as one strided view, where they are one (whatever engine moves the
    #: rest): filling and checking the padding then reads no index. The padded 128x4 scale
    #: swizzles gather, but their padding is whole 512-byte blocks or strided runs; numpy's
    #: fancy-index fill cost ~5 ns per pad byte there (bench/CHANGELOG.md, "Session 5").
    pad_strided: Strided | None = None

    def word_dtype(self, itemsize: int) -> np.dtype | None:
        """The numpy dtype of one `unit`-element word of elements of `itemsize` bytes, or None
        where the move has no unit or the word is wider than 8 bytes."""
        width = self.unit * itemsize
        return np.dtype(f"u{width}") if self.unit > 1 and width in (2, 4, 8) else None

    @property
    def fine_grained(self) -> bool:
        """Moves of short runs (single bytes, 4-byte scale groups) are faster as one gather;
        moves of whole rows or padding only are faster as torch's strided copy (measured in
        bench/bench_layouts.py)."""
        return self.mean_run < 16

    @property
    def engine(self) -> str:
        """How `forward` / `inverse` run this move on the host by default: "strided" (one numpy
        copy through `strided`) for moves with a strided description (innermost runs of at
        least `STRIDED_MIN_RUN` elements); "gather" for moves of short runs; "arrange" (the arrange function
        itself, for moves of long runs without a strided description). Measured in
        bench/bench_forward.py --engines."""
        if self.strided is not None:
            return "strided"
        return "gather" if self.fine_grained else "arrange"


_PLAN_LOCKS: dict[tuple, threading.Lock] = {}
_PLAN_LOCKS_LOCK = threading.Lock()


def gather_plan(layout: Move, expert_shape: tuple[int, ...]) -> GatherPlan:
    """The cached plan; each built once under its own lock, so that the workers of a conversion,
    which all ask for it at their first chunk, do not each build it (time, and ~40 bytes per
    element of transient memory), while different plans can be built at the same time."""
    key = (layout.arrange, tuple(expert_shape))
    with _plan_lock(key):
        return _gather_plan(*key)


def ready_plan(layout: Move, expert_shape: tuple[int, ...]) -> GatherPlan | None:
    """`gather_plan`, or None while another thread is building that plan (never waits for it)."""
    key = (layout.arrange, tuple(expert_shape))
    lock = _plan_lock(key)
    if not lock.acquire(blocking=False):
        return None
    try:
        return _gather_plan(*key)
    finally:
        lock.release()


def _plan_lock(key: tuple) -> threading.Lock:
    with _PLAN_LOCKS_LOCK:
        return _PLAN_LOCKS.setdefault(key, threading.Lock())


@lru_cache(maxsize=32)
def _gather_plan(arrange: MoveFn, expert_shape: tuple[int, ...]) -> GatherPlan:
    """Run the move on the positions `arange(n)` (fill -1; a numpy `Positions`, no torch): the
    result is the gather index of the move."""
    n = math.prod(expert_shape)
    # int32 where it holds every position: half the bytes the arrange steps move
    dtype = np.int32 if n < 2**31 else np.int64
    # numpy positions, not a torch arange: the host path plans without importing torch (positions.py)
    positions = Positions(np.arange(n, dtype=dtype).reshape(1, *expert_shape))
    arranged: Positions = arrange(positions, -1)  # a move run on positions (it stands in for a tensor)
    index = arranged.flat().astype(np.intp)
    is_pad = index < 0
    padded = bool(is_pad.any())  # many moves do not pad: no mask, compress or where for them
    holds = ~is_pad if padded else None
    kept = np.flatnonzero(holds) if holds is not None else None  # buffer positions holding an element
    covered = index[holds] if holds is not None else index  # a mask compress: faster than index[kept]
    if covered.size != n or covered.min(initial=0) < 0 or covered.max(initial=-1) >= n:
        raise AssertionError("arrange step is not a permutation of its input plus padding")
    inverse = np.full(n, -1, dtype=np.intp)
    inverse[covered] = kept if kept is not None else np.arange(n, dtype=np.intp)
    if (inverse < 0).any():  # n positions in range fill all n slots only if distinct: a permutation
        raise AssertionError("arrange step is not a permutation of its input plus padding")
    forward = np.where(is_pad, n, index) if padded else index
    breaks = int(np.count_nonzero(np.diff(covered) != 1)) + 1
    pad = np.flatnonzero(is_pad) if padded else np.empty(0, dtype=np.intp)
    arranged_shape = tuple(arranged.shape[1:])
    del arranged, index, is_pad, holds, covered, kept  # freed before the strided and word searches' temporaries
    strided = _strided_move(forward, inverse, pad)
    # word indices only where the gather is what runs (a strided move never gathers)
    units = _units(forward, inverse, n) if strided is None else (1, None, None)
    return GatherPlan(
        forward, inverse, pad, arranged_shape, n / breaks, strided, *units, pad_strided=_pad_strided(strided, pad)
    )


def _pad_strided(strided: StridedMove | None, pad: np.ndarray) -> Strided | None:
    """The padding positions as one `Strided` (checked against `pad`), or None."""
    if strided is not None:
        return strided.pad  # found (and checked) with the move's own description
    found = _strided_of(pad)
    _check_describes(found, pad)
    return found


def _units(forward: np.ndarray, inverse: np.ndarray, n: int) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """The largest `unit` in (8, 4, 2) such that the move takes every aligned block of `unit`
    buffer positions from one aligned block of `unit` canonical elements, in order (or pads the
    whole block), with the word indices; (1, None, None) where there is none."""
    for unit in (8, 4, 2):
        if n % unit or forward.size % unit:
            continue
        blocks = forward.reshape(-1, unit)
        if not _whole_blocks(blocks[:64], n, unit):  # most moves fail at once: no full pass
            continue
        if not _whole_blocks(blocks, n, unit):
            continue
        return unit, blocks[:, 0] // unit, inverse[::unit] // unit
    return 1, None, None


def _whole_blocks(blocks: np.ndarray, n: int, unit: int) -> bool:
    """Every row of `blocks` (forward indices, `unit` per row) is either all padding (n) or
    `unit`-aligned consecutive canonical positions."""
    first = blocks[:, 0]
    pad = first == n
    if (first % unit).any():  # n % unit == 0, so padding rows pass this
        return False
    return all(np.array_equal(blocks[:, j], np.where(pad, n, first + j)) for j in range(1, unit))


def prepare(layout: Move, canonical_shape: tuple[int, ...], dtype: DType | torch.dtype) -> None:
    """Build (and cache) the plan `forward`/`inverse` will use for chunks of this shape, so that
    the plans of all tensors can be built in parallel before the first chunk. The split shape
    comes from `Split.split_shape` (the plan depends on shapes alone; `dtype` is not needed), so
    this imports numpy only, never torch."""
    gather_plan(layout, layout.split.split_shape(tuple(canonical_shape))[1:])  # shapes only: no torch


def prepare_all(tensors: Mapping[str, Move], specs: dict, jobs: int) -> None:
    """`prepare` every layout of `tensors` for its canonical spec in `specs`, on `jobs` threads."""
    from concurrent.futures import ThreadPoolExecutor

    work = [
        (layout, (1, *specs[name][1][1:]), specs[name][0])
        for name, layout in tensors.items()
        if name in specs and layout.needs_plan
    ]
    if jobs <= 1 or len(work) <= 1:
        for item in work:
            prepare(*item)
        return
    with ThreadPoolExecutor(min(jobs, len(work))) as pool:
        list(pool.map(lambda item: prepare(*item), work))


def expert_index(layout: Move, expert_shape: tuple[int, ...]) -> torch.Tensor:
    """Flat gather index of one expert: position in buffer → position in canonical, -1 = padding."""
    plan = gather_plan(layout, expert_shape)
    return torch.from_numpy(np.where(plan.forward == math.prod(expert_shape), -1, plan.forward).astype(np.int64))


@dataclass(frozen=True)
class DeviceIndex:
    """A plan's inverse and padding indices as torch tensors on one device (int32 where they fit:
    half the bytes the gather reads), for `inverse` off the host."""

    inverse: torch.Tensor
    pad: torch.Tensor | None


_DEVICE_INDEX: dict[tuple[int, str], _DeviceEntry] = {}
_DEVICE_INDEX_LOCK = threading.Lock()


def device_index(plan: GatherPlan, device: torch.device) -> DeviceIndex:
    """The cached `DeviceIndex` of `plan` on `device` (plans themselves are cached, so each is
    copied to a device once; a host "device" is allowed, for the tests of the portable path)."""
    key = (id(plan), str(device))
    with _DEVICE_INDEX_LOCK:
        found = _DEVICE_INDEX.get(key)
        if found is None or found.plan is not plan:
            dtype = torch.int32 if plan.inverse.size < 2**31 else torch.int64

            def put(a: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(a.astype(np.int64)).to(dtype).to(device)

            found = _DeviceEntry(plan, DeviceIndex(put(plan.inverse), put(plan.pad) if plan.pad.size else None))
            if device.type == "cuda":  # the copies are done before another thread's stream reads them
                torch.cuda.synchronize(device)
            _DEVICE_INDEX[key] = found
        return found.index


@dataclass(frozen=True)
class _DeviceEntry:
    plan: GatherPlan  # kept alive with its entry, so that `id(plan)` is never reused for another
    index: DeviceIndex
