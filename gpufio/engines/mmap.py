"""mmap: the GNN and recommender loaders' baseline (DGL/PyG memory-mapped features).

Its one primitive is ``MmapChannel``: each request is copied out of (into) a shared mapping
of its file inside ``submit``, faulting pages in as the loaders do. The loops above the
engines run it: the block workload's staged loop (loops/block_staged) gathers a batch of ``iodepth``
blocks through page faults into page-locked host memory, copies the batch to GPU memory
asynchronously and gathers the next batch while the copy runs (double buffering: the
``segments`` option, 1 by default); the GNN gather and the checkpoint mover use the same
channel. An I/O is done when its batch is in GPU memory; its latency runs from the start of
its batch's gather. This path reads through the page cache by nature (the result says
page_cache: true); ``drop_cache`` evicts the targets' cached pages during setup, so a run
starts cold. A target that shrinks under a mapping makes the kernel raise SIGBUS, as it
would in any mmap loader. Writes go the other way: a batch's blocks are generated in GPU
memory, copied down to page-locked memory and stored through a shared writable mapping (the
next batch's copy overlapping the stores), and the mappings are flushed (msync) before the
job ends, inside its time (``Channel.finish``). A store into a page that is not cached faults
it in with a synchronous read first, so each batch's pages are asked for (MADV_WILLNEED,
asynchronous readahead) as soon as the loop draws the batch (``Channel.expect``), as a
careful mmap writer does: the reads of the next batch overlap the stores of this one.
"""

from __future__ import annotations

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
from gpufio.io.staging import segment_shape
from gpufio.native import memory

if TYPE_CHECKING:
    from gpufio.core.job import Job

# Linux 5.14's MADV_POPULATE_WRITE (Python's mmap module does not name it): fault a range in
# writable with one call instead of a fault per page, for stores of BIG_STORE bytes or more
MADV_POPULATE_WRITE = 23
BIG_STORE = 64 << 10
# how the loop walks the files -> the mappings' advice (ChannelSpec.access)
ACCESS_ADVICE = {"random": mm.MADV_RANDOM, "sequential": mm.MADV_SEQUENTIAL}


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


def page_runs(tgt: np.ndarray, off: np.ndarray, length: np.ndarray
              ) -> list[tuple[int, int, int]]:
    """(target, page-aligned start, bytes) of the pages requests at ``off`` touch, runs of
    adjacent or overlapping requests of one target as one range: one madvise each."""
    page = mm.PAGESIZE
    starts = off.astype(np.int64) // page * page
    ends = off.astype(np.int64) + length.astype(np.int64)
    out, lo = [], 0
    for i in range(1, len(off) + 1):
        if i < len(off) and tgt[i] == tgt[lo] and starts[i - 1] <= starts[i] <= ends[i - 1]:
            continue  # the same run of pages, continued
        out.append((int(tgt[lo]), int(starts[lo]), int(ends[i - 1] - starts[lo])))
        lo = i
    return out


@register
class Mmap(Engine):
    """Page-fault gathers from memory-mapped targets, then asynchronous H2D copies."""

    name = "mmap"
    summary = ("targets memory-mapped, blocks gathered through page faults into pinned memory, "
               "then copied to GPU memory")
    peer = "DGL/PyG memory-mapped feature loaders"
    iodepth_means = ("blocks gathered per batch (each fault is synchronous), in "
                     "iodepth / segments per copy")
    rows = RowSupport(advice=True, baseline=True)
    uses_gpu = True
    worker_kind = "thread"
    options = (
        Option("drop_cache", "bool", False, "evict the targets' cached pages before the run "
               "(posix_fadvise DONTNEED), for cold numbers"),
        Option("segments", "int", 1, "groups the iodepth blocks of a batch are gathered and "
               "copied to the GPU in (1: the whole batch gathered while the last one's copy "
               "runs, as the loaders double-buffer)", minimum=1),
        PROCESSES,
    )

    capability = Capability(memory=(HOST,), page_cache=True, synchronous=True)

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
        o = cls.settings(job)
        return {**super().describe(job), "page_cache": True, "drop_cache": o.drop_cache,
                **({"write_prefetch": "MADV_WILLNEED, one batch ahead"
                    + (", then MADV_POPULATE_WRITE" if job.bs >= BIG_STORE else "")}
                   if job.writes else {}),
                "gpus": list(job.gpu_list), "lands_in": "gpu memory",
                "batch": segment_shape(o.segments, job.iodepth)[1]}


class MmapChannel(Channel):
    """Requests copied out of (into) shared mappings of the files inside ``submit``, the
    next ``reap`` handing them back: a read faults its pages in as the loaders' gathers do
    (the mapping's advice: ``spec.access``, or ``advise``), a write stores into the page
    cache as a mapped writer does. A file is mapped at its first request (and again when
    a request goes the other way) and unmapped by ``sync`` (after its flush) and ``close``:
    a read after a sync maps it again, so its pages come from the file, not from a mapping
    that kept them. With ``drop_cache`` the
    files' cached pages are evicted first, for cold numbers."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec, drop_cache: bool) -> None:
        super().__init__(spec)
        self._fds = [f.fd for f in files]
        self._maps: list[mm.mmap | None] = [None] * len(files)
        self._views: list[np.ndarray | None] = [None] * len(files)
        self._writable = [False] * len(files)
        self._advice = ACCESS_ADVICE.get(spec.access or "", mm.MADV_NORMAL)
        self._tags: list[np.ndarray] = []
        self._res: list[np.ndarray] = []
        self._took: list[np.ndarray] = []
        self._times: np.ndarray | None = None
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
        t0 = time.perf_counter_ns()
        tgt, off, length = (np.asarray(a[:k], np.int64) for a in (tgt, off, length))
        addr = np.asarray(addr[:k], np.uint64)
        writes = np.broadcast_to(np.asarray(write, bool), (len(tag),))[:k]
        every = bool(writes.all()) if k else False
        if every and int(length.max()) >= BIG_STORE:
            self._advise_pages(tgt, off, length, MADV_POPULATE_WRITE)
        res = self._rows(tgt, off, length, addr, every) if every or not writes.any() else None
        if res is None:
            res = np.array([self._copy(t, o, n, a, w) for t, o, n, a, w in zip(
                tgt.tolist(), off.tolist(), length.tolist(), addr.tolist(), writes.tolist())],
                dtype=np.int64)
        self._tags.append(np.asarray(tag[:k], np.int64))
        self._res.append(res)
        # every request of the call completes when the call does: its time is the call's
        self._took.append(np.full(k, time.perf_counter_ns() - t0, np.int64))
        return k

    def _copy(self, t: int, off: int, n: int, addr: int, write: bool) -> int:
        """One request: the bytes moved (fewer past the file's end)."""
        view = self._view(t, write)
        got = max(0, min(n, len(view) - off))
        if got:
            page = view.ctypes.data + off
            if write:
                memory.memmove(page, addr, got)
            else:
                memory.memmove(addr, page, got)
        return got

    def _rows(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
              write: bool) -> np.ndarray | None:
        """Requests of equal rows (offsets a whole number of rows apart in each file) from or
        into consecutive buffers, as one fancy-indexed gather (gather_rows) or store per
        file instead of a copy per request; None when the batch is not that shape or leaves
        a file."""
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
            view = self._view(t, write) if t in files else np.zeros(0, np.uint8)
            held = max(0, (len(view) - skip) // rb)
            tables.append(view[skip:skip + held * rb].reshape(held, rb))
        if any((rows[tgt == t] >= len(tables[t])).any() for t in files.tolist()):
            return None
        buf = memory.array_at(int(addr[0]), np.uint8, n * rb).reshape(n, rb)
        if not write:
            gather_rows(tables, tgt, rows, buf)
        elif len(tables) == 1:
            tables[0][rows] = buf
        else:
            for t in files.tolist():
                mask = tgt == t
                tables[t][rows[mask]] = buf[mask]
        return np.full(n, rb, np.int64)

    def expect(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray,
               write: bool) -> None:
        """Writes coming: ask for the pages they will store into (MADV_WILLNEED starts
        reading them in and returns once the reads are queued), since a store into a page
        that is not cached reads it first, synchronously."""
        if write:
            self._advise_pages(np.asarray(tgt, np.int64), np.asarray(off, np.int64),
                               np.asarray(length, np.int64), mm.MADV_WILLNEED)

    def _advise_pages(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray,
                      advice: int) -> None:
        """``advice`` over the pages of the writes at ``off`` (mapping each file writable).
        MADV_POPULATE_WRITE maps them writable in one call where the kernel has it; where
        it has not (EINVAL), the stores fault them in instead."""
        for t, start, nbytes in page_runs(tgt, off, length):
            self._view(t, True)
            m = self._maps[t]
            if m is None or start >= len(m):  # nothing of the file's to ask for
                continue
            try:
                m.madvise(advice, start, min(nbytes, len(m) - start))
            except OSError:
                if advice == mm.MADV_WILLNEED:
                    raise

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        if not self._tags:
            self._times = None
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        done = np.concatenate(self._tags), np.concatenate(self._res)
        self._times = np.concatenate(self._took)
        self._tags, self._res, self._took = [], [], []
        return done

    def times(self) -> np.ndarray | None:
        return self._times

    def _unmap(self, t: int | None = None) -> None:
        """Unmap file ``t`` (None: every file)."""
        for i in range(len(self._fds)) if t is None else (t,):
            self._views[i] = None  # the view must go before its mapping
            m, self._maps[i] = self._maps[i], None
            if m is not None:
                m.close()

    def finish(self) -> None:
        """msync every mapping written through: the stores reach the files inside the
        job's time."""
        for m, writable in zip(self._maps, self._writable):
            if m is not None and writable:
                m.flush()

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
