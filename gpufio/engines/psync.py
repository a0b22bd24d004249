"""psync: one pread (or pwrite) at a time per worker, like fio's psync engine and gdsio -x 1.

The simplest CPU path and the floor every other engine is compared against. Each of the
numjobs workers is its own process (see gpufio.run.launch), so they overlap their I/O.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.targets import aligned_buffer
from gpufio.core.tensors import Extent, TensorRequest, TensorSupport, piece_error, pieces, sync_files
from gpufio.engines import register
from gpufio.engines.base import Engine

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target

BATCH = 64


@register
class Psync(Engine):
    """Synchronous reads into (writes from) page-aligned host memory, one in flight per
    worker."""

    name = "psync"
    summary = "CPU workers, pread/pwrite on host memory, one I/O in flight per worker"
    peer = "fio psync, gdsio -x 1"
    iodepth_means = "ignored: one read in flight per worker, as fio's psync"
    fio_engines = {"psync": "", "sync": "ioengine=sync runs as psync (pread instead of read)",
                   "pvsync": "ioengine=pvsync runs as psync (pread instead of preadv)"}

    tensors = TensorSupport(gpu=False)

    @classmethod
    def tensor_mover(cls, job: Job, files: list[Target], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> "PsyncTensors":
        return PsyncTensors(files, extents, request)

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        """psync keeps one I/O in flight whatever iodepth says; the result says so."""
        return {**super().describe(job), "effective_iodepth": 1}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        self._mem = aligned_buffer(BATCH * job.bs)
        self._buf = np.frombuffer(self._mem, dtype=np.uint8).reshape(BATCH, job.bs)
        # one ready-made iovec list per slot: preadv takes a list of buffers
        self._iovs = [[memoryview(self._mem)[i * job.bs:(i + 1) * job.bs]] for i in range(BATCH)]

    def run(self) -> None:
        ctx = self.ctx
        fds = [t.fd for t in self.targets]
        clock = time.perf_counter_ns
        calls = (os.preadv, os.pwritev)
        while True:
            tgt, offs = ctx.next_batch(BATCH)
            n = len(offs)
            if n == 0:
                return
            writes = ctx.last_writes()
            if writes is not False:
                ctx.fill(self._buf[:n], tgt, offs)  # reads land over the rows they use
            kinds = ctx.write_flags(n)
            lat, res = [], []
            for t, off, iov, w in zip(tgt.tolist(), offs.tolist(), self._iovs, kinds):
                t0 = clock()
                try:
                    r = calls[w](fds[t], iov, off)
                except OSError as e:
                    r = -e.errno
                lat.append(clock() - t0)
                res.append(r)
                if w and ctx.sync_due(1):
                    ctx.sync(fds)
            results = np.array(res, dtype=np.int32)
            if writes is not True:
                read = slice(None) if writes is False else ~writes
                ctx.verify(self._buf[:n][read], tgt[read], offs[read], results[read])
            ctx.complete(np.array(lat, dtype=np.int64), tgt, results, writes)

    def close(self) -> None:
        self._iovs.clear()
        self._buf = None
        self._mem.close()


class PsyncTensors:
    """Shards in host memory saved with one pwrite per piece and restored with one preadv
    per piece, straight from and into the shards, one piece at a time."""

    def __init__(self, files: list[Target], extents: list[Extent], request: TensorRequest) -> None:
        self._fds = [f.fd for f in files]
        self._paths = [f.path for f in files]
        self._extents = extents
        self._pieces = pieces(extents, request.chunk)
        self.page_cache = not request.direct
        self.facts: dict[str, Any] = {"chunk": request.chunk, "iodepth": 1}

    def _move(self, tensors: Any, write: bool) -> int:
        first = 0
        for piece in self._pieces.tolist():
            e, at, off, n = piece
            fd, view = self._fds[self._extents[e].file], tensors[e][at:at + n]
            try:
                got = os.pwrite(fd, view, off) if write else os.preadv(fd, [view], off)
            except OSError as err:
                got = -err.errno
            if got != n:
                raise piece_error("save" if write else "restore", self._extents, self._paths,
                                  piece, got)
            first = first or time.perf_counter_ns()
        return first

    def save(self, tensors: Any) -> int:
        return self._move(tensors, True)

    def sync(self) -> None:
        sync_files(self._fds)

    def restore(self, tensors: Any) -> int:
        return self._move(tensors, False)

    def close(self) -> None:
        """The files belong to the workload, which closes them."""
