"""psync: one pread (or pwrite) at a time per worker, like fio's psync engine and gdsio -x 1.

The simplest CPU path and the floor every other engine is compared against. Each of the
numjobs workers is its own process (see gpufio.run.launch), so they overlap their I/O. The
loop runs compiled where it can (io/loops.py), else in Python (the same results).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.requests import HOST, Capability, Channel, ChannelSpec, File
from gpufio.core.targets import aligned_buffer
from gpufio.engines import register
from gpufio.engines.base import COMPILED_BATCH, Engine, compiled_loop, loop_facts, run_compiled
from gpufio.io import loops

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

    capability = Capability(memory=(HOST,))

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> "PsyncChannel":
        return PsyncChannel(files, spec)

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        """psync keeps one I/O in flight whatever iodepth says; the result says so."""
        return {**super().describe(job), "effective_iodepth": 1, **loop_facts(job)}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        # a write-only job has two batches of buffers: one written while the other is filled
        self._halves = 2 if job.writes and not job.reads else 1
        self._mem = aligned_buffer(self._halves * BATCH * job.bs)
        rows = np.frombuffer(self._mem, dtype=np.uint8)[:self._halves * BATCH * job.bs].reshape(
            self._halves, BATCH, job.bs)
        self._bufs = [rows[h] for h in range(self._halves)]
        # one ready-made iovec list per slot: preadv takes a list of buffers
        view = memoryview(self._mem)
        self._iovs = [[[view[(h * BATCH + i) * job.bs:(h * BATCH + i + 1) * job.bs]]
                       for i in range(BATCH)] for h in range(self._halves)]

    def _issue(self, tgt: np.ndarray, offs: np.ndarray, iovs: list, kinds: list[bool],
               fds: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One pread or pwrite after another: each I/O's latency and result."""
        ctx, clock, calls = self.ctx, time.perf_counter_ns, (os.preadv, os.pwritev)
        lat, res = [], []
        for t, off, iov, w in zip(tgt.tolist(), offs.tolist(), iovs, kinds):
            t0 = clock()
            try:
                r = calls[w](fds[t], iov, off)
            except OSError as e:
                r = -e.errno
            lat.append(clock() - t0)
            res.append(r)
            if w and ctx.sync_due(1):
                ctx.sync(fds)
        return np.array(lat, dtype=np.int64), np.array(res, dtype=np.int32)

    def run(self) -> None:
        if compiled_loop(self.job):
            ctx, job = self.ctx, self.job
            run_compiled(ctx, loops.NativeLoop(
                loops.PSYNC, depth=1, bs=job.bs, bufs=self._bufs[0].ctypes.data,
                stop=ctx.stop_address, fds=np.array([t.fd for t in self.targets]),
                seeds=ctx.seeds(np.arange(len(self.targets))) if job.writes else None,
                magic=pattern.MAGIC, halt_on_error=not ctx.continue_on_error,
                batch=COMPILED_BATCH, writes=bool(job.writes)))
            return
        if self._halves == 2:
            self._run_writes()
            return
        ctx = self.ctx
        fds = [t.fd for t in self.targets]
        buf = self._bufs[0]
        while True:
            tgt, offs = ctx.next_batch(BATCH)
            n = len(offs)
            if n == 0:
                return
            writes = ctx.last_writes()
            if writes is not False:
                ctx.fill(buf[:n], tgt, offs)  # reads land over the rows they use
            lat, results = self._issue(tgt, offs, self._iovs[0], ctx.write_flags(n), fds)
            if writes is not True:
                read = slice(None) if writes is False else ~writes
                ctx.verify(buf[:n][read], tgt[read], offs[read], results[read])
            ctx.complete(lat, tgt, results, writes)

    def _run_writes(self) -> None:
        """Write-only: the next batch's pattern is generated on a fill thread while this
        batch's writes go out, still one at a time (a fill between writes would leave the
        drive idle as fio's psync never does)."""
        ctx = self.ctx
        fds = [t.fd for t in self.targets]
        h = 0
        tgt, offs = ctx.next_batch(BATCH)
        ctx.fill(self._bufs[h][:len(offs)], tgt, offs)
        with ThreadPoolExecutor(1, thread_name_prefix="gpufio-psync-fill") as pool:
            while len(offs):
                nxt_tgt, nxt_offs = ctx.next_batch(BATCH)
                filling = pool.submit(ctx.fill, self._bufs[1 - h][:len(nxt_offs)], nxt_tgt,
                                      nxt_offs)
                lat, results = self._issue(tgt, offs, self._iovs[h], [True] * len(offs), fds)
                ctx.complete(lat, tgt, results, True)
                filling.result()
                tgt, offs, h = nxt_tgt, nxt_offs, 1 - h

    def close(self) -> None:
        self._iovs.clear()
        self._bufs.clear()
        self._mem.close()


class PsyncChannel(Channel):
    """One pread or pwrite after another, inside ``submit``: the requests are done when it
    returns, and the next ``reap`` hands them back."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec) -> None:
        super().__init__(spec)
        self._fds = [f.fd for f in files]
        self._tags: list[int] = []
        self._res: list[int] = []
        self.facts = {"iodepth": 1}

    @property
    def inflight(self) -> int:
        return len(self._tags)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        import ctypes

        k = min(self.room(), len(off))
        writes = np.broadcast_to(np.asarray(write, bool), (len(off),))
        for t, o, n, a, w, g in zip(tgt[:k].tolist(), off[:k].tolist(), length[:k].tolist(),
                                    addr[:k].tolist(), writes[:k].tolist(), tag[:k].tolist()):
            view = (ctypes.c_char * n).from_address(a)
            try:
                got = os.pwrite(self._fds[t], view, o) if w else os.preadv(self._fds[t], [view], o)
            except OSError as e:
                got = -e.errno
            self._tags.append(g)
            self._res.append(got)
        return k

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        done = np.array(self._tags, np.int64), np.array(self._res, np.int64)
        self._tags, self._res = [], []
        return done
