"""psync: one pread at a time per worker thread, like fio's psync engine and gdsio -x 1.

The simplest CPU path and the floor every other engine is compared against. preadv releases
the GIL, so numjobs threads overlap their I/O even though Python drives each one.
"""

from __future__ import annotations

import os
import time

import numpy as np

from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.targets import aligned_buffer

BATCH = 64


@register
class Psync(Engine):
    """Synchronous reads into page-aligned host memory, one in flight per thread."""

    name = "psync"
    summary = "CPU threads, pread into host memory, one I/O in flight per thread"
    peer = "fio psync, gdsio -x 1"

    @classmethod
    def describe(cls, job) -> dict:
        """psync keeps one I/O in flight whatever iodepth says; the result says so."""
        return {**super().describe(job), "effective_iodepth": 1}

    def __init__(self, job, targets, ctx) -> None:
        super().__init__(job, targets, ctx)
        self._mem = aligned_buffer(BATCH * job.bs)
        self._buf = np.frombuffer(self._mem, dtype=np.uint8).reshape(BATCH, job.bs)
        self._slots = [memoryview(self._mem)[i * job.bs:(i + 1) * job.bs] for i in range(BATCH)]

    def run(self) -> None:
        fds = [t.fd for t in self.targets]
        clock = time.perf_counter_ns
        lat = np.empty(BATCH, dtype=np.int64)
        res = np.empty(BATCH, dtype=np.int32)
        while True:
            tgt, offs = self.ctx.next_batch(BATCH)
            n = len(offs)
            if n == 0:
                return
            for i, (t, off) in enumerate(zip(tgt.tolist(), offs.tolist())):
                t0 = clock()
                try:
                    res[i] = os.preadv(fds[t], [self._slots[i]], off)
                except OSError as e:
                    res[i] = -e.errno
                lat[i] = clock() - t0
            self.ctx.verify(self._buf[:n], tgt, offs, res[:n])
            self.ctx.complete(lat[:n], tgt, res[:n])

    def close(self) -> None:
        self._slots.clear()
        self._buf = None
        self._mem.close()
