"""The Hopper value layout (triton_kernels `HopperMXValueLayout`, mx_axis=1, mma_version=3, then
the fp4 PACK; layouts/triton.py, docs/layouts.md "TRITON") on the host in one fused pass, numpy
alone, without a gather plan.

The general host path gathers every byte through an 8-byte index (`plan.forward`, ~130 MB per
gpt-oss expert tensor, built at start) and then looks the packed words up: for a 2880-wide
gpt-oss value tensor that was half the CPU of an h100 conversion (bench/README.md). The move
and the PACK have a structure that needs neither: the 4-byte group PACK encodes holds
`D[r, c], D[r+8, c], D[r, c+4], D[r+8, c+4]` (bytes 0..3, `r = 16a + 2t0 + s0`,
`c = 32b + 8k1 + t1`), and PACK is `T01[b0 | b1 << 8] | T23[b2 | b3 << 8]` (triton.py
`_pack_tables`). So:

1. `pairs[a, t0, s0, col] = D[16a + 2t0 + s0, col] | D[16a + 8 + 2t0 + s0, col] << 8`: two
   contiguous passes over the rows (the halves `w0` of each 16-row group);
2. the table lookups read `pairs` through a strided view in the buffer's word order
   `(a, t0, b, s0, t1, k1)` (the index conversion that the lookup needed anyway does the move).

The inverse is the same steps backwards: the words unpacked in buffer order (`U_lo`, `U_hi`),
read as `pairs` through the transposed view, split into the two row halves, the padding checked.
Both give the bytes of `TensorLayout.forward` / `inverse` on every engine
(tests/test_hs_speed_paths.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from mxconvert.core.arith import round_up
from mxconvert.core.parallel import default_jobs, host_buffer

if TYPE_CHECKING:
    import numpy as np
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np

#: Words converted and looked up per block. Smaller blocks keep the intp indices (8 bytes each) in
#: a core's cache; larger ones take the GIL back less often (`_one_of_few`). On the GPU host's 16
#: cores 2^18 laid out 3.2 GB/s on 8 threads where 2^16 gave 1.5, and one thread ran as fast
#: (bench/README.md, "The Hopper pass and the GIL").
_BLOCK_WORDS = 1 << 18
#: Threads inside the pass at once (None: `_default_at_once`).
_AT_ONCE: int | None = None
_gate: threading.BoundedSemaphore | None = None
_gate_lock = threading.Lock()


def _default_at_once() -> int:
    return max(2, default_jobs() // 2)


@contextmanager
def _one_of_few() -> Iterator[None]:
    """Hold one of the pass's places for a call.

    The pass is a Python loop of ~9 numpy calls per block, and each call takes the GIL back when
    its inner loop ends. With every core's thread in the loop, the threads queue for the GIL
    instead of running: on the GPU host's 16 cores the pass laid out 1.56 GB/s on 8 threads and
    0.82 on 16, while 16 processes (no GIL shared) reached 6.2 (bench/README.md, "The Hopper pass
    and the GIL"). The threads waiting here leave their cores to the GIL-free work of the
    conversion (reads, writes, digests)."""
    global _gate
    with _gate_lock:
        if _gate is None:
            _gate = threading.BoundedSemaphore(_AT_ONCE or _default_at_once())
        gate = _gate
    with gate:
        yield


@dataclass(frozen=True)
class HopperValueHost:
    """`hopper_value(n_align, kb_align)` + `HOPPER_PACK` on `[E, N, Kb]` uint8 bytes (a
    `layouts/base.py` `HostMove`). `tables`: PACK's lookup tables `(T01, T23, U_lo, U_hi)`
    (triton.py `_pack_tables`, built once)."""

    n_align: int
    kb_align: int
    tables: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

    def padded(self, n: int, kb: int) -> tuple[int, int]:
        return round_up(n, self.n_align), round_up(kb, self.kb_align)

    # forward ------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, fill: int) -> np.ndarray:
        """The packed buffer `[E, Np/4, 4*Kbp]` (uint8) of the canonical bytes `x` `[E, N, Kb]`,
        padding holding `fill` before the PACK (as `hopper_value`'s `pad_dims`)."""
        with _one_of_few():
            return self._forward(x, fill)

    def _forward(self, x: np.ndarray, fill: int) -> np.ndarray:
        e, n, kb = x.shape
        np_, kbp = self.padded(n, kb)
        if n != np_:  # rows to pad (not at gpt-oss sizes): a padded copy of the canonical bytes
            rows = np.full((e, np_, kb), fill, dtype=np.uint8)
            rows[:, :n] = x
            x = rows
        groups = e * np_ // 16  # 16-row groups `a` of every expert: 4 rows of the buffer each
        halves = np.ascontiguousarray(x).reshape(groups, 2, 8, kb)
        words = host_buffer(e * np_ * kbp).view(np.uint32).reshape(groups, 4 * kbp)
        t01, t23 = self.tables()[:2]
        first, second = _word_sources(kbp)
        step = max(1, _BLOCK_WORDS // (4 * kbp))
        pairs = np.empty((step, 8, kbp), dtype=np.uint16)
        if kbp != kb:
            pairs[:, :, kb:] = fill | (fill << 8)
        lanes = np.empty((step, 4 * kbp), dtype=np.uint16)
        index = np.empty((step, 4 * kbp), dtype=np.intp)
        high = np.empty((step, 4 * kbp), dtype=np.uint32)
        for start in range(0, groups, step):
            stop = min(start + step, groups)
            k = stop - start
            body = pairs[:k, :, :kb]
            np.left_shift(halves[start:stop, 1], 8, out=body, dtype=np.uint16)
            np.bitwise_or(body, halves[start:stop, 0], out=body)
            flat = pairs[:k].reshape(k, 8 * kbp)
            np.take(flat, first, axis=1, out=lanes[:k], mode="clip")  # in range by construction
            np.copyto(index[:k], lanes[:k])
            np.take(t01, index[:k], out=words[start:stop], mode="clip")  # uint16 indices: in range
            np.take(flat, second, axis=1, out=lanes[:k], mode="clip")
            np.copyto(index[:k], lanes[:k])
            np.take(t23, index[:k], out=high[:k], mode="clip")
            words[start:stop] |= high[:k]
        return words.view(np.uint8).reshape(e, np_ // 4, 4 * kbp)

    # inverse ------------------------------------------------------------------------------------
    def inverse(self, buffer: np.ndarray, element_shape: tuple[int, ...], fill: int) -> tuple[np.ndarray, int | None]:
        """The canonical bytes `[E, N, Kb]` of a packed buffer, and the first expert whose padding
        does not hold `fill` (None where every expert's does; the bytes are then meaningless)."""
        with _one_of_few():
            return self._inverse(buffer, element_shape, fill)

    def _inverse(self, buffer: np.ndarray, element_shape: tuple[int, ...], fill: int) -> tuple[np.ndarray, int | None]:
        e, n, kb = element_shape
        np_, kbp = self.padded(n, kb)
        groups = e * np_ // 16
        words = np.ascontiguousarray(buffer).reshape(-1).view(np.uint32).reshape(groups, 4 * kbp)
        u_lo, u_hi = self.tables()[2:]
        source = _pair_sources(kbp)
        full = host_buffer(e * np_ * kbp).reshape(groups, 2, 8 * kbp)
        step = max(1, _BLOCK_WORDS // (4 * kbp))
        index = np.empty((step, 4 * kbp), dtype=np.intp)
        decoded = np.empty((step, 4 * kbp), dtype=np.uint32)
        high = np.empty((step, 4 * kbp), dtype=np.uint32)
        pairs = np.empty((step, 8 * kbp), dtype=np.uint16)
        for start in range(0, groups, step):
            stop = min(start + step, groups)
            k = stop - start
            block = words[start:stop]
            np.bitwise_and(block, 0xFFFF, out=index[:k], casting="unsafe")
            np.take(u_lo, index[:k], out=decoded[:k], mode="clip")  # 16-bit indices: in range
            np.right_shift(block, 16, out=index[:k], casting="unsafe")
            np.take(u_hi, index[:k], out=high[:k], mode="clip")
            decoded[:k] |= high[:k]
            # each decoded word holds the pair of its low lane (w1 = 0) and of its high lane
            np.take(decoded[:k].view(np.uint16), source, axis=1, out=pairs[:k], mode="clip")
            np.bitwise_and(pairs[:k], 0xFF, out=full[start:stop, 0], casting="unsafe")
            np.right_shift(pairs[:k], 8, out=full[start:stop, 1], casting="unsafe")
        canonical = full.reshape(e, np_, kbp)
        return canonical[:, :n, :kb], _wrong_padding(canonical, n, kb, fill)


@lru_cache(maxsize=8)
def _word_sources(kbp: int) -> tuple[np.ndarray, np.ndarray]:
    """For the words of one 16-row group in buffer order `(t0, b, s0, t1, k1)`: the positions in
    its pairs `[4 t0, 2 s0, Kbp]` (flat; column `32b + 8k1 + 4w1 + t1`) of the pair PACK reads
    as bytes 0-1 (w1 = 0) and as bytes 2-3 (w1 = 1)."""
    grid = np.arange(8 * kbp, dtype=np.intp).reshape(4, 2, kbp // 32, 4, 2, 4)  # (t0, s0, b, k1, w1, t1)
    by_word = grid.transpose(0, 2, 1, 5, 3, 4)  # (t0, b, s0, t1, k1, w1)
    return np.ascontiguousarray(by_word[..., 0]).reshape(-1), np.ascontiguousarray(by_word[..., 1]).reshape(-1)


@lru_cache(maxsize=8)
def _pair_sources(kbp: int) -> np.ndarray:
    """The inverse of `_word_sources`: for each pair of a 16-row group (flat, `(t0, s0, Kbp)`),
    its position among the group's decoded words read as 16-bit lanes (word * 2 + w1)."""
    first, second = _word_sources(kbp)
    source = np.empty(8 * kbp, dtype=np.intp)
    lanes = np.arange(4 * kbp, dtype=np.intp) * 2
    source[first] = lanes
    source[second] = lanes + 1
    return source


def _wrong_padding(full: np.ndarray, n: int, kb: int, fill: int) -> int | None:
    e, np_, kbp = full.shape
    wrong = np.zeros(e, dtype=bool)
    if kbp != kb:
        wrong |= (full[:, :, kb:] != fill).reshape(e, -1).any(axis=1)
    if np_ != n:
        wrong |= (full[:, n:, :] != fill).reshape(e, -1).any(axis=1)
    return int(np.argmax(wrong)) if wrong.any() else None
