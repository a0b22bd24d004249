"""The GNN row gather on a request queue (kernels/gnn_gather.cu), for every engine whose GPU
threads post their own reads (its ``queue`` primitive): GPU threads read each row of a
mini-batch through the queue (gpu-uring's io_uring agents, bam's NVMe queue agents) and copy
it into the tensor, through a software cache in GPU memory when one is asked
(io/gio/cache.py). The host only starts the kernels and watches for a stall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufio.core.job import Job
from gpufio.core.requests import QueueSpec
from gpufio.core.rows import RowFetchError, RowRequest, RowTable, row_error
from gpufio.io import gpu, kernels
from gpufio.io.gio.bench import TPB, gpu_price
from gpufio.io.gio.cache import GpuCache, cache_rows
from gpufio.io.gio.queue import QueueStalled
from gpufio.io.kernels import Kernel

GATHER_POLL_S = 0.0001


class QueueGather:
    """Rows of ``table`` fetched through ``engine``'s request queue (core/requests
    DeviceQueue, over the table's files) by the queue's GPU threads into ``xp``
    arrays (CuPy) of ``request.dim`` float32 columns, through ``request.cache_bytes`` of GPU
    memory in front of the reads (0: none). ``rows`` counts the rows fetched, ``facts`` and
    ``mode`` say how (the queue's), ``price`` what the gather's kernels occupy of the GPU
    (bench.gpu_price); the reads bypass the page cache."""

    page_cache = False

    def __init__(self, engine: Any, job: Job, table: RowTable, xp: Any,
                 request: RowRequest) -> None:
        self._dq = engine.queue(job, (), QueueSpec(0, table.layout.row_bytes, table=table,
                                                   rows=request))
        self.facts = dict(self._dq.facts)
        try:
            self._prepare(table, xp, request.dim, request.cache_bytes)
        except BaseException:
            self.close()
            raise
        self.facts["gpu_price"] = self.price
        self.mode = self._dq.mode

    def _prepare(self, table: RowTable, xp: Any, dim: int, cache_bytes: int) -> None:
        """The cache, the kernel, the counters and the stream, on the queue's threads."""
        queue, threads = self._dq.queue, self._dq.threads
        self.queue, self.xp, self.dim, self.layout = queue, xp, dim, table.layout
        self.threads, self.stall_ns = threads, self._dq.stall_ns
        self.rows = 0
        self.cache = None
        if cache_bytes:
            rows = cache_rows(cache_bytes, table.layout.row_bytes, threads)
            self.cache = GpuCache(xp, rows, table.layout.row_bytes, table.rows)
        # loaded now: never while the agents spin (see RequestQueue.start)
        self._gather = kernels.function(Kernel.GIO_GATHER)
        self._d_fds = xp.asarray(queue.file_refs)
        # failed, node, result, hits, reads, coalesced, rows claimed (gnn_gather.cu)
        self._stats = xp.zeros(7, xp.uint64)
        self._stream = xp.cuda.Stream(non_blocking=True)
        queue.keep_alive(self._d_fds, self._stats, self._stream, self.cache)
        self.price = gpu_price(queue.nrings, -(-threads // TPB) * TPB,
                               gpu.sm_count(xp.cuda.Device().id))

    def counters(self) -> dict[str, int]:
        """Rows served since the start: from the cache, read from storage, and duplicates
        of a warp coalesced into one fetch."""
        s = self._stats.get()
        return {"hits": int(s[3]), "reads": int(s[4]), "coalesced": int(s[5])}

    def drive_reads(self) -> list[int] | None:
        """The reads each drive behind the queue has taken since the start, counted where
        they reached it (a cache's hits never do); None where the path counts none."""
        return None if self._dq.drive_reads is None else self._dq.drive_reads()

    def fetch(self, nodes: Any) -> Any:
        """The rows of ``nodes``, in order (RowFetchError naming the first that failed)."""
        xp, q = self.xp, self.queue
        n = len(nodes)
        with self._stream:  # ordered before the kernel, which runs on this stream
            out = xp.empty((n, self.dim), xp.float32)
            ids = xp.ascontiguousarray(nodes, dtype=xp.int64)
            self._stats[:3] = 0
            self._stats[6] = 0
        blocks = -(-self.threads // TPB)
        try:
            q.start(requesters=blocks * TPB, keep=(ids, out))  # the gather writes them
            self._gather((blocks,), (TPB,), (
                q.descriptor, self.cache.descriptor if self.cache else np.uint64(0),
                self._d_fds, np.uint64(self.layout.ntargets),
                np.uint64(self.layout.stripe_rows), np.uint64(self.layout.header),
                np.uint64(self.layout.row_bytes), ids, np.uint64(n), out,
                np.uint64(self.dim * 4 // 16), self._stats), stream=self._stream)
            q.wait((self._stream,), self.stall_ns, poll_s=GATHER_POLL_S)
        except QueueStalled as e:
            raise RowFetchError(str(e)) from None
        except BaseException:
            q.abort_quietly((self._stream,))  # the agents must not spin on after any error
            raise
        failed = self._stats[:3].get()
        if failed[0]:
            raise row_error(int(failed[1]), int(np.int64(failed[2])),
                            f"; {int(failed[0])} rows failed")
        self.rows += n
        return out

    def close(self) -> None:
        """The queue's final notes (a controller's measure of itself) into ``facts``, read
        while what they come from is up; then the queue and what it was made on (the files
        it opened among them)."""
        try:
            if self._dq.final_notes is not None:
                self.facts.update(self._dq.final_notes())
        finally:
            self._dq.close()
