"""Probe, measured and dropped (session 16): the Hopper value pass (`layouts/hopper_host.py`) in
worker processes fed through pipes, so that no GIL is shared. `install(n)` starts `n` workers (a
fresh interpreter each, `python -c WORKER`) and points `HopperValueHost.forward` at them; each
call sends the canonical bytes down a worker's stdin and reads the packed words back from its
stdout. Nothing is written to any file (no shared memory segment could outlive a killed run).

On the GPU machine's H100 host it made every h100 convert slower (1.89-2.40 s against 1.41-1.66 s
in process, `results/hopper-processes-h100/convert.txt`): starting the interpreters and numpy
costs more than the pass loses to the GIL. Run by `tools/gpu_check/hopper_processes_run.sh`.
"""

from __future__ import annotations

import fcntl
import os
import queue
import struct
import subprocess
import sys

import numpy as np

HEAD = struct.Struct("<6q")  # experts, rows, bytes a row, fill, row alignment, byte alignment
F_SETPIPE_SZ = 1031

WORKER = r"""
import os, signal, struct, sys
import numpy as np
from mxconvert.layouts.hopper_host import HopperValueHost
from mxconvert.layouts.triton import _pack_tables
HEAD = struct.Struct("<6q")
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends us by closing stdin

def read_exactly(n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(0, [view[got:]])
        if k == 0:
            sys.exit(0)
        got += k
    return buf

while True:
    e, n, kb, fill, n_align, kb_align = HEAD.unpack(read_exactly(HEAD.size))
    x = np.frombuffer(read_exactly(e * n * kb), dtype=np.uint8).reshape(e, n, kb)
    y = memoryview(np.ascontiguousarray(HopperValueHost(n_align, kb_align, _pack_tables)._forward(x, fill)).reshape(-1))
    done = 0
    while done < len(y):
        done += os.write(1, y[done:])
"""


class Workers:
    """`count` worker processes; a calling thread takes an idle one for the length of a call."""

    def __init__(self, count: int) -> None:
        self.idle: queue.Queue[subprocess.Popen] = queue.Queue()
        for _ in range(count):
            proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for pipe in (proc.stdin, proc.stdout):
                try:
                    fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, 1 << 20)  # fewer, larger pipe transfers
                except OSError:
                    pass
            self.idle.put(proc)

    def forward(self, host, x: np.ndarray, fill: int) -> np.ndarray:
        from mxconvert.core.parallel import host_buffer

        e, n, kb = x.shape
        np_, kbp = host.padded(n, kb)
        proc = self.idle.get()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            source = memoryview(np.ascontiguousarray(x).reshape(-1))
            to_worker, from_worker = proc.stdin.fileno(), proc.stdout.fileno()
            os.write(to_worker, HEAD.pack(e, n, kb, fill, host.n_align, host.kb_align))
            done = 0
            while done < len(source):
                done += os.write(to_worker, source[done:])
            out = host_buffer(e * np_ * kbp)
            view, got = memoryview(out).cast("B"), 0
            while got < len(view):
                k = os.readv(from_worker, [view[got:]])
                if k == 0:
                    raise RuntimeError("a Hopper worker ended")
                got += k
        finally:
            self.idle.put(proc)
        return out.reshape(e, np_ // 4, 4 * kbp)


def install(count: int) -> Workers:
    """Route every `HopperValueHost.forward` of this process through `count` workers."""
    import mxconvert.layouts.hopper_host as hopper_host

    workers = Workers(count)
    hopper_host.HopperValueHost.forward = lambda self, x, fill: workers.forward(self, x, fill)  # type: ignore[method-assign]
    return workers
