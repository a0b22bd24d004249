"""mmap: the GNN and recommender loaders' baseline (DGL/PyG memory-mapped features).

Each target is memory-mapped read-only; a worker gathers ``iodepth`` blocks per batch through
page faults into page-locked host memory, copies the batch to GPU memory asynchronously, and
gathers the next batch while the copy runs (double buffering). An I/O is done when its batch
is in GPU memory; its latency runs from the start of its batch's gather. This path reads
through the page cache by nature (the result says page_cache: true); ``drop_cache`` evicts
the targets' cached pages during setup, so a run starts cold. A target that shrinks under a
mapping makes the kernel raise SIGBUS, as it would in any mmap loader. Writes go the other
way: a batch's blocks are generated in GPU memory, copied down to page-locked memory and
stored through a shared writable mapping (the next batch's copy overlapping the stores), and
the mappings are flushed (msync) before the job ends, inside its time. A store into a page
that is not cached faults it in with a synchronous read first, so each batch's pages are
asked for (MADV_WILLNEED, asynchronous readahead) one batch ahead, as a careful mmap writer
does: the reads of the next batch overlap the stores of this one.
"""

from __future__ import annotations

import mmap as mm
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.rows import RowRequest, RowSupport, RowTable, evict
from gpufio.core.tensors import Extent, TensorRequest, TensorSupport, pieces, sync_files
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import gpu
from gpufio.io.staging import SegmentedStaging

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target

SEGMENTS = 2
# Linux 5.14's MADV_POPULATE_WRITE (Python's mmap module does not name it): fault a range in
# writable with one call instead of a fault per page, for stores of BIG_STORE bytes or more
MADV_POPULATE_WRITE = 23
BIG_STORE = 64 << 10


def map_rows(fd: int, size: int, offset: int, rows: int, row_bytes: int,
             advice: int, writable: bool = False) -> tuple[mm.mmap, np.ndarray]:
    """``fd`` mapped shared, read-only unless ``writable`` (all ``size`` bytes: mmap offsets
    must be page-aligned, a row's need not be) with ``advice``, and its ``rows`` rows of
    ``row_bytes`` from ``offset`` as a (rows, row_bytes) uint8 view. Drop the view before
    closing the mapping."""
    m = mm.mmap(fd, size, flags=mm.MAP_SHARED,
                prot=mm.PROT_READ | (mm.PROT_WRITE if writable else 0))
    m.madvise(advice)
    view = np.frombuffer(m, dtype=np.uint8)[offset:offset + rows * row_bytes]
    return m, view.reshape(rows, row_bytes)


def gather_rows(views: list[np.ndarray], tgt: np.ndarray, rows: np.ndarray,
                out: np.ndarray) -> None:
    """out[i] = views[tgt[i]][rows[i]]: each row faulted in from its target's mapping. One
    target takes the unbuffered np.take (mode 'clip'; the default 'raise' gathers into a
    temporary first, memory a memory_limit would charge)."""
    if len(views) == 1:
        np.take(views[0], rows, axis=0, out=out, mode="clip")
        return
    for t, view in enumerate(views):
        mask = tgt == t
        out[mask] = view[rows[mask]]


@register
class Mmap(Engine):
    """Page-fault gathers from memory-mapped targets, then asynchronous H2D copies."""

    name = "mmap"
    summary = ("targets memory-mapped, blocks gathered through page faults into pinned memory, "
               "then copied to GPU memory")
    peer = "DGL/PyG memory-mapped feature loaders"
    iodepth_means = "blocks gathered per batch (each fault is synchronous)"
    rows = RowSupport(advice=True, baseline=True)
    uses_gpu = True
    worker_kind = "thread"
    options = (
        Option("drop_cache", "bool", False, "evict the targets' cached pages before the run "
               "(posix_fadvise DONTNEED), for cold numbers"),
        PROCESSES,
    )

    @classmethod
    def row_fetcher(cls, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
        return MmapFetch(table, xp, request.dim, cls.settings(job).drop_cache,
                         request.max_rows, request.advice)

    tensors = TensorSupport()

    @classmethod
    def tensor_mover(cls, job: Job, files: list[Target], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> "MappedTensors":
        return MappedTensors(files, extents, request, xp)

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.mixed:
            raise BadInput(f"job '{job.name}': mmap gathers or stores a batch one way; "
                           f"rw = {job.rw} (a mix) is not supported by this engine")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        return {**super().describe(job), "page_cache": True,
                "drop_cache": cls.settings(job).drop_cache,
                **({"write_prefetch": "MADV_WILLNEED, one batch ahead"
                    + (", then MADV_POPULATE_WRITE" if job.bs >= BIG_STORE else "")}
                   if job.writes else {}),
                "gpus": list(job.gpu_list), "lands_in": "gpu memory", "batch": job.iodepth}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        if not ctx.block_aligned(job.bs, job.offset):
            raise BadInput(f"job '{job.name}': mmap gathers whole blocks of bs = {job.bs} from "
                           f"offset {job.offset}; the replayed iolog has I/Os between them")
        self.landing = SegmentedStaging(job.gpu_of(ctx.worker), SEGMENTS, job.iodepth, job.bs,
                                        ctx.verifying, writes=job.writes)
        self._maps: list[mm.mmap] = []
        self._views: list[np.ndarray] = []
        advice = mm.MADV_RANDOM if job.random else mm.MADV_SEQUENTIAL
        for t in targets:
            if self.settings(job).drop_cache:
                os.posix_fadvise(t.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            nblocks = ((job.size or t.size - job.offset)) // job.bs
            m, view = map_rows(t.fd, t.size, job.offset, nblocks, job.bs, advice, job.writes)
            self._maps.append(m)
            self._views.append(view)
        self._rows = self.landing.host.reshape(SEGMENTS * job.iodepth, job.bs)

    def _gather(self, seg: int, tgt: np.ndarray, offs: np.ndarray) -> None:
        lo, k = seg * self.job.iodepth, len(offs)
        gather_rows(self._views, tgt, self._rows_of(offs), self._rows[lo:lo + k])

    def _rows_of(self, offs: np.ndarray) -> np.ndarray:
        """The mapped rows (bs blocks from the job's offset) the I/Os at ``offs`` touch."""
        return ((offs - np.uint64(self.job.offset)) // np.uint64(self.job.bs)).astype(np.intp)

    def _store(self, seg: int, tgt: np.ndarray, offs: np.ndarray) -> None:
        """Store segment ``seg``'s blocks through the mappings, each to its offset."""
        lo, k = seg * self.job.iodepth, len(offs)
        rows, src = self._rows_of(offs), self._rows[lo:lo + k]
        for t, view in enumerate(self._views):
            mask = tgt == t if len(self._views) > 1 else slice(None)
            view[rows[mask]] = src[mask]

    def _prefetch(self, tgt: np.ndarray, offs: np.ndarray, advice: int = mm.MADV_WILLNEED) -> None:
        """Advise the pages the stores at ``offs`` will touch, sequential runs of blocks as one
        range: MADV_WILLNEED starts reading them in (it returns once the reads are queued);
        MADV_POPULATE_WRITE maps them writable (where the kernel has it)."""
        bs, page = self.job.bs, mm.PAGESIZE
        starts = offs.astype(np.int64) // page * page
        ends = offs.astype(np.int64) + bs
        t = tgt if len(self._maps) > 1 else np.zeros(len(offs), np.int64)
        lo = 0
        for i in range(1, len(offs) + 1):
            if i < len(offs) and t[i] == t[lo] and starts[i - 1] <= starts[i] <= ends[i - 1]:
                continue  # the same run of pages, continued
            try:
                self._maps[int(t[lo])].madvise(advice, int(starts[lo]),
                                               int(ends[i - 1] - starts[lo]))
            except OSError:  # EINVAL: a kernel without the advice; the stores fault instead
                if advice == mm.MADV_WILLNEED:
                    raise
            lo = i

    def _run_writes(self) -> None:
        """Batches: pattern generated on the GPU and copied down (stage_out), then stored;
        a batch after which an fsync is due is stored and synced before the next is drawn."""
        ctx, landing, clock = self.ctx, self.landing, time.perf_counter_ns
        ok = np.full(self.job.iodepth, self.job.bs, dtype=np.int32)
        fds = [t.fd for t in self.targets]
        pending: tuple[int, int, np.ndarray, np.ndarray] | None = None
        seg = 0
        while True:
            tgt, offs = ctx.next_batch(min(self.job.iodepth, ctx.until_sync))
            started = clock()
            due = False
            if len(offs):
                self._prefetch(tgt, offs)
                landing.stage_out(seg, len(offs), offs, ctx.seeds(tgt))
                due = ctx.sync_due(len(offs))
            batches = [pending] if pending is not None else []
            pending = (seg, started, tgt.copy(), offs.copy()) if len(offs) else None
            if due:
                batches.append(pending)
                pending = None
            for pseg, t0, ptgt, poffs in batches:
                landing.wait(pseg)
                if self.job.bs >= BIG_STORE:
                    self._prefetch(ptgt, poffs, MADV_POPULATE_WRITE)
                self._store(pseg, ptgt, poffs)
                ctx.complete(np.full(len(poffs), clock() - t0, dtype=np.int64), ptgt,
                             ok[:len(poffs)], write=True)
            if due:
                ctx.sync(fds)
            if not len(offs):
                for m in self._maps:
                    m.flush()  # msync: the stores reach the files inside the job's time
                return
            seg ^= 1

    def run(self) -> None:
        if self.job.writes:
            self._run_writes()
            return
        ctx, landing = self.ctx, self.landing
        ok = np.full(self.job.iodepth, self.job.bs, dtype=np.int32)
        pending: tuple[int, int, np.ndarray, np.ndarray] | None = None
        seg = 0
        while True:
            tgt, offs = ctx.next_batch(self.job.iodepth)
            started = time.perf_counter_ns()
            if len(offs):
                self._gather(seg, tgt, offs)
                seeds = ctx.seeds(tgt) if ctx.verifying else None
                landing.copy(seg, len(offs), offs if ctx.verifying else None, seeds)
            if pending is not None:
                pseg, t0, ptgt, poffs = pending
                landing.wait(pseg)
                now = time.perf_counter_ns()
                res = ok[:len(poffs)]
                if ctx.verifying:
                    ctx.record_mismatches(ptgt, poffs, landing.mismatches(pseg, res))
                ctx.complete(np.full(len(poffs), now - t0, dtype=np.int64), ptgt, res)
            if not len(offs):
                return
            pending = (seg, started, tgt.copy(), offs.copy())
            seg ^= 1

    def close(self) -> None:
        self._views.clear()  # views must go before the buffers they point into
        self._rows = None
        self.landing.close()
        for m in self._maps:
            m.close()


class MmapFetch:
    """Page-fault gathers from memory-mapped feature files, then one copy to the device."""

    page_cache = True

    def __init__(self, table: RowTable, xp: Any, dim: int, drop_cache: bool, max_rows: int,
                 advice: str) -> None:
        self.xp, self.dim, self.layout = xp, dim, table.layout
        self.rows = 0
        # how the rows were fetched, for the result
        self.facts = {"mmap_advice": advice, "drop_cache": drop_cache}
        self._maps, self._views = [], []
        if drop_cache:
            evict(table.paths)
        for t, path in enumerate(table.paths):
            fd = os.open(path, os.O_RDONLY)
            try:
                m, view = map_rows(fd, os.fstat(fd).st_size, table.layout.header,
                                   table.layout.rows_on(t, table.rows), table.layout.row_bytes,
                                   mm.MADV_RANDOM if advice == "random" else mm.MADV_NORMAL)
            finally:
                os.close(fd)  # the mapping keeps the file
            self._maps.append(m)
            self._views.append(view.view(np.float32)[:, :dim])
        self._staging = np.empty((0, dim), np.float32)
        self._buffer(max_rows)  # now, not under memory_limit, where it would crowd the cache

    def _buffer(self, n: int) -> np.ndarray:
        """Staging rows, grown as needed (page-locked for GPU copies)."""
        if len(self._staging) < n:
            self._staging = gpu.host_rows(self.xp, max(n, 2 * len(self._staging)), self.dim)
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


class MappedTensors:
    """The loaders' way with checkpoints (``torch.load(mmap=True)``, safetensors): each file
    mapped shared; a save stores every piece into the mapping (a GPU shard copied straight
    into the mapped pages) and the sync flushes it (msync, then fsync); a restore maps the
    files again and copies each piece out of the mapping through page faults."""

    page_cache = True

    def __init__(self, files: list[Target], extents: list[Extent], request: TensorRequest,
                 xp: Any) -> None:
        self._files, self._extents, self._xp = files, extents, xp
        self._pieces = pieces(extents, request.chunk)
        self._maps: list[mm.mmap] = []
        self.facts: dict[str, Any] = {"chunk": request.chunk}

    def _map(self, write: bool) -> list[np.ndarray]:
        prot = mm.PROT_READ | (mm.PROT_WRITE if write else 0)
        self._maps = [mm.mmap(f.fd, f.size, flags=mm.MAP_SHARED, prot=prot)
                      for f in self._files]
        return [np.frombuffer(m, dtype=np.uint8) for m in self._maps]

    def _unmap(self) -> None:
        for m in self._maps:
            m.close()
        self._maps = []

    def _move(self, tensors: Any, write: bool) -> int:
        views, first = self._map(write), 0
        for e, at, off, n in self._pieces.tolist():
            _copy(views[self._extents[e].file][off:off + n], tensors[e][at:at + n], write,
                  self._xp is np)
            first = first or time.perf_counter_ns()
        views.clear()  # views must go before the mappings they point into
        return first

    def save(self, tensors: Any) -> int:
        return self._move(tensors, True)

    def sync(self) -> None:
        for m in self._maps:
            m.flush()
        self._unmap()  # mapped pages would stay cached whatever the workload drops
        sync_files([f.fd for f in self._files])

    def restore(self, tensors: Any) -> int:
        first = self._move(tensors, False)
        self._unmap()
        return first

    def close(self) -> None:
        self._unmap()


def _copy(page: np.ndarray, shard: Any, store: bool, host: bool) -> None:
    """Store ``shard`` (NumPy, or CuPy in GPU memory) into mapped ``page``, or load it back."""
    if store:
        if host:
            page[:] = shard
        else:
            shard.get(out=page)
    elif host:
        shard[:] = page
    else:
        shard.set(page)
