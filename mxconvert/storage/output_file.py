"""An artifact file written once, front to back, past the page cache where the filesystem allows.

Buffered `write()` copies every byte into the page cache, and the fsync before the rename
(pipeline/durable.py) then makes the kernel allocate, write and free those pages. On the 2-core
machine that was 2-5 CPU seconds for 1.9 GB, more than the conversion's layouts, taken from the
cores the layouts need (bench/README.md, "Direct writes"). With `O_DIRECT` the disk reads the
bytes from our own buffers: they are copied once in user space into an aligned block, and the
block goes to the disk on a thread of its own while the next one fills.

`O_DIRECT` asks for aligned memory, offsets and lengths. The blocks are page-aligned mappings of
`BLOCK_BYTES` (a multiple of 4096, the largest logical block size of common disks) written at
multiples of their size; the last, partial block is padded with zeros to 4096 bytes and the file
is then truncated to its size. Where the flag is missing (not Linux) or refused (tmpfs, some FUSE
and network filesystems: EINVAL at open or at the first write), the file is written through the
page cache instead, the same bytes; `direct=False` asks for that (`convert --write-mode`,
pipeline/durable.py `direct_writes`).
Durability is not this module's job: `sync_tree` fsyncs every file either way (O_DIRECT bypasses
the page cache, not the disk's own cache or the file's metadata).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.arith import round_up

if TYPE_CHECKING:
    import numpy as np
else:  # imported with the first file written (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np

#: Bytes per write. 8 MiB blocks, three in flight, wrote 1.9 GB at 1.45 GB/s on the 2-core machine
#: and 1.6-1.7 GB/s on the GPU host; 4-32 MiB blocks, 2-16 in flight, were within noise of it
#: there, in converts too (bench/bench_direct_io.py; bench/README.md, "Direct writes").
BLOCK_BYTES = 8 << 20
#: Blocks being written while the next one fills.
IN_FLIGHT = 3
#: Alignment of memory, offsets and lengths that O_DIRECT gets.
ALIGN = 4096


class OutputFile:
    """Append-only writer of one new file (created or truncated), `O_DIRECT` where possible.

    `write` copies the bytes into the current block (they may change once it returns); `close`
    writes what is left, truncates the padding and closes, raising the first write's error;
    `abort` closes without caring. `direct` says whether the bytes went past the page cache.

    Example:
        >>> f = OutputFile(Path("/tmp/x.bin"))
        >>> f.write(memoryview(b"abc"))
        >>> f.close()
    """

    def __init__(self, path: Path, direct: bool = True) -> None:
        self.path = path
        self.size = 0
        self.direct = False
        self._blocks = [mmap.mmap(-1, BLOCK_BYTES) for _ in range(IN_FLIGHT + 1)]  # before the file: no leak
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self._fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(path, flags | os.O_DIRECT, 0o666)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # the filesystem refuses O_DIRECT: buffered below
                    raise
        if self._fd < 0:
            self._fd = os.open(path, flags, 0o666)  # as open(path, "wb"): the umask decides
        self._arrays = [np.frombuffer(block, dtype=np.uint8) for block in self._blocks]
        self._pending: list[Future | None] = [None] * len(self._blocks)
        self._current = 0
        self._fill = 0
        self._lock = threading.Lock()  # the switch to buffered writes, from any writing thread
        self._pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="mxconvert-write")
        self._closed = False
        self._offset = 0  # where the current block goes in the file

    def write(self, data: memoryview) -> None:
        """Append `data` (bytes-like, any alignment)."""
        source = np.frombuffer(data, dtype=np.uint8)
        pos = 0
        while pos < source.size:
            n = min(BLOCK_BYTES - self._fill, source.size - pos)
            np.copyto(self._arrays[self._current][self._fill : self._fill + n], source[pos : pos + n])
            self._fill += n
            pos += n
            self.size += n
            if self._fill == BLOCK_BYTES:
                self._send()

    def _send(self) -> None:
        """Queue the current block (its `_fill` bytes) and move on to the next free one."""
        self._pending[self._current] = self._pool.submit(self._put, self._current, self._fill, self._offset)
        self._offset += self._fill
        self._current = (self._current + 1) % len(self._blocks)
        self._fill = 0
        waiting = self._pending[self._current]
        if waiting is not None:  # the block is free again once its bytes are written
            self._pending[self._current] = None
            waiting.result()

    def _put(self, index: int, length: int, offset: int) -> None:
        """Write block `index`'s first `length` bytes at `offset`, all of them (pwrite may write
        fewer); a direct write of a partial block writes its zero padding too."""
        with memoryview(self._blocks[index]) as view:  # released even where a write raises
            self._put_view(view, length, offset)

    def _put_view(self, view: memoryview, length: int, offset: int) -> None:
        done = 0
        while done < length:
            rest = length - done
            try:
                wrote = os.pwrite(
                    self._fd, view[done : done + (round_up(rest, ALIGN) if self.direct else rest)], offset + done
                )
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._to_buffered()  # O_DIRECT accepted at open, refused for this write
                continue
            if wrote <= 0:
                raise OSError(errno.EIO, "the disk took no bytes", str(self.path))
            done += wrote
            if done < length:
                self._to_buffered()  # a short direct write leaves an unaligned rest

    def _to_buffered(self) -> None:
        with self._lock:
            if self.direct:
                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False

    def close(self) -> None:
        """Write the rest, cut the padding, close; raises the first failed write's OSError."""
        if self._closed:
            return
        try:
            if self._fill:
                fill = self._fill
                self._arrays[self._current][fill : round_up(fill, ALIGN)] = 0
                self._send()
            self._wait()
            if os.fstat(self._fd).st_size != self.size:  # the last block's padding
                os.ftruncate(self._fd, self.size)
        finally:
            self._release()

    def abort(self) -> None:
        """Close after a failure: wait for the writes in flight, ignoring their errors."""
        if not self._closed:
            self._release()

    def _wait(self) -> None:
        for index, pending in enumerate(self._pending):
            if pending is not None:
                self._pending[index] = None
                pending.result()

    def _release(self) -> None:
        """Stop the writes not started, wait for those running (their blocks are unmapped next)."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending = [None] * len(self._blocks)
        os.close(self._fd)
        self._arrays.clear()
        for block in self._blocks:
            try:
                block.close()
            except BufferError:  # still viewed (a traceback's frame): unmapped when collected
                pass
