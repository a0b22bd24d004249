"""What one worker records of its I/Os, in numpy batches (latencies, byte counts or negative
errnos), never one Python object per I/O: its live block in the job's shared memory, and the
final record the runner reads when the worker is done."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufio.native import build, memory
from gpufio.core.shared import LIVE_WORDS, READ, WRITE
from gpufio.core.stats import PLAT_NR, CpuTimes, LatencyStats

MAX_BAD_OFFSETS = 8

PENDING = 8192

FLUSH_NS = 100_000_000

@dataclass
class Recorder:
    """One worker's counts. Measured fields cover the measured phase only (ramp excluded),
    per direction (READ, WRITE): a mixed job reports reads and writes apart, as fio does.

    Latencies are buffered and binned PENDING at a time (or every FLUSH_NS): binning costs
    a call into C (or a dozen numpy calls), which per small batch would dominate a fast
    engine's loop. The counters and the histograms live in the worker's shared block, where
    the runner reads them.
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
        # a words view of the block's counters: an increment costs half a numpy element update
        self.live = memory.int64_words(LIVE_WORDS, addr=self.block.ctypes.data)
        self.lats = [LatencyStats(hist=self.block[LIVE_WORDS + d * PLAT_NR:LIVE_WORDS + (d + 1) * PLAT_NR])
                     for d in (READ, WRITE)]
        self.short = np.zeros(self.ntargets, dtype=np.int64)
        self.multi_ios = np.zeros((2, self.ntargets), dtype=np.int64)
        self.multi_bytes = np.zeros((2, self.ntargets), dtype=np.int64)
        self.verify_failures = np.zeros(self.ntargets, dtype=np.int64)
        self._pending = np.empty((2, PENDING), dtype=np.int64)
        self._npending = [0, 0]
        self._flushed_at = time.monotonic_ns()
        # built (or found) now, not at the first flush, which falls inside the measured run
        build.lat_function()

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
        self.live[5] = time.monotonic_ns()

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
