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
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
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
from gpufio.core.slots import SlotTable
from gpufio.core.targets import aligned_buffer
from gpufio.core.tensors import Extent, TensorRequest, TensorSupport, sync_files
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import gpu, ringio, uring
from gpufio.io.staging import SegmentedStaging
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog, ring_report

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

FREE, READING, COPYING, WRITING = 0, 1, 2, 3
WAIT_NS = 200_000_000
POLL_NS = 20_000
SPARE = 2  # landing slots per read that may be in flight


def segment_shape(job: Job) -> tuple[int, int]:
    """(segments the reads in flight are grouped in, slots per segment)."""
    nseg = min(CpuGpu.settings(job).segments, job.iodepth)
    return nseg, job.iodepth // nseg


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
        Option("segments", "int", 3, "slot groups copied as one H2D transfer each "
               "(3: triple buffering)", minimum=1),
        Option("sqe_async", "bool", None, "set IOSQE_ASYNC: the kernel's io-wq workers run the "
               "reads in parallel instead of the submitting thread one after another "
               "(default: off, but on for GNN rows of tables that live in memory)"),
        PROCESSES,
    )

    @classmethod
    def row_fetcher(cls, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
        # with no sqe_async given, hand reads of in-memory tables to io-wq (RAM-backed
        # targets gained from it: docs/PERFORMANCE.md); a drive's reads stay inline
        given = cls.settings(job).sqe_async
        sqe_async = request.ram_backed if given is None else given
        return UringFetch(table, xp, request.dim, row_depth(request), request.direct,
                          request.max_rows, sqe_async)

    tensors = TensorSupport(host=False)

    @classmethod
    def host_unavailable(cls) -> str | None:
        """Rows into host memory (device = "cpu") go through io_uring, with no GPU."""
        facts = uring.probe()
        return None if facts["available"] else facts["reason"]

    @classmethod
    def tensor_mover(cls, job: Job, files: list[Target], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> "StagedTensors":
        return StagedTensors(files, extents, request, job.gpu, bool(cls.settings(job).sqe_async))

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
        nseg, per_segment = segment_shape(job)
        return {**super().describe(job), "gpus": list(job.gpu_list), "lands_in": "gpu memory",
                "segments": nseg, "landing_slots": SPARE * nseg * per_segment}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        nseg, self._seg = segment_shape(job)
        self._nseg = SPARE * nseg
        self._cap = nseg * self._seg  # reads in flight, at most
        self.landing = SegmentedStaging(job.gpu_of(ctx.worker), self._nseg, self._seg, job.bs,
                                        ctx.verifying, writes=job.writes)
        self.ring = uring.Ring(self._cap)
        self._fds = np.array([t.fd for t in targets], dtype=np.int64)
        self._sqe_flags = uring.SQE_ASYNC if self.settings(job).sqe_async else 0

    def _push(self, s: int, tgt: np.ndarray, offs: np.ndarray, opcode: int) -> None:
        """Submit segment ``s``'s I/Os (reads into, or writes from, its host slots)."""
        first = s * self._seg
        slots = np.arange(first, first + len(offs), dtype=np.uint64)
        bs = self.job.bs
        self.ring.push(uring.sqe_words(
            opcode=opcode, sqe_flags=self._sqe_flags, fd=self._fds[tgt], off=offs,
            addr=np.uint64(self.landing.host_addr) + slots * np.uint64(bs), length=bs,
            user_data=slots))

    def _issue(self, s: int, tgt: np.ndarray, offs: np.ndarray, table: SlotTable,
               seg_n: np.ndarray) -> None:
        k = len(offs)
        first = s * self._seg
        self._push(s, tgt, offs, uring.OP_READ)
        table.issue(slice(first, first + k), tgt, offs, time.perf_counter_ns())
        seg_n[s] = k

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.iodepth is not None:  # None: the rows' depth is picked when they are fetched
            uring.sq_entries(job.iodepth, 0, f"job '{job.name}': ")
        if job.mixed:
            raise BadInput(f"job '{job.name}': cpu-gpu moves a segment one way at a time; "
                           f"rw = {job.rw} (a mix) is not supported by this engine")

    def run(self) -> None:
        if self.job.writes:
            self._run_writes()
            return
        ctx, ring, seg = self.ctx, self.ring, self._seg
        slots = self._nseg * seg
        state = np.full(self._nseg, FREE, dtype=np.int8)
        seg_n = np.zeros(self._nseg, dtype=np.int64)      # reads issued in each segment
        seg_done = np.zeros(self._nseg, dtype=np.int64)   # reads completed in each segment
        table = SlotTable(slots)
        slot_res = np.zeros(slots, dtype=np.int32)
        issuing = True
        dog, progress = Watchdog(STALL_LIMIT_NS, time.perf_counter_ns()), 0  # reads + copies
        while True:
            for s in np.flatnonzero(state == FREE).tolist() if issuing else ():
                if ring.inflight + seg > self._cap:
                    break
                tgt, offs = ctx.next_batch(seg)
                if not len(offs):
                    issuing = False
                    break
                self._issue(s, tgt, offs, table, seg_n)
                seg_done[s] = 0
                state[s] = READING
            moved = self._wait(state, slot_res, seg_done)
            if moved is None and not issuing:
                return
            progress += moved or 0
            for s in np.flatnonzero((state == READING) & (seg_done == seg_n)).tolist():
                self._copy(s, int(seg_n[s]), table)
                state[s] = COPYING
            for s in np.flatnonzero(state == COPYING).tolist():
                if self.landing.done(s):
                    self._finish(s, int(seg_n[s]), table, slot_res)
                    state[s] = FREE
                    progress += 1
            if dog.update(progress, time.perf_counter_ns()):
                raise Stalled(f"no read or copy completed for {STALL_LIMIT_NS / 1e9:g} s: "
                              f"segment states {state.tolist()}; "
                              f"{ring_report(ring, [t.fd for t in self.targets])}")

    def _run_writes(self) -> None:
        """Segments go FREE -> COPYING (pattern generated on the GPU, copied down) ->
        WRITING (io_uring writes from the host slots) -> FREE; fsync between segments."""
        ctx, ring, seg = self.ctx, self.ring, self._seg
        state = np.full(self._nseg, FREE, dtype=np.int8)
        seg_n = np.zeros(self._nseg, dtype=np.int64)
        seg_done = np.zeros(self._nseg, dtype=np.int64)
        table = SlotTable(self._nseg * seg)
        slot_res = np.zeros(self._nseg * seg, dtype=np.int32)
        fds = [t.fd for t in self.targets]
        issuing, syncing = True, False
        dog, progress = Watchdog(STALL_LIMIT_NS, time.perf_counter_ns()), 0
        while True:
            if syncing and not np.any(state != FREE):
                ctx.sync(fds)
                syncing = False
            for s in np.flatnonzero(state == FREE).tolist() if issuing and not syncing else ():
                copying = int(seg_n[state == COPYING].sum())
                if ring.inflight + copying + seg > self._cap:
                    break
                tgt, offs = ctx.next_batch(min(seg, ctx.until_sync))
                k = len(offs)
                if not k:
                    issuing = False
                    break
                lo = s * seg
                table.issue(slice(lo, lo + k), tgt, offs, time.perf_counter_ns())
                self.landing.stage_out(s, k, offs, ctx.seeds(tgt))
                seg_n[s], seg_done[s], state[s] = k, 0, COPYING
                if ctx.sync_due(k):
                    syncing = True
                    break
            for s in np.flatnonzero(state == COPYING).tolist():
                if self.landing.done(s):
                    lo, k = s * seg, int(seg_n[s])
                    self._push(s, table.tgt[lo:lo + k], table.off[lo:lo + k], uring.OP_WRITE)
                    state[s] = WRITING
                    progress += 1
            moved = self._wait(state, slot_res, seg_done)
            if moved is None and not issuing and not syncing:
                return
            progress += moved or 0
            for s in np.flatnonzero((state == WRITING) & (seg_done == seg_n)).tolist():
                lo, k = s * seg, int(seg_n[s])
                table.complete(ctx, slice(lo, lo + k), slot_res[lo:lo + k].copy(),
                               time.perf_counter_ns(), write=True)
                state[s] = FREE
            if dog.update(progress, time.perf_counter_ns()):
                raise Stalled(f"no write or copy completed for {STALL_LIMIT_NS / 1e9:g} s: "
                              f"segment states {state.tolist()}; "
                              f"{ring_report(ring, [t.fd for t in self.targets])}")

    def _wait(self, state: np.ndarray, slot_res: np.ndarray, seg_done: np.ndarray) -> int | None:
        """Wait for what is in flight: reap the ring's completions into ``slot_res`` and
        ``seg_done`` (how many), or wait for the oldest copy (0); None when nothing is."""
        ring, copying = self.ring, bool(np.any(state == COPYING))
        if ring.inflight:
            ring.submit(wait=1, timeout_ns=POLL_NS if copying else WAIT_NS)
            ud, res = ring.reap()
            done = ud.view(np.int64)
            slot_res[done] = res
            np.add.at(seg_done, done // self._seg, 1)
            return len(done)
        if copying:
            self.landing.wait(int(np.flatnonzero(state == COPYING)[0]))
            return 0
        return None

    def _copy(self, s: int, k: int, table: SlotTable) -> None:
        lo = s * self._seg
        if self.ctx.verifying:
            self.landing.copy(s, k, table.off[lo:lo + k], self.ctx.seeds(table.tgt[lo:lo + k]))
        else:
            self.landing.copy(s, k)

    def _finish(self, s: int, k: int, table: SlotTable, slot_res: np.ndarray) -> None:
        lo = s * self._seg
        res = slot_res[lo:lo + k].copy()
        bad = (lambda tgt, offs: self.landing.mismatches(s, res)) if self.ctx.verifying else None
        table.complete(self.ctx, slice(lo, lo + k), res, time.perf_counter_ns(), bad)

    def close(self) -> None:
        self.ring.close()
        self.landing.close()


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
