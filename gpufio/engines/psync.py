"""psync: one pread (or pwrite) at a time per worker, like fio's psync engine and gdsio -x 1.

The simplest CPU path and the floor every other engine is compared against. Each of the
numjobs workers is its own process (see gpufio.run.launch), so they overlap their I/O. Its
channel is synchronous: each request is moved, and timed, inside ``submit``. The block loop
(loops/block_host.py) hands it batches; compiled where it can (io/loops.py), else in Python
(the same results).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.requests import HOST, Capability, Channel, ChannelSpec, File
from gpufio.engines import register
from gpufio.engines.base import Engine, loop_facts
from gpufio.io import loops
from gpufio.native import memory

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job


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

    capability = Capability(memory=(HOST,), synchronous=True)

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> "PsyncChannel":
        return PsyncChannel(files, spec)

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        """psync keeps one I/O in flight whatever iodepth says; the result says so."""
        return {**super().describe(job), "effective_iodepth": 1, **loop_facts(job)}


class PsyncChannel(Channel):
    """One pread or pwrite after another, inside ``submit``, each timed around its call:
    the requests are done when it returns, and the next ``reap`` hands them back."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec) -> None:
        super().__init__(spec)
        self._fds = [f.fd for f in files]
        self._tags: list[int] = []
        self._res: list[int] = []
        self._lat: list[int] = []
        self._took = np.zeros(0, np.int64)
        # a view per (address, length): a loop reuses its buffers, so each is made once
        self._views: dict[tuple[int, int], memoryview] = {}
        self.facts = {"iodepth": 1}

    @property
    def inflight(self) -> int:
        return len(self._tags)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(self.room(), len(off))
        writes = np.broadcast_to(np.asarray(write, bool), (len(off),))
        clock, views, fds = time.perf_counter_ns, self._views, self._fds
        for t, o, n, a, w, g in zip(tgt[:k].tolist(), off[:k].tolist(), length[:k].tolist(),
                                    addr[:k].tolist(), writes[:k].tolist(), tag[:k].tolist()):
            view = views.get((a, n))
            if view is None:
                view = views[a, n] = memory.bytes_at(a, n)
            t0 = clock()
            try:
                got = os.pwritev(fds[t], [view], o) if w else os.preadv(fds[t], [view], o)
            except OSError as e:
                got = -e.errno
            self._lat.append(clock() - t0)
            self._tags.append(g)
            self._res.append(got)
        return k

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        done = np.array(self._tags, np.int64), np.array(self._res, np.int64)
        self._took = np.array(self._lat, np.int64)
        self._tags, self._res, self._lat = [], [], []
        return done

    def times(self) -> np.ndarray:
        return self._took

    def native(self, job: Job, ctx: WorkerContext, batch: int, wait_ns: int) -> Any:
        if not loops.available() or self.spec.region is None:
            return None
        return loops.NativeLoop(
            loops.PSYNC, depth=1, bs=self.spec.largest, bufs=self.spec.region[0],
            stop=ctx.stop_address, fds=np.array(self._fds),
            seeds=ctx.seeds(np.arange(len(self._fds))) if job.writes else None,
            magic=pattern.MAGIC, halt_on_error=not ctx.continue_on_error, batch=batch,
            writes=bool(job.writes))

    def close(self) -> None:
        self._views.clear()
