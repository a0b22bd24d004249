"""The GNN row gather over the engines' channel (core/requests), and the choice of gather.

Each mini-batch's rows are located by the table's layout and read as one batch of requests
through the job's engine's channel: into page-aligned host landing rows (page-locked when
the rows go on to a GPU, then copied there in one transfer), or straight into the rows of
the output tensor when the channel takes GPU memory. Where the engine's primitive for the
job is a queue GPU threads submit to, the gather runs on the GPU (loops/rows_device);
``fetcher`` picks from the primitive, never from the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufio.core.job import Job
from gpufio.core.errors import BadInput
from gpufio.core.requests import GPU, HOST, QUEUE, ChannelSpec, RequestFailed
from gpufio.core.rows import (
    RowFetchError,
    RowRequest,
    RowTable,
    close_all,
    direct_fits,
    open_rows,
    row_depth,
    row_error,
)
from gpufio.core.targets import aligned_buffer
from gpufio.io import gpu
from gpufio.io.watchdog import Stalled
from gpufio.loops.steps import move_all


@dataclass(frozen=True)
class RowFile:
    """A feature file as a channel sees it (core/requests.File)."""

    path: str
    fd: int


def fetcher(engine: Any, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
    """The rows of ``table`` for ``job``, by the engine's primitive for it: the gather on
    the GPU over its request queue (rows land in GPU memory), else the gather through its
    channel (where no GPU threads read, no GPU cache sits in front of the reads)."""
    if engine.primitive(job) == QUEUE:
        if xp is np:
            raise BadInput(f"job '{job.name}': engine '{engine.name}''s GPU threads land rows "
                           "in GPU memory: device = \"gpu\" (or its CPU submitter)")
        from gpufio.loops.rows_device import QueueGather  # the GPU plumbing, only where used

        return QueueGather(engine, job, table, xp, request)
    if request.cache_bytes:
        raise BadInput(f"job '{job.name}': the GPU cache sits in front of GPU threads' reads: "
                       f"engine '{engine.name}' gathers these rows through its channel, a "
                       "host thread submitting: cache_size needs its GPU submitter")
    return Gather(engine, job, table, xp, request)


class Gather:
    """``fetch(nodes)``: the rows of ``nodes``, in order, as an ``xp`` array of
    ``request.dim`` float32 columns (in GPU memory for CuPy), read through ``engine``'s
    channel, ``depth`` reads in flight (the profile's iodepth, else core/rows.row_depth).
    ``rows`` counts the rows fetched, ``facts`` says how (the channel's facts), ``mode``
    the engine's mode where its channel names one. A row that does not come back whole
    fails the fetch naming its node (RowFetchError); so does a batch that stalls."""

    def __init__(self, engine: Any, job: Job, table: RowTable, xp: Any,
                 request: RowRequest) -> None:
        cap = engine.capability
        self.xp, self.dim, self.layout = xp, request.dim, table.layout
        self.rows = 0
        # straight into the output rows when the channel takes GPU memory and they live there
        self._on_gpu = xp is not np and GPU in cap.memory
        # a mapping reads through the page cache whatever O_DIRECT says: its files open plain
        direct = request.direct and not cap.page_cache
        # a channel that takes the device behind the files gets them unopened
        self._fds = open_rows(table, direct) if cap.descriptors else [-1] * len(table.paths)
        self.page_cache = cap.page_cache or not (direct and direct_fits(table.layout))
        self._length = self.dim * 4 if self._on_gpu else table.layout.row_bytes
        # a file row of just the dim columns lands where it is handed on: no copy between
        self._in_place = self._length == self.dim * 4
        depth = row_depth(request)
        try:
            self.channel = engine.channel(job, [RowFile(p, fd) for p, fd in
                                                zip(table.paths, self._fds)],
                                          ChannelSpec(depth, GPU if self._on_gpu else HOST,
                                                      self._length,
                                                      ram_backed=request.ram_backed))
        except BaseException:
            close_all(self._fds)
            raise
        if engine.row_support().advice:
            self.channel.advise(request.advice)
        self.facts = dict(self.channel.facts)  # a queue's says its depth
        self.mode = self.channel.facts.get("mode")
        self._mem: Any = None
        self._pinned: Any = None
        self._host = np.empty((0, self._length // 4), np.float32)
        self._out = self._host[:, :self.dim]
        if not self._on_gpu:
            self._buffers(request.max_rows)  # now, not under memory_limit: it would crowd the cache

    def _buffers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Page-aligned landing rows (page-locked for a GPU), and the rows handed on (the
        landing rows themselves when a file row is the ``dim`` columns), grown as needed."""
        if len(self._host) < n:
            size = max(n, 2 * len(self._host))
            self._release()
            nbytes = size * self._length
            if self.xp is np:
                self._mem = aligned_buffer(nbytes)
                self._host = np.frombuffer(self._mem, np.float32)[:nbytes // 4].reshape(size, -1)
            else:
                self._pinned = gpu.PinnedBuffer(nbytes)
                self._host = self._pinned.array.view(np.float32)[:nbytes // 4].reshape(size, -1)
            self._out = self._host if self._in_place else gpu.host_rows(self.xp, size, self.dim)
        return self._host[:n], self._out[:n]

    def _read(self, ids: np.ndarray, addrs: np.ndarray) -> None:
        """Every row of ``ids`` into its buffer at ``addrs``, or RowFetchError."""
        tgt, off = self.layout.locate(ids)
        try:
            move_all(self.channel, tgt, off, np.full(len(ids), self._length, np.int64), addrs,
                     False)
        except RequestFailed as e:
            raise row_error(int(ids[e.index]), e.res) from None
        except Stalled as e:
            raise RowFetchError(f"feature rows: {e}") from None

    def fetch(self, nodes: Any) -> Any:
        ids = nodes if self.xp is np else self.xp.asnumpy(nodes)
        n = len(ids)
        step = np.arange(n, dtype=np.uint64) * np.uint64(self._length)
        if self._on_gpu:
            out = self.xp.empty((n, self.dim), self.xp.float32)
            self._read(ids, np.uint64(out.data.ptr) + step)
            self.rows += n
            return out
        host, out = self._buffers(n)
        self._read(ids, np.uint64(host.ctypes.data) + step)
        if not self._in_place:
            out[:] = host[:, :self.dim]
        self.rows += n
        return out.copy() if self.xp is np else self.xp.asarray(out)

    def _release(self) -> None:
        self._host = self._out = np.empty((0, self._length // 4), np.float32)
        if self._mem is not None:
            self._mem.close()
        if self._pinned is not None:
            # the last fetch's copy to the GPU may still read these rows: it must end
            # before they are unregistered
            self.xp.cuda.get_current_stream().synchronize()
            self._pinned.close()
        self._mem = self._pinned = None

    def close(self) -> None:
        self.channel.close()
        close_all(self._fds)
        self._release()
