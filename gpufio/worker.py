"""What an engine sees of the runner: work to do, and where to record what happened.

Each worker thread gets its own context and recorder, so the hot path takes no locks; the
runner reads the recorders' counters for the live display and merges them at the end.
Completions are recorded in numpy batches (latencies, byte counts or negative errnos),
never one Python object per I/O.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gpufio import pattern
from gpufio.stats import LatencyStats

MAX_BAD_OFFSETS = 8
PENDING = 8192
FLUSH_NS = 100_000_000


class JobControl:
    """Shared by the runner and a job's workers: the stop signal and the measuring phase."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.measuring = False


@dataclass
class Recorder:
    """One worker's counts. Measured fields cover the measured phase only (ramp excluded).

    Latencies are buffered and binned PENDING at a time (or every FLUSH_NS): binning costs
    a dozen numpy calls, which per small batch would dominate a fast engine's loop.
    """

    ntargets: int
    lat: LatencyStats = field(default_factory=LatencyStats)
    ios: int = 0
    bytes: int = 0
    completed: int = 0
    short: np.ndarray = field(init=False)
    multi_ios: np.ndarray = field(init=False)
    multi_bytes: np.ndarray = field(init=False)
    errors: Counter = field(default_factory=Counter)
    verify_failures: np.ndarray = field(init=False)
    bad_offsets: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.short = np.zeros(self.ntargets, dtype=np.int64)
        self.multi_ios = np.zeros(self.ntargets, dtype=np.int64)
        self.multi_bytes = np.zeros(self.ntargets, dtype=np.int64)
        self.verify_failures = np.zeros(self.ntargets, dtype=np.int64)
        self._pending = np.empty(PENDING, dtype=np.int64)
        self._npending = 0
        self._flushed_at = time.monotonic_ns()

    @property
    def target_ios(self) -> np.ndarray:
        """Measured I/Os per target (kept per target only when there are several)."""
        return self.multi_ios if self.ntargets > 1 else np.array([self.ios])

    @property
    def target_bytes(self) -> np.ndarray:
        """Measured bytes per target (kept per target only when there are several)."""
        return self.multi_bytes if self.ntargets > 1 else np.array([self.bytes])

    def add_latencies(self, lat_ns: np.ndarray) -> None:
        """Buffer latencies; bin them when the buffer fills or FLUSH_NS has passed."""
        k = len(lat_ns)
        if self._npending + k > PENDING:
            self.flush()
            if k > PENDING:
                self.lat.add(lat_ns)
                return
        self._pending[self._npending:self._npending + k] = lat_ns
        self._npending += k
        now = time.monotonic_ns()
        if now - self._flushed_at > FLUSH_NS:
            self.flush(now)

    def flush(self, now: int | None = None) -> None:
        """Bin the buffered latencies into ``lat`` (the worker calls it; so does the end)."""
        self.lat.add(self._pending[:self._npending])
        self._npending = 0
        self._flushed_at = now or time.monotonic_ns()


class WorkerContext:
    """Hands one worker its I/Os and records their outcomes."""

    def __init__(self, *, bs: int, stream, control: JobControl, ntargets: int,
                 verify_seeds: list[int | None] | None, continue_on_error: bool) -> None:
        self.bs = bs
        self.stream = stream
        self.control = control
        self.rec = Recorder(ntargets)
        self._verify_seeds = verify_seeds
        self._continue = continue_on_error
        self._halted = False

    @property
    def done(self) -> bool:
        """True once the worker should issue nothing more."""
        return self._halted or self.control.stop.is_set()

    def next_batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` (target index, offset) pairs; empty arrays mean: stop issuing."""
        if self.done:
            return np.empty(0, np.int32), np.empty(0, np.uint64)
        return self.stream.next(n)

    def complete(self, lat_ns: np.ndarray, tgt: np.ndarray, res: np.ndarray) -> None:
        """Record finished I/Os: latency (ns), target index, result (bytes, or -errno)."""
        rec = self.rec
        n = len(res)
        rec.completed += n
        all_ok = int(res.min()) == self.bs  # a read never returns more than it asked for
        if not all_ok:
            self._record_failures(tgt, np.asarray(res, dtype=np.int64))
        if not self.control.measuring:
            return
        if all_ok:
            rec.add_latencies(lat_ns)
            rec.ios += n
            rec.bytes += n * self.bs
            if rec.ntargets > 1:
                counts = np.bincount(tgt, minlength=rec.ntargets)
                rec.multi_ios += counts
                rec.multi_bytes += counts * self.bs
            return
        res = np.asarray(res, dtype=np.int64)
        ok = res == self.bs
        rec.add_latencies(np.asarray(lat_ns)[ok])
        rec.ios += int(np.count_nonzero(ok))
        nbytes = np.where(res > 0, res, 0)
        rec.bytes += int(nbytes.sum())
        rec.multi_ios += np.bincount(tgt[ok], minlength=rec.ntargets)
        rec.multi_bytes += np.bincount(tgt, weights=nbytes, minlength=rec.ntargets).astype(np.int64)

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
        return self._verify_seeds is not None

    def verify(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray, res: np.ndarray) -> None:
        """Check completed I/Os against the pattern; ``slots`` is (n, bs) bytes, one row each."""
        if self._verify_seeds is None:
            return
        for i in np.flatnonzero(np.asarray(res) == self.bs).tolist():
            t = int(tgt[i])
            if len(pattern.mismatched_ios(slots[i], offs[i:i + 1], self.bs, self._verify_seeds[t])):
                self.rec.verify_failures[t] += 1
                if len(self.rec.bad_offsets) < MAX_BAD_OFFSETS:
                    self.rec.bad_offsets.append((t, int(offs[i])))
