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

Its channel (``MmapChannel``, for the GNN gather and the checkpoint mover above the engines)
copies each request out of (into) a shared mapping of its file, faulting pages in as the
loaders do.
"""

from __future__ import annotations

import ctypes
import mmap as mm
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, Channel, ChannelSpec, File
from gpufio.core.rows import RowSupport
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
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

    capability = Capability(memory=(HOST,), page_cache=True)

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> "MmapChannel":
        return MmapChannel(files, spec, cls.settings(job).drop_cache)

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


class MmapChannel(Channel):
    """Requests copied out of (into) shared mappings of the files inside ``submit``, the
    next ``reap`` handing them back: a read faults its pages in as the loaders' gathers do
    (the mapping's advice: ``advise``), a write stores into the page cache as a mapped
    writer does. A file is mapped at its first request and unmapped by ``sync`` (after
    its flush) and ``close``: a read after a sync maps it again, so its pages come from the
    file, not from a mapping that kept them. With ``drop_cache`` the files' cached pages
    are evicted first, for cold numbers."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec, drop_cache: bool) -> None:
        super().__init__(spec)
        self._fds = [f.fd for f in files]
        self._maps: list[mm.mmap | None] = [None] * len(files)
        self._views: list[np.ndarray | None] = [None] * len(files)
        self._writable = [False] * len(files)
        self._advice = mm.MADV_NORMAL
        self._tags: list[np.ndarray] = []
        self._res: list[np.ndarray] = []
        self.facts = {"drop_cache": drop_cache}
        if drop_cache:
            for fd in self._fds:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    @property
    def inflight(self) -> int:
        return sum(len(t) for t in self._tags)

    def room(self) -> int:
        """A mapping has no queue to bound: a whole batch is one gather (as the loaders'
        is), whatever the depth; a depth's worth per call would only add calls."""
        return 1 << 62

    def advise(self, advice: str) -> None:
        """The mappings' madvise: 'normal' (the kernel's read-around, as DGL's loader leaves
        it) or 'random' (a fault reads only its page)."""
        self._advice = mm.MADV_RANDOM if advice == "random" else mm.MADV_NORMAL
        self.facts["mmap_advice"] = advice
        for m in self._maps:
            if m is not None:
                m.madvise(self._advice)

    def _view(self, t: int, write: bool = False) -> np.ndarray:
        """File ``t``'s bytes, mapped on first use for the direction asked (an empty file:
        no bytes). A change of direction maps the file again, as the loaders map a
        checkpoint once to save it and again to load it: stores into pages a read mapped
        cost a write-protect fault each, twice a fresh mapping's stores."""
        view = self._views[t]
        if view is not None and self._writable[t] != write:
            view = None  # no export of the mapping may outlive it
            self._unmap(t)
        if view is None:
            size = os.lseek(self._fds[t], 0, os.SEEK_END)  # a block device's too
            if not size:
                return np.zeros(0, np.uint8)
            prot = mm.PROT_READ | (mm.PROT_WRITE if write else 0)
            m = mm.mmap(self._fds[t], size, flags=mm.MAP_SHARED, prot=prot)
            m.madvise(self._advice)
            self._maps[t], view = m, np.frombuffer(m, dtype=np.uint8)
            self._views[t], self._writable[t] = view, write
        return view

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(self.room(), len(off))
        tgt, off, length = (np.asarray(a[:k], np.int64) for a in (tgt, off, length))
        addr = np.asarray(addr[:k], np.uint64)
        writes = np.broadcast_to(np.asarray(write, bool), (len(tag),))[:k]
        res = None if writes.any() else self._gather(tgt, off, length, addr)
        if res is None:
            res = np.array([self._copy(t, o, n, a, w) for t, o, n, a, w in zip(
                tgt.tolist(), off.tolist(), length.tolist(), addr.tolist(), writes.tolist())],
                dtype=np.int64)
        self._tags.append(np.asarray(tag[:k], np.int64))
        self._res.append(res)
        return k

    def _copy(self, t: int, off: int, n: int, addr: int, write: bool) -> int:
        """One request: the bytes moved (fewer past the file's end)."""
        view = self._view(t, write)
        got = max(0, min(n, len(view) - off))
        if got:
            page = view.ctypes.data + off
            if write:
                ctypes.memmove(page, addr, got)
            else:
                ctypes.memmove(addr, page, got)
        return got

    def _gather(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray,
                addr: np.ndarray) -> np.ndarray | None:
        """Reads of equal rows (offsets a whole number of rows apart in each file) into
        consecutive buffers, as one fancy-indexed gather per file (gather_rows) instead of
        a copy per request; None when the batch is not that shape or leaves a file."""
        n = len(off)
        if not n:
            return np.zeros(0, np.int64)
        rb, first = int(length[0]), int(off[0])
        if (rb <= 0 or (length != rb).any() or (np.diff(addr.astype(np.int64)) != rb).any()
                or ((off - first) % rb).any()):
            return None
        skip = first % rb
        rows = (off - skip) // rb
        files = np.unique(tgt)
        tables = []
        for t in range(int(files[-1]) + 1):
            view = self._view(t) if t in files else np.zeros(0, np.uint8)
            held = max(0, (len(view) - skip) // rb)
            tables.append(view[skip:skip + held * rb].reshape(held, rb))
        if any((rows[tgt == t] >= len(tables[t])).any() for t in files.tolist()):
            return None
        out = np.ctypeslib.as_array((ctypes.c_uint8 * (n * rb)).from_address(int(addr[0])))
        gather_rows(tables, tgt, rows, out.reshape(n, rb))
        return np.full(n, rb, np.int64)

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        if not self._tags:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        done = np.concatenate(self._tags), np.concatenate(self._res)
        self._tags, self._res = [], []
        return done

    def _unmap(self, t: int | None = None) -> None:
        """Unmap file ``t`` (None: every file)."""
        for i in range(len(self._fds)) if t is None else (t,):
            self._views[i] = None  # the view must go before its mapping
            m, self._maps[i] = self._maps[i], None
            if m is not None:
                m.close()

    def sync(self, fds: Sequence[int]) -> None:
        """msync, then unmap (mapped pages would stay cached whatever the workload drops),
        then fsync every file."""
        for m in self._maps:
            if m is not None:
                m.flush()
        self._unmap()
        super().sync(fds)

    def close(self) -> None:
        self._unmap()
