"""cpu-gpu: the strongest CPU-driven path between storage and GPU memory (gdsio -x 2/3, done
properly).

Reads go through io_uring (real queue depth, O_DIRECT) into page-locked host memory; each
segment of slots, once all its reads are in, is copied to GPU memory in one asynchronous
transfer on its own CUDA stream, so many small reads share a copy and the next segments'
reads overlap the copies. There are twice as many landing segments as the ``iodepth`` reads
in flight need: a segment still waiting for its slowest read, or for its copy, does not
hold back new reads (docs/PERFORMANCE.md has what exactly iodepth slots cost on the root
disk). An I/O is complete when its
bytes are in GPU memory: its latency runs from issue until its segment's copy event is
observed done. fio's and elbencho's GPU paths copy synchronously from pageable memory, one
I/O at a time; this does not. Writes run the other way: a segment's blocks are generated in
GPU memory (the pattern of their offsets), copied down to its pinned slots in one transfer,
and written from there by io_uring, while the next segments copy; a write's latency runs from
the start of its segment's copy until the write completes.

This module is the engine: its options and its channel (io_uring into host memory,
io/uring_channel). The segment loop is run/staged's, written over any channel whose buffers
are host memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, ChannelSpec, File
from gpufio.core.rows import (
    RowFetchError,
    RowRequest,
    RowSupport,
    RowTable,
    close_all,
    open_rows,
    row_depth,
    row_error,
)
from gpufio.core.targets import aligned_buffer
from gpufio.core.tensors import Extent, TensorRequest, TensorSupport, sync_files
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import gpu, ringio, uring
from gpufio.io.staging import SEGMENTS, SPARE, segment_shape
from gpufio.io.uring_channel import UringChannel

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host


@register
class CpuGpu(Engine):
    """io_uring into registered host memory, then batched asynchronous H2D copies."""

    name = "cpu-gpu"
    rows = RowSupport()
    summary = "io_uring into pinned host buffers, then batched asynchronous H2D copies"
    peer = "gdsio -x 2/3, fio libcufile cuda_io=posix (synchronous, pageable)"
    fio_engines = {"libcufile:posix": "cuda_io=posix runs as cpu-gpu: gpufio's path is "
                   "asynchronous io_uring into pinned memory with overlapped copies, fio's is "
                   "synchronous and pageable"}
    uses_gpu = True
    worker_kind = "thread"
    options = (
        SEGMENTS,
        Option("sqe_async", "bool", False, "set IOSQE_ASYNC: the kernel's io-wq workers run the "
               "reads in parallel instead of the submitting thread one after another"),
        PROCESSES,
    )

    @classmethod
    def row_fetcher(cls, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
        # with no sqe_async given, hand reads of in-memory tables to io-wq (RAM-backed
        # targets gained from it: docs/PERFORMANCE.md); a drive's reads stay inline
        sqe_async = (cls.settings(job).sqe_async if "sqe_async" in job.options_as_given
                     else request.ram_backed)
        return UringFetch(table, xp, request.dim, row_depth(request), request.direct,
                          request.max_rows, sqe_async)

    tensors = TensorSupport(host=False)
    capability = Capability(memory=(HOST,))

    @classmethod
    def host_unavailable(cls) -> str | None:
        """Rows into host memory (device = "cpu") go through io_uring, with no GPU."""
        facts = uring.probe()
        return None if facts["available"] else facts["reason"]

    @classmethod
    def tensor_mover(cls, job: Job, files: list[Target], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> "StagedTensors":
        return StagedTensors(files, extents, request, job.gpu, cls.settings(job).sqe_async)

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        """Workers in processes each hold a CUDA context: without MPS they time-slice."""
        spawned = [j.name for j in jobs if cls.settings(j).processes]
        if not spawned:
            return []
        pipes = host.env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        running = host.path(pipes).joinpath("control").exists()
        return [verdict("cpu-gpu", "MPS daemon", running,
                        f"{'running' if running else 'not running'} ({pipes}); processes = true "
                        f"in {', '.join(spawned)}",
                        "start it (nvidia-cuda-mps-control -d) so the workers' contexts share "
                        "the GPU")]

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        nseg, per_segment = segment_shape(cls.settings(job).segments, job.iodepth)
        return {**super().describe(job), "gpus": list(job.gpu_list), "lands_in": "gpu memory",
                "segments": nseg, "landing_slots": SPARE * nseg * per_segment}

    @classmethod
    def check_job(cls, job: Job) -> None:
        uring.sq_entries(job.iodepth, 0, f"job '{job.name}': ")
        if job.mixed:
            raise BadInput(f"job '{job.name}': cpu-gpu moves a segment one way at a time; "
                           f"rw = {job.rw} (a mix) is not supported by this engine")

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> UringChannel:
        """io_uring into host memory; with sqe_async the kernel's io-wq workers run the
        requests. The block loop above (run/staged) lands them in GPU memory."""
        return UringChannel(files, spec, uring.SQE_ASYNC if cls.settings(job).sqe_async else 0)


class UringFetch:
    """The ``cpu-gpu`` path for aggregation: every row read by io_uring (``iodepth`` in
    flight, O_DIRECT when the layout is aligned) into page-locked host memory, then one copy
    of the whole tensor to the device. Rows come from the files, not the page cache. With
    ``sqe_async`` the kernel's io-wq workers run the reads in parallel; without it the
    submitting thread does each one (for RAM-backed files, each copy) itself."""

    page_cache = False

    def __init__(self, table: RowTable, xp: Any, dim: int, iodepth: int, direct: bool,
                 max_rows: int, sqe_async: bool = False) -> None:
        self.xp, self.dim, self.layout, self.depth = xp, dim, table.layout, iodepth
        self._sqe_flags = uring.SQE_ASYNC if sqe_async else 0
        self.rows = 0
        self.facts = {"iodepth": iodepth, "sqe_async": sqe_async}  # how, for the result
        self._fds = np.array(open_rows(table, direct), dtype=np.int64)
        self.ring = uring.Ring(iodepth)
        self._mem = None
        self._host = np.empty((0, table.layout.row_bytes // 4), np.float32)
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
            self._out = gpu.host_rows(self.xp, size, self.dim)
        return self._host[:n], self._out[:n]

    def fetch(self, nodes: Any) -> Any:
        ids = nodes if self.xp is np else self.xp.asnumpy(nodes)
        n = len(ids)
        host, out = self._buffers(n)
        tgt, off = self.layout.locate(ids)
        rb = self.layout.row_bytes
        addrs = np.uint64(host.ctypes.data) + np.arange(n, dtype=np.uint64) * np.uint64(rb)
        try:
            ringio.move_pieces(self.ring, uring.OP_READ, self._fds[tgt], off, addrs,
                               np.full(n, rb, np.int64), self._sqe_flags)
        except ringio.PieceFailed as e:
            raise row_error(int(ids[e.index]), e.res) from None
        except ringio.PiecesStuck as e:
            raise RowFetchError(f"feature rows: {e}") from None
        out[:] = host[:, :self.dim]
        self.rows += n
        return out.copy() if self.xp is np else self.xp.asarray(out)

    def close(self) -> None:
        self.ring.close()
        close_all(self._fds.tolist())
        self._host = None
        if self._mem is not None:
            self._mem.close()


# pinned memory of one round of pieces: enough pieces to keep the queue full across a
# round's end, capped so large chunks do not pin GBs
ROUND_BYTES = 256 << 20


class StagedTensors:
    """Shards in GPU memory saved and restored through two page-locked rounds of pieces:
    a save copies the next round down (one asynchronous D2H per piece) while io_uring
    writes the current one; a restore reads the next round while the current one is
    copied up. Every byte crosses host memory once, as in the block path."""

    def __init__(self, files: list[Target], extents: list[Extent], request: TensorRequest,
                 gpu_index: int, sqe_async: bool) -> None:
        self._cp = gpu.use(gpu_index)
        self.io = ringio.RingPieces(files, extents, request,
                                    uring.SQE_ASYNC if sqe_async else 0)
        self._chunk = request.chunk
        self._per = max(request.iodepth, min(4 * request.iodepth, ROUND_BYTES // request.chunk))
        self._bufs = [gpu.PinnedBuffer(self._per * request.chunk) for _ in range(2)]
        self._stream = self._cp.cuda.Stream(non_blocking=True)
        self.page_cache = not request.direct
        self.facts: dict[str, Any] = {"chunk": request.chunk, "iodepth": request.iodepth,
                                      "round_pieces": self._per}

    def _rounds(self) -> list[slice]:
        n = len(self.io.pieces)
        return [slice(lo, min(lo + self._per, n)) for lo in range(0, n, self._per)]

    def _addrs(self, buf: int, rows: slice) -> np.ndarray:
        k = len(self.io.pieces[rows])
        return np.uint64(self._bufs[buf].addr) + np.arange(k, dtype=np.uint64) * np.uint64(self._chunk)

    def _copy(self, tensors: Any, rows: slice, buf: int, down: bool) -> None:
        """Queue the copies of pieces ``rows`` between the shards and pinned round ``buf``."""
        runtime = self._cp.cuda.runtime
        kind = runtime.memcpyDeviceToHost if down else runtime.memcpyHostToDevice
        host = self._bufs[buf].addr
        for j, (e, at, _, n) in enumerate(self.io.pieces[rows].tolist()):
            dev, slot = tensors[e].data.ptr + at, host + j * self._chunk
            runtime.memcpyAsync(slot if down else dev, dev if down else slot, n, kind,
                                self._stream.ptr)

    def save(self, tensors: Any) -> int:
        rounds, first = self._rounds(), 0
        if rounds:
            self._copy(tensors, rounds[0], 0, down=True)
        for r, rows in enumerate(rounds):
            self._stream.synchronize()  # round r is down; round r+1's slots are free
            if r + 1 < len(rounds):
                self._copy(tensors, rounds[r + 1], (r + 1) % 2, down=True)
            done = self.io.move(True, self._addrs(r % 2, rows), rows)
            first = first or done
        self._stream.synchronize()
        return first

    def sync(self) -> None:
        sync_files(self.io.fds)

    def restore(self, tensors: Any) -> int:
        rounds, first = self._rounds(), 0
        for r, rows in enumerate(rounds):
            if r == 0:
                first = self.io.move(False, self._addrs(0, rows), rows)
            self._copy(tensors, rows, r % 2, down=False)
            if r + 1 < len(rounds):
                self.io.move(False, self._addrs((r + 1) % 2, rounds[r + 1]), rounds[r + 1])
            self._stream.synchronize()  # round r is up; its slots take round r+2
        return first

    def close(self) -> None:
        self._stream.synchronize()
        self.io.close()
        for b in self._bufs:
            b.close()
