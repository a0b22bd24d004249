"""What an engine sees of the runner: work to do, and where to record what happened.

Each worker gets its own context and recorder (core/recorder), so the hot path takes no
locks; the job's control words and the workers' live blocks are in core/shared.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from gpufio.core import pattern
from gpufio.core.rate import Pacer
from gpufio.core.recorder import MAX_BAD_OFFSETS, PENDING, DeviceTotals, Recorder
from gpufio.core.shared import READ, WRITE, JobControl
from gpufio.core.stats import CpuTimes


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
        """The address of the job's control words (stop: nonzero, issue nothing more; then
        measuring), for a compiled loop that reads them per I/O."""
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

    def next_scheduled(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``next_batch`` for a loop that paces its own I/Os: up to ``n`` pairs at once,
        with each one's due time under a rate cap (core/rate.Pacer.schedule; None: no cap),
        so that it keeps reaping while none is due."""
        if self.pacer is None:
            return (*self.next_batch(n), None)
        if self.done or not n:
            return np.empty(0, np.int32), np.empty(0, np.uint64), None
        tgt, offs = self.stream.next(n)
        return tgt, offs, self.pacer.schedule(len(offs))

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
        live[5] = time.monotonic_ns()
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
                 write: np.ndarray | bool = False, ramp: bool = False) -> None:
        """Record finished I/Os: latency (ns), target index, result (int32 bytes, or -errno),
        and whether each wrote (a bool for all of them, or a bool array for a mixed batch).
        ``ramp``: they finished before the measured window (a compiled loop's call that
        began in ramp_time ends when the window begins): checked for failures, not counted."""
        if isinstance(write, np.ndarray):
            for d in (READ, WRITE):
                mask = write if d else ~write
                if mask.any():
                    self._complete(np.asarray(lat_ns)[mask], tgt[mask], res[mask], d, ramp)
            return
        self._complete(lat_ns, tgt, res, WRITE if write else READ, ramp)

    def _complete(self, lat_ns: np.ndarray, tgt: np.ndarray, res: np.ndarray, d: int,
                  ramp: bool) -> None:
        rec = self.rec
        live = rec.live
        n = len(res)
        live[0] += n
        # one bytes comparison instead of a numpy reduction, which costs ten times more
        all_ok = n <= PENDING and res.tobytes() == self._all_ok[:4 * n]
        if not all_ok:
            self._record_failures(tgt, np.asarray(res, dtype=np.int64))
        if ramp:
            return
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
        full = np.flatnonzero(np.asarray(res) == self.bs)
        if not len(full):
            return []
        rows = slots if len(full) == len(slots) else slots[full]
        bad = pattern.bad_ios_host(np.ascontiguousarray(rows), np.asarray(offs)[full],
                                   self.seeds(np.asarray(tgt)[full]), self.bs)
        return full[bad].tolist()

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
