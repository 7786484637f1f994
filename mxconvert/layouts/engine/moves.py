"""Running a gather plan (plans.py) on the host's numpy arrays, and the bits of a torch tensor.

`forward`: a chunk of canonical elements `[E, n]` into the buffer `[E, buffer size]`, by one
gather of the plan's forward index or one strided copy; the padding is then filled with the
layout's pad value. `scatter`: back (the inverse), after `wrong_padding` found every padding position holding
the pad value (the caller refuses the buffer otherwise: layouts/errors.py `PaddingError`).

This module imports numpy when a plan first runs; torch only for `as_int`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mxconvert.core.bits import BITS_BY_SIZE
from mxconvert.core.dtypes import TorchDTypes
from mxconvert.core.parallel import host_buffer
from mxconvert.layouts.engine.plans import GatherPlan

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a plan first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np


def wrong_padding(flat: np.ndarray, plan: GatherPlan, pad_value: int) -> int | None:
    """The first expert of `flat` (`[E, buffer size]`) whose padding does not hold `pad_value`,
    or None where every expert's does."""
    if not plan.pad.size:
        return None
    pad = _pad_values(flat, plan)
    wrong = (pad != pad.dtype.type(pad_value)).reshape(flat.shape[0], plan.pad.size).any(axis=1)
    return int(np.argmax(wrong)) if wrong.any() else None


def scatter(flat: np.ndarray, plan: GatherPlan, strided: bool = False) -> np.ndarray:
    """`[E, canonical size]` from `[E, buffer size]`: one strided copy where `strided` and the
    plan has a strided description, else one gather of the inverse index."""
    if strided and plan.strided is not None:
        words = np.ascontiguousarray(plan.strided.inverse.word_view(flat))
        return words.view(flat.dtype).reshape(flat.shape[0], plan.inverse.size)
    return gather_inverse(flat, plan)


def _fill_pad(out: np.ndarray, plan: GatherPlan, value: int) -> None:
    if plan.pad_strided is not None:
        plan.pad_strided.view(out)[...] = value
    else:
        for row in out:  # a 1-D fancy assignment per expert: ~4x faster than one 2-D one
            row[plan.pad] = value


def _pad_values(flat: np.ndarray, plan: GatherPlan) -> np.ndarray:
    """The values at the padding positions of every expert of `flat` (`[E, buffer size]`)."""
    if plan.pad_strided is not None:
        return plan.pad_strided.view(flat)
    return np.take(flat, plan.pad, axis=1)


def gather_forward(src: np.ndarray, plan: GatherPlan, pad_value: int) -> np.ndarray:
    """`[E, buffer size]` by one gather of the forward index (of words, where the move keeps
    aligned words together); padding positions (index n) read a clipped position and are then
    overwritten with the pad value (no padded copy of the source)."""
    word = plan.word_dtype(src.itemsize)
    experts = src.shape[0]
    if word is not None and plan.forward_units is not None:
        units = src.view(word)
        words = _buffer((experts, plan.forward_units.size), units.dtype)
        out = np.take(units, plan.forward_units, axis=1, mode="clip", out=words).view(src.dtype)
    else:
        # "clip" writes straight into `out` ("raise" would gather into a buffer of its own and
        # copy): a padding slot (index n) reads a clipped position, overwritten below, and without
        # padding the index is a permutation of 0..n-1, checked when the plan was built (plans.py)
        out = np.take(src, plan.forward, axis=1, mode="clip", out=_buffer((experts, plan.forward.size), src.dtype))
    if plan.pad.size:
        _fill_pad(out, plan, pad_value)
    return out


def gather_inverse(flat: np.ndarray, plan: GatherPlan) -> np.ndarray:
    """`[E, canonical size]` by one gather of the inverse index (of words where it can)."""
    word = plan.word_dtype(flat.itemsize)
    if word is not None and plan.inverse_units is not None:
        return np.take(flat.view(word), plan.inverse_units, axis=1).view(flat.dtype)
    return np.take(flat, plan.inverse, axis=1)


def strided_forward(src: np.ndarray, plan: GatherPlan, pad_value: int) -> np.ndarray:
    """`[E, buffer size]` by one strided copy: a strided read in buffer order where the move does
    not pad (no copy at all where it is the identity), else a strided write of the canonical
    elements into the buffer and the pad value into its padding."""
    move = plan.strided
    assert move is not None
    experts = src.shape[0]
    if move.forward is not None:
        view = move.forward.word_view(src)
        if view.flags.c_contiguous:
            return view.view(src.dtype).reshape(experts, plan.forward.size)  # the identity: no copy
        words = _buffer(view.shape, view.dtype)
        np.copyto(words, view)
        return words.view(src.dtype).reshape(experts, plan.forward.size)
    out = _buffer((experts, plan.forward.size), src.dtype)
    target = move.inverse.word_view(out)
    target[...] = src.view(target.dtype).reshape(target.shape)
    _fill_pad(out, plan, pad_value)
    return out


def _buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array for a chunk's result: from the conversion's buffer
    pool (core/parallel.py `host_buffer`: no fresh pages per chunk), every element then written."""
    count = 1
    for n in shape:
        count *= n
    return host_buffer(count * dtype.itemsize).view(dtype).reshape(shape)


_INT_OF_SIZE = TorchDTypes(BITS_BY_SIZE)


def as_int(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as an integer tensor of the same element width (bf16, fp8 included), on
    its device: the torch gather and the padding comparison then work for every dtype."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])
