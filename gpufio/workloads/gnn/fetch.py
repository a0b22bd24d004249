"""Feature aggregation backends: fetch the rows of a mini-batch's nodes into one tensor.

Each backend is named after the engine whose data path it uses, and has ``fetch(nodes)``
(the rows, in order, on the device), ``rows`` (rows fetched so far) and ``close()``.

``MmapFetch`` is the loaders' baseline the experiment measures (DGL's memory-mapped feature
loader): the feature files are memory-mapped, the CPU gathers each row through page faults
into a staging buffer (page-locked when the tensor goes to a GPU), and one copy takes the
gathered rows to the device. ``advice`` 'normal' leaves the kernel's read-around on (a fault
reads 128 KiB around its row, as DGL's loader does); 'random' (MADV_RANDOM) reads only the
faulting page, the tuned loader. It reads through the page cache by nature; ``drop_cache``
evicts the files' cached pages before the first iteration.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any

import numpy as np

from gpufio.core.targets import aligned_buffer
from gpufio.engines.mmap import gather_rows, map_rows
from gpufio.io import uring
from gpufio.workloads.gnn.dataset import Dataset, evict

WAIT_NS = 10_000_000_000


class FetchError(RuntimeError):
    """A row could not be read whole."""


def _open_rows(ds: Dataset, direct: bool) -> list[int]:
    """The feature files opened for reading, with O_DIRECT when asked and the layout allows
    it (4 KiB-aligned first row, rows a multiple of 512 bytes)."""
    aligned = ds.layout.header % 4096 == 0 and ds.layout.row_bytes % 512 == 0
    flags = os.O_RDONLY | (os.O_DIRECT if direct and aligned else 0)
    return [os.open(p, flags) for p in ds.paths]


def _row_error(node: int, res: int, more: str = "") -> FetchError:
    """The one-line failure of a row read that returned ``res`` (-errno, or too few bytes)."""
    why = errno.errorcode.get(-res, str(-res)) if res < 0 else f"short read of {res} bytes"
    return FetchError(f"feature row of node {node} ({why}){more}")


def _staging(xp: Any, rows: int, dim: int) -> Any:
    """Host rows to gather into: page-locked when they go on to a GPU."""
    if xp is np:
        return np.empty((rows, dim), np.float32)
    import cupyx

    return cupyx.empty_pinned((rows, dim), np.float32)


class MmapFetch:
    """Page-fault gathers from memory-mapped feature files, then one copy to the device."""

    page_cache = True

    def __init__(self, ds: Dataset, xp: Any, dim: int, drop_cache: bool, max_rows: int,
                 advice: str) -> None:
        self.xp, self.dim, self.layout = xp, dim, ds.layout
        self.rows = 0
        self._maps, self._views = [], []
        if drop_cache:
            evict(ds.paths)
        for t, path in enumerate(ds.paths):
            fd = os.open(path, os.O_RDONLY)
            try:
                m, view = map_rows(fd, os.fstat(fd).st_size, ds.layout.header,
                                   ds.layout.rows_on(t, ds.graph.nodes), ds.layout.row_bytes,
                                   mmap.MADV_RANDOM if advice == "random" else mmap.MADV_NORMAL)
            finally:
                os.close(fd)  # the mapping keeps the file
            self._maps.append(m)
            self._views.append(view.view(np.float32)[:, :dim])
        self._staging = np.empty((0, dim), np.float32)
        self._buffer(max_rows)  # now, not under memory_limit, where it would crowd the cache

    def _buffer(self, n: int) -> np.ndarray:
        """Staging rows, grown as needed (page-locked for GPU copies)."""
        if len(self._staging) < n:
            self._staging = _staging(self.xp, max(n, 2 * len(self._staging)), self.dim)
        return self._staging[:n]

    def fetch(self, nodes: Any) -> Any:
        """The feature rows of ``nodes`` (on the device), in order."""
        ids = nodes if self.xp is np else self.xp.asnumpy(nodes)
        out = self._buffer(len(ids))
        tgt, off = self.layout.locate(ids)
        gather_rows(self._views, tgt, (off - self.layout.header) // self.layout.row_bytes, out)
        self.rows += len(ids)
        return out.copy() if self.xp is np else self.xp.asarray(out)

    def close(self) -> None:
        self._views.clear()  # views must go before the mappings they point into
        for m in self._maps:
            m.close()
        self._maps.clear()


class UringFetch:
    """The ``cpu-gpu`` path for aggregation: every row read by io_uring (``iodepth`` in
    flight, O_DIRECT when the layout is aligned) into page-locked host memory, then one copy
    of the whole tensor to the device. Rows come from the files, not the page cache. With
    ``sqe_async`` the kernel's io-wq workers run the reads in parallel; without it the
    submitting thread does each one (for RAM-backed files, each copy) itself."""

    page_cache = False

    def __init__(self, ds: Dataset, xp: Any, dim: int, iodepth: int, direct: bool,
                 max_rows: int, sqe_async: bool = False) -> None:
        self.xp, self.dim, self.layout, self.depth = xp, dim, ds.layout, iodepth
        self._sqe_flags = uring.SQE_ASYNC if sqe_async else 0
        self.rows = 0
        self._fds = np.array(_open_rows(ds, direct), dtype=np.int64)
        self.ring = uring.Ring(iodepth)
        self._mem = None
        self._host = np.empty((0, ds.layout.row_bytes // 4), np.float32)
        self._out = np.empty((0, dim), np.float32)
        self._buffers(max_rows)  # now, not under memory_limit, where it would crowd the cache

    def _buffers(self, n: int) -> tuple[np.ndarray, Any]:
        """Aligned landing rows for O_DIRECT, and the staging tensor, grown as needed."""
        if len(self._host) < n:
            size = max(n, 2 * len(self._host))
            if self._mem is not None:
                self._host = None
                self._mem.close()
            self._mem = aligned_buffer(size * self.layout.row_bytes)
            self._host = np.frombuffer(self._mem, np.float32).reshape(size, -1)
            self._out = _staging(self.xp, size, self.dim)
        return self._host[:n], self._out[:n]

    def fetch(self, nodes: Any) -> Any:
        ids = nodes if self.xp is np else self.xp.asnumpy(nodes)
        n = len(ids)
        host, out = self._buffers(n)
        tgt, off = self.layout.locate(ids)
        base = np.uint64(host.ctypes.data)
        rb = self.layout.row_bytes
        ring, pushed, done = self.ring, 0, 0
        while done < n:
            k = min(ring.space(), n - pushed)
            if k:
                idx = np.arange(pushed, pushed + k, dtype=np.uint64)
                ring.push(uring.read_sqes(
                    opcode=uring.OP_READ, sqe_flags=self._sqe_flags,
                    fd=self._fds[tgt[pushed:pushed + k]],
                    off=off[pushed:pushed + k].astype(np.uint64), addr=base + idx * np.uint64(rb),
                    length=rb, user_data=idx))
                pushed += k
            ring.submit(wait=1, timeout_ns=WAIT_NS)
            ud, res = ring.reap()
            if not len(ud) and ring.inflight:
                raise FetchError(f"no feature row read completed in {WAIT_NS / 1e9:g} s: "
                                 f"{ring.state()}")
            bad = np.flatnonzero(res != rb)
            if len(bad):
                raise _row_error(int(ids[int(ud[bad[0]])]), int(res[bad[0]]))
            done += len(ud)
        out[:] = host[:, :self.dim]
        self.rows += n
        return out.copy() if self.xp is np else self.xp.asarray(out)

    def close(self) -> None:
        self.ring.close()
        for fd in self._fds.tolist():
            os.close(fd)
        self._host = None
        if self._mem is not None:
            self._mem.close()


class GpuUringFetch:
    """The ``gpu-uring`` path for aggregation: GPU threads post the reads of the rows
    themselves through the request queue (gpuqueue.DeviceQueue, kernels/gnn_gather.cu) and
    copy each landed row into the tensor, through a software cache in GPU memory when
    ``cache_bytes`` is given (gpucache.py); the host only starts the kernels, wakes SQPOLL
    threads and watches for a stall. Needs a GPU (``device = "gpu"``)."""

    page_cache = False

    def __init__(self, ds: Dataset, xp: Any, dim: int, opts: dict[str, Any], iodepth: int,
                 direct: bool, cache_bytes: int = 0) -> None:
        from gpufio.io import cuda
        from gpufio.io.gio.cache import GpuCache, cache_rows
        from gpufio.io.gio.queue import DeviceQueue

        self.xp, self.dim, self.layout = xp, dim, ds.layout
        self.rows = 0
        self.stall_ns = opts["stall_timeout"]
        self._threads = opts["rings"] * iodepth
        self.cache = None
        if cache_bytes:
            self.cache = GpuCache(xp, cache_rows(cache_bytes, ds.layout.row_bytes, self._threads),
                                  ds.layout.row_bytes, ds.graph.nodes)
        self._fds = _open_rows(ds, direct)
        try:
            self.queue = DeviceQueue.for_options(opts, depth=iodepth,
                                                 slot_bytes=ds.layout.row_bytes, fds=self._fds)
        except BaseException:
            _close_all(self._fds)
            raise
        try:
            # loaded now: never while the agents spin (see DeviceQueue.start)
            self._gather = cuda.module("gnn_gather").get_function("gio_gather")
            self._d_fds = xp.asarray(self.queue.file_refs)
            self._stats = xp.zeros(6, xp.uint64)  # failed, node, result, hits, reads, coalesced
            self._stream = xp.cuda.Stream(non_blocking=True)
        except BaseException:
            self.close()
            raise
        self.queue.keep_alive(self._d_fds, self._stats, self._stream, self.cache)

    def counters(self) -> dict[str, int]:
        """Rows served since the start: from the cache, read from storage, and duplicates
        of a warp coalesced into one fetch."""
        s = self._stats.get()
        return {"hits": int(s[3]), "reads": int(s[4]), "coalesced": int(s[5])}

    def fetch(self, nodes: Any) -> Any:
        from gpufio.io.gio.queue import QueueStalled

        xp, q = self.xp, self.queue
        n = len(nodes)
        with self._stream:  # ordered before the kernel, which runs on this stream
            out = xp.empty((n, self.dim), xp.float32)
            ids = xp.ascontiguousarray(nodes, dtype=xp.int64)
            self._stats[:3] = 0
        blocks = -(-self._threads // 128)
        try:
            q.start(requesters=blocks * 128, keep=(ids, out))  # the gather writes them
            self._gather((blocks,), (128,), (
                q.descriptor, self.cache.descriptor if self.cache else np.uint64(0),
                self._d_fds, np.uint64(self.layout.ntargets), np.uint64(self.layout.header),
                np.uint64(self.layout.row_bytes), ids, np.uint64(n), out,
                np.uint64(self.dim * 4 // 16), self._stats), stream=self._stream)
            q.wait((self._stream,), self.stall_ns, poll_s=0.0001)
        except QueueStalled as e:
            raise FetchError(str(e)) from None
        except BaseException:
            q.abort_quietly((self._stream,))  # the agents must not spin on after any error
            raise
        failed = self._stats[:3].get()
        if failed[0]:
            raise _row_error(int(failed[1]), int(np.int64(failed[2])),
                             f"; {int(failed[0])} rows failed")
        self.rows += n
        return out

    def close(self) -> None:
        self.queue.close()
        _close_all(self._fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class CuFileFetch:
    """The ``cufile`` path for aggregation: KvikIO reads each row straight into its row of
    the device tensor (GPUDirect Storage, or compat mode through a host bounce buffer; the
    result's engine_mode says which), ``iodepth`` futures in flight."""

    page_cache = False

    def __init__(self, ds: Dataset, xp: Any, dim: int, threads: int, iodepth: int,
                 direct: bool) -> None:
        import kvikio

        from gpufio.engines.cufile import configure, cufile_mode

        self.xp, self.dim, self.layout, self.depth = xp, dim, ds.layout, iodepth
        self.rows = 0
        self.mode = cufile_mode()
        configure(threads or iodepth, dim * 4, direct)
        self._files = [kvikio.CuFile(p, "r") for p in ds.paths]

    def fetch(self, nodes: Any) -> Any:
        ids = self.xp.asnumpy(nodes)
        out = self.xp.empty((len(ids), self.dim), self.xp.float32)
        tgt, off = self.layout.locate(ids)
        nbytes = self.dim * 4
        pending: list[tuple[int, Any]] = []
        for i, (t, o) in enumerate(zip(tgt.tolist(), off.tolist())):
            if len(pending) == self.depth:
                self._finish(*pending.pop(0), ids)
            pending.append((i, self._files[t].pread(out[i], nbytes, o, task_size=nbytes)))
        for item in pending:
            self._finish(*item, ids)
        self.rows += len(ids)
        return out

    def _finish(self, i: int, future: Any, ids: np.ndarray) -> None:
        try:
            got = future.get()
        except Exception as e:  # KvikIO raises on a failed read, without an errno
            raise FetchError(f"feature row of node {int(ids[i])} ({e})") from None
        if got != self.dim * 4:
            raise FetchError(f"feature row of node {int(ids[i])} (short read of {got} bytes)")

    def close(self) -> None:
        for f in self._files:
            f.close()
