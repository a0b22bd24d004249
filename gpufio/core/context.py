"""What an engine sees of the runner: work to do, and where to record what happened.

Each worker gets its own context and recorder, so the hot path takes no locks. A job's
control words (stop, measuring) and every worker's live counters and latency histogram sit
in one anonymous shared mapping, so the runner can steer and watch workers whether they are
threads or forked processes. Completions are recorded in numpy batches (latencies, byte
counts or negative errnos), never one Python object per I/O.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufio.core import pattern
from gpufio.core.rate import Pacer
from gpufio.core.stats import PLAT_NR, CpuTimes, LatencyStats

MAX_BAD_OFFSETS = 8
PENDING = 8192
FLUSH_NS = 100_000_000
_LIVE = 5  # completed, then measured ios and bytes of each direction (read, write)
_BLOCK = _LIVE + 2 * PLAT_NR
READ, WRITE = 0, 1
DIRECTIONS = ("read", "write")


class JobShared:
    """One job's shared memory: control words plus a live block per worker.

    The memory is a memfd mapped MAP_SHARED: forked workers inherit the mapping, threads
    share it, and spawned workers (fresh interpreters) map the same memfd again through
    /proc/<runner pid>/fd/<fd> (``source`` says which), with no name in any filesystem.
    Threads and forked workers also share an eventfd that the stop makes readable, so an
    engine blocked in a wait for completions can be woken by it (a spawned worker has none).
    """

    def __init__(self, nworkers: int, source: tuple[int, int] | None = None) -> None:
        size = 8 * (2 + nworkers * _BLOCK)
        if source is None:
            fd = os.memfd_create("gpufio-job", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            self.source = (os.getpid(), fd)
        else:
            fd = os.open(f"/proc/{source[0]}/fd/{source[1]}", os.O_RDWR | os.O_CLOEXEC)
            self.source = source
        try:
            self._mem = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            if source is not None:
                os.close(fd)
        self._fd = fd if source is None else -1
        wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK) if source is None else -1
        words = np.frombuffer(self._mem, dtype=np.int64)
        self.control = JobControl((ctypes.c_int64 * 2).from_buffer(self._mem), wake)
        if wake >= 0:  # open as long as anything may stop the job: a worker's wait polls it
            weakref.finalize(self.control, os.close, wake)
        self.blocks = [words[2 + i * _BLOCK:2 + (i + 1) * _BLOCK] for i in range(nworkers)]

    def close_source(self) -> None:
        """Close the memfd once every worker has mapped it (the mappings stay valid)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def live(self, worker: int) -> tuple[int, int, int, np.ndarray]:
        """A worker's (completed, ios, bytes, histogram) as last published, both
        directions together."""
        block = self.blocks[worker]
        return (int(block[0]), int(block[1] + block[3]), int(block[2] + block[4]),
                block[_LIVE:_LIVE + PLAT_NR] + block[_LIVE + PLAT_NR:])


class JobControl:
    """The runner's side of steering: stop, and whether the measured phase has begun."""

    def __init__(self, words: ctypes.Array, wake_fd: int = -1) -> None:
        self._w = words  # ctypes, not numpy: a flag read costs a third as much
        self.wake_fd = wake_fd

    @property
    def stop_address(self) -> int:
        """The address of the stop word, for a compiled loop that reads it per I/O."""
        return ctypes.addressof(self._w)

    @property
    def stopping(self) -> bool:
        """True once workers must issue nothing more."""
        return bool(self._w[0])

    def stop(self) -> None:
        """Tell every worker to stop issuing, and wake those waiting on ``wake_fd``."""
        self._w[0] = 1
        if self.wake_fd >= 0:
            try:
                os.eventfd_write(self.wake_fd, 1)
            except OSError:  # already readable (the counter is full): woken all the same
                pass

    @property
    def measuring(self) -> bool:
        """True from the end of ramp_time on."""
        return bool(self._w[1])

    def begin_measuring(self) -> None:
        """Start recording (end of ramp)."""
        self._w[1] = 1


@dataclass
class Recorder:
    """One worker's counts. Measured fields cover the measured phase only (ramp excluded),
    per direction (READ, WRITE): a mixed job reports reads and writes apart, as fio does.

    Latencies are buffered and binned PENDING at a time (or every FLUSH_NS): binning costs
    a dozen numpy calls, which per small batch would dominate a fast engine's loop. The
    counters and the histograms live in the worker's shared block, where the runner reads them.
    """

    ntargets: int
    block: np.ndarray
    errors: Counter = field(default_factory=Counter)
    bad_offsets: list[tuple[int, int]] = field(default_factory=list)
    cpu: CpuTimes | None = None
    facts: dict[str, list[Any]] = field(default_factory=dict)
    syncs: int = 0
    sync_ns: int = 0

    def __post_init__(self) -> None:
        # ctypes view of the block's counters: an increment costs half a numpy element update
        self.live = (ctypes.c_int64 * _LIVE).from_address(self.block.ctypes.data)
        self.lats = [LatencyStats(hist=self.block[_LIVE + d * PLAT_NR:_LIVE + (d + 1) * PLAT_NR])
                     for d in (READ, WRITE)]
        self.short = np.zeros(self.ntargets, dtype=np.int64)
        self.multi_ios = np.zeros((2, self.ntargets), dtype=np.int64)
        self.multi_bytes = np.zeros((2, self.ntargets), dtype=np.int64)
        self.verify_failures = np.zeros(self.ntargets, dtype=np.int64)
        self._pending = np.empty((2, PENDING), dtype=np.int64)
        self._npending = [0, 0]
        self._flushed_at = time.monotonic_ns()

    @property
    def completed(self) -> int:
        """I/Os finished in any phase, with any outcome (progress of I/O-bound jobs)."""
        return self.live[0]

    def ios(self, d: int) -> int:
        """Measured I/Os of direction ``d`` that transferred all their bytes."""
        return self.live[1 + 2 * d]

    def bytes(self, d: int) -> int:
        """Measured bytes of direction ``d``."""
        return self.live[2 + 2 * d]

    def count(self, d: int, ios: int, nbytes: int) -> None:
        """Add measured I/Os and bytes of direction ``d``."""
        self.live[1 + 2 * d] += ios
        self.live[2 + 2 * d] += nbytes

    def target_ios(self, d: int) -> np.ndarray:
        """Measured I/Os per target (kept per target only when there are several)."""
        return self.multi_ios[d].copy() if self.ntargets > 1 else np.array([self.ios(d)])

    def target_bytes(self, d: int) -> np.ndarray:
        """Measured bytes per target (kept per target only when there are several)."""
        return self.multi_bytes[d].copy() if self.ntargets > 1 else np.array([self.bytes(d)])

    def add_latencies(self, lat_ns: np.ndarray, d: int = READ) -> None:
        """Buffer latencies; bin them when the buffer fills or FLUSH_NS has passed."""
        k = len(lat_ns)
        if self._npending[d] + k > PENDING:
            self.flush()
            if k > PENDING:
                self.lats[d].add(lat_ns)
                return
        self._pending[d, self._npending[d]:self._npending[d] + k] = lat_ns
        self._npending[d] += k
        now = time.monotonic_ns()
        if now - self._flushed_at > FLUSH_NS:
            self.flush(now)

    def flush(self, now: int | None = None) -> None:
        """Bin the buffered latencies (the worker calls it; so does the end)."""
        for d in (READ, WRITE):
            if self._npending[d]:
                self.lats[d].add(self._pending[d, :self._npending[d]])
                self._npending[d] = 0
        self._flushed_at = now or time.monotonic_ns()

    def final(self) -> "FinalRecord":
        """A picklable copy of everything the result needs, for the trip back from a process."""
        self.flush()
        dirs = [DirRecord(lat=LatencyStats(hist=lat.hist.copy(), n=lat.n, mean=lat.mean,
                                           m2=lat.m2, min=lat.min, max=lat.max),
                          ios=self.ios(d), bytes=self.bytes(d), target_ios=self.target_ios(d),
                          target_bytes=self.target_bytes(d))
                for d, lat in enumerate(self.lats)]
        return FinalRecord(dirs=dirs, short=self.short, errors=self.errors,
                           verify_failures=self.verify_failures, bad_offsets=self.bad_offsets,
                           cpu=self.cpu, facts=self.facts, completed=self.completed,
                           syncs=self.syncs, sync_ns=self.sync_ns)


@dataclass
class DirRecord:
    """One direction's measured counts of a worker."""

    lat: LatencyStats
    ios: int
    bytes: int
    target_ios: np.ndarray
    target_bytes: np.ndarray


@dataclass
class FinalRecord:
    """What a finished worker reports; plain data, safe to pickle. ``dirs``: READ, WRITE."""

    dirs: list[DirRecord]
    short: np.ndarray
    errors: Counter
    verify_failures: np.ndarray
    bad_offsets: list[tuple[int, int]]
    cpu: CpuTimes | None
    facts: dict[str, list[Any]]
    completed: int = 0
    syncs: int = 0
    sync_ns: int = 0

    @property
    def ios(self) -> int:
        """Measured I/Os, both directions."""
        return sum(d.ios for d in self.dirs)

    @property
    def bytes(self) -> int:
        """Measured bytes, both directions."""
        return sum(d.bytes for d in self.dirs)


@dataclass
class DeviceTotals:
    """A worker's counts kept by the engine itself (binned in GPU memory), in the Recorder's
    terms: latency sums instead of samples, per-target arrays, errors by (target, errno)."""

    completed: int
    ios: int
    bytes: int
    hist: np.ndarray
    lat_sum: int
    lat_sumsq: float
    lat_min: int
    lat_max: int
    target_ios: np.ndarray
    target_bytes: np.ndarray
    short: np.ndarray
    verify_failures: np.ndarray
    errors: dict[tuple[int, int], int]
    bad_offsets: list[tuple[int, int]]
    direction: int = READ


class WorkerContext:
    """Hands one worker its I/Os and records their outcomes."""

    def __init__(self, *, bs: int, stream, control: JobControl, ntargets: int, block: np.ndarray,
                 seeds: list[int] | None, verify: bool, continue_on_error: bool,
                 own_cpu: bool = False, worker: int = 0, sync_every: int = 0,
                 datasync: bool = False, fill_threads: int = 1,
                 pacer: Pacer | None = None) -> None:
        self.bs = bs
        self.pacer = pacer  # rate_iops: when I/Os may go (None: at once)
        # threads that generate the pattern of host-memory writes (the CPU's fill, not the
        # I/O, is what limits large writes from one worker otherwise)
        self.fill_threads = fill_threads
        self.worker = worker
        self.stream = stream
        self.control = control
        self.rec = Recorder(ntargets, block)
        # each target's pattern seed: what verify checks against and what writes write
        self._seeds = seeds
        self._verify = verify
        self._sync_every, self._datasync, self._since_sync = sync_every, datasync, 0
        self._continue = continue_on_error
        self._halted = False
        self._own_cpu = own_cpu
        self._cpu0: CpuTimes | None = None
        self._all_ok = np.full(PENDING, bs, dtype=np.int32).tobytes()
        self._measuring = False

    def spawn_args(self) -> dict:
        """What a spawned worker needs to build this context again around the job's shared
        memory (everything here pickles; the shared views do not)."""
        return {"bs": self.bs, "stream": self.stream, "ntargets": self.rec.ntargets,
                "seeds": self._seeds, "verify": self._verify, "continue_on_error": self._continue,
                "sync_every": self._sync_every, "datasync": self._datasync,
                "worker": self.worker, "fill_threads": self.fill_threads, "pacer": self.pacer}

    @property
    def measuring(self) -> bool:
        """Whether the measured phase has begun (the ramp is over)."""
        return self.control.measuring

    @property
    def stop_address(self) -> int:
        """The address of the job's stop word (nonzero: issue nothing more), for a compiled
        loop that reads it per I/O."""
        return self.control.stop_address

    @property
    def stop_fd(self) -> int:
        """An eventfd that becomes readable when the job is stopped (-1: none here): an
        engine that blocks in a wait keeps a poll of it in flight, so the stop wakes it."""
        return self.control.wake_fd

    @property
    def continue_on_error(self) -> bool:
        """Whether a failed or short I/O lets the worker go on (else it stops issuing)."""
        return self._continue

    def regions(self) -> tuple[np.ndarray, np.ndarray]:
        """Each target's first byte and number of blocks, for engines that draw offsets
        themselves (on the GPU)."""
        return self.stream.region_arrays()

    def block_aligned(self, bs: int, base: int) -> bool:
        """Whether every offset this worker will hand out is a whole number of ``bs`` blocks
        after ``base`` (a replayed iolog need not be), for engines that map whole blocks."""
        return self.stream.block_aligned(bs, base)

    @property
    def budget(self) -> int | None:
        """I/Os this worker may still issue (None: time-based, no budget)."""
        return self.stream.remaining

    @property
    def done(self) -> bool:
        """True once the worker should issue nothing more."""
        return self._halted or self.control.stopping

    def next_batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` (target index, offset) pairs; empty arrays mean: stop issuing. Under
        a rate cap, those due now, after a wait until at least one is."""
        if self.pacer is not None and not self.done:
            n = self.pacer.wait(n, lambda: self.done)
        if self.done or not n:
            return np.empty(0, np.int32), np.empty(0, np.uint64)
        return self.stream.next(n)

    def due(self, n: int) -> tuple[int, int]:
        """How many of ``n`` I/Os a rate cap lets go now, and when none, the ns until one
        may: for engines that would rather reap their I/Os in flight than wait in
        ``next_batch`` (a completion reaped late would count the wait as latency)."""
        return (n, 0) if self.pacer is None else self.pacer.due(n)

    def last_writes(self) -> np.ndarray | bool:
        """Which I/Os of the batch ``next_batch`` last handed out write: a bool array for a
        mixed job, else the job's one direction as a bool (engines branch once, not per I/O)."""
        return self.stream.last_writes()

    def write_flags(self, n: int) -> list[bool]:
        """``last_writes`` as one bool per I/O of an ``n``-I/O batch, for engines that issue
        I/O by I/O."""
        writes = self.last_writes()
        return writes.tolist() if isinstance(writes, np.ndarray) else [writes] * n

    def finish(self) -> None:
        """Close the books: bin pending latencies, and take this process's CPU if asked."""
        self.rec.flush()
        if self._own_cpu and self._cpu0 is not None:
            self.rec.cpu = CpuTimes.now() - self._cpu0

    def publish(self, completed: int, ios: int, nbytes: int, hist: np.ndarray,
                d: int = READ) -> None:
        """Live counters of an engine that counts on the device (direction ``d``), for the
        live display."""
        live = self.rec.live
        live[0], live[1 + 2 * d], live[2 + 2 * d] = completed, ios, nbytes
        self.rec.lats[d].hist[:] = hist

    def note(self, key: str, values: list[Any]) -> None:
        """An engine's own measurement of the run (one value per kernel thread, ring, ...):
        the result's engine facts carry every worker's values under ``key`` (none: no key)."""
        if values:
            self.rec.facts.setdefault(key, []).extend(values)

    def absorb(self, t: DeviceTotals) -> None:
        """Take an engine's own final counts as this worker's record (instead of ``complete``)."""
        rec, d = self.rec, t.direction
        self.publish(t.completed, t.ios, t.bytes, t.hist, d)
        if t.ios:
            lat, mean = rec.lats[d], t.lat_sum / t.ios
            lat.n, lat.mean, lat.min, lat.max = t.ios, mean, t.lat_min, t.lat_max
            lat.m2 = max(t.lat_sumsq - t.ios * mean * mean, 0.0)
        rec.multi_ios[d] = t.target_ios
        rec.multi_bytes[d] = t.target_bytes
        rec.short += t.short
        rec.verify_failures += t.verify_failures
        rec.errors.update(t.errors)
        rec.bad_offsets.extend(t.bad_offsets[:MAX_BAD_OFFSETS - len(rec.bad_offsets)])

    def complete(self, lat_ns: np.ndarray, tgt: np.ndarray, res: np.ndarray,
                 write: np.ndarray | bool = False) -> None:
        """Record finished I/Os: latency (ns), target index, result (int32 bytes, or -errno),
        and whether each wrote (a bool for all of them, or a bool array for a mixed batch)."""
        if isinstance(write, np.ndarray):
            for d in (READ, WRITE):
                mask = write if d else ~write
                if mask.any():
                    self._complete(np.asarray(lat_ns)[mask], tgt[mask], res[mask], d)
            return
        self._complete(lat_ns, tgt, res, WRITE if write else READ)

    def _complete(self, lat_ns: np.ndarray, tgt: np.ndarray, res: np.ndarray, d: int) -> None:
        rec = self.rec
        live = rec.live
        n = len(res)
        live[0] += n
        # one bytes comparison instead of a numpy reduction, which costs ten times more
        all_ok = n <= PENDING and res.tobytes() == self._all_ok[:4 * n]
        if not all_ok:
            self._record_failures(tgt, np.asarray(res, dtype=np.int64))
        if not self._measuring:  # once on, measuring never turns off: skip the shared read
            if not self.control.measuring:
                return
            self._measuring = True
            if self._own_cpu:
                self._cpu0 = CpuTimes.now()
        if all_ok:
            rec.add_latencies(lat_ns, d)
            rec.count(d, n, n * self.bs)
            if rec.ntargets > 1:
                counts = np.bincount(tgt, minlength=rec.ntargets)
                rec.multi_ios[d] += counts
                rec.multi_bytes[d] += counts * self.bs
            return
        res = np.asarray(res, dtype=np.int64)
        ok = res == self.bs
        rec.add_latencies(np.asarray(lat_ns)[ok], d)
        nbytes = np.where(res > 0, res, 0)
        rec.count(d, int(np.count_nonzero(ok)), int(nbytes.sum()))
        rec.multi_ios[d] += np.bincount(tgt[ok], minlength=rec.ntargets)
        rec.multi_bytes[d] += np.bincount(tgt, weights=nbytes,
                                          minlength=rec.ntargets).astype(np.int64)

    @property
    def until_sync(self) -> int:
        """Writes the engine may still issue before the next fsync (no limit without one):
        it caps its batches there, so a job syncs after every N writes exactly."""
        return self._sync_every - self._since_sync if self._sync_every else PENDING

    def sync_due(self, nwrites: int) -> bool:
        """Count ``nwrites`` more writes issued; True when the next fsync (or fdatasync) is
        due: the engine then lets its writes in flight finish and calls ``sync``."""
        if not self._sync_every:
            return False
        self._since_sync += nwrites
        return self._since_sync >= self._sync_every

    def sync(self, fds: list[int]) -> None:
        """fsync (or fdatasync) ``fds``, counted and timed as fio's sync block."""
        call = os.fdatasync if self._datasync else os.fsync
        t0 = time.perf_counter_ns()
        for fd in fds:
            call(fd)
        self.synced(len(fds), time.perf_counter_ns() - t0)

    def synced(self, count: int, ns: int) -> None:
        """Count ``count`` syncs that took ``ns`` in all, as fio's sync block: ``sync``'s, or
        an engine's own (an NVMe Flush where no file is left to fsync)."""
        # a mixed batch can pass the mark: the writes beyond it count toward the next sync
        self._since_sync %= self._sync_every or 1
        if self.control.measuring:
            self.rec.syncs += count
            self.rec.sync_ns += ns

    def _record_failures(self, tgt: np.ndarray, res: np.ndarray) -> None:
        """Count short reads and errnos per target; halt unless continue_on_error."""
        rec = self.rec
        short = (res != self.bs) & (res >= 0)
        rec.short += np.bincount(tgt[short], minlength=rec.ntargets)
        failed = res < 0
        for t, err in zip(tgt[failed].tolist(), (-res[failed]).tolist()):
            rec.errors[(t, err)] += 1
        if not self._continue:
            self._halted = True

    @property
    def verifying(self) -> bool:
        """True when completed buffers must be passed to ``verify``."""
        return self._verify

    def verify(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray, res: np.ndarray) -> None:
        """Check completed I/Os against the pattern; ``slots`` is (n, bs) bytes, one row each."""
        if self._verify:
            self.record_mismatches(tgt, offs, self.mismatches(slots, tgt, offs, res))

    def mismatches(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray,
                   res: np.ndarray) -> list[int]:
        """Indices of the completed I/Os (``slots``: (n, bs) bytes in host memory) that
        brought all their bytes, but not the pattern's."""
        return [i for i in np.flatnonzero(np.asarray(res) == self.bs).tolist()
                if len(pattern.bad_ios_host(slots[i], offs[i:i + 1],
                                            self._seeds[int(tgt[i])], self.bs))]

    def seeds(self, tgt: np.ndarray) -> np.ndarray:
        """The pattern seed of each I/O's target: what a check on the GPU compares against,
        and what a write writes."""
        return np.asarray(self._seeds, dtype=np.uint64)[tgt]

    def fill(self, buf: np.ndarray, tgt: np.ndarray, offs: np.ndarray,
             rows: np.ndarray | None = None) -> None:
        """Write each I/O's pattern into its row of ``buf`` (host memory; the rows ``rows``
        of it when given) before it is written: the bytes a later read of that offset proves."""
        pattern.fill_ios(buf, offs, self.seeds(tgt), rows, threads=self.fill_threads)

    def record_mismatches(self, tgt: np.ndarray, offs: np.ndarray, bad: list[int]) -> None:
        """Count the I/Os at indices ``bad`` as failed verification; keep the first offsets."""
        for i in bad:
            t = int(tgt[i])
            self.rec.verify_failures[t] += 1
            if len(self.rec.bad_offsets) < MAX_BAD_OFFSETS:
                self.rec.bad_offsets.append((t, int(offs[i])))
