"""What an engine sees of the runner: work to do, and where to record what happened.

Each worker thread gets its own context and recorder, so the hot path takes no locks; the
runner reads the recorders' counters for the live display and merges them at the end.
Completions are recorded in numpy batches (latencies, byte counts or negative errnos),
never one Python object per I/O.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gpufio import pattern
from gpufio.stats import LatencyStats

MAX_BAD_OFFSETS = 8


class JobControl:
    """Shared by the runner and a job's workers: the stop signal and the measuring phase."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.measuring = False


@dataclass
class Recorder:
    """One worker's counts. Measured fields cover the measured phase only (ramp excluded)."""

    ntargets: int
    lat: LatencyStats = field(default_factory=LatencyStats)
    ios: int = 0
    bytes: int = 0
    completed: int = 0
    short: np.ndarray = field(init=False)
    target_ios: np.ndarray = field(init=False)
    target_bytes: np.ndarray = field(init=False)
    errors: Counter = field(default_factory=Counter)
    verify_failures: np.ndarray = field(init=False)
    bad_offsets: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.short = np.zeros(self.ntargets, dtype=np.int64)
        self.target_ios = np.zeros(self.ntargets, dtype=np.int64)
        self.target_bytes = np.zeros(self.ntargets, dtype=np.int64)
        self.verify_failures = np.zeros(self.ntargets, dtype=np.int64)


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
        res = np.asarray(res, dtype=np.int64)
        ok = res == self.bs
        rec.completed += len(res)
        nt = rec.ntargets
        bad = ~ok
        if bad.any():
            short = bad & (res >= 0)
            rec.short += np.bincount(tgt[short], minlength=nt)
            failed = res < 0
            for t, err in zip(tgt[failed].tolist(), (-res[failed]).tolist()):
                rec.errors[(t, err)] += 1
            if not self._continue:
                self._halted = True
        if not self.control.measuring:
            return
        nok = int(np.count_nonzero(ok))
        rec.lat.add(np.asarray(lat_ns)[ok])
        rec.ios += nok
        nbytes = np.where(res > 0, res, 0)
        rec.bytes += int(nbytes.sum())
        rec.target_ios += np.bincount(tgt[ok], minlength=nt)
        rec.target_bytes += np.bincount(tgt, weights=nbytes, minlength=nt).astype(np.int64)

    def verify(self, buf: np.ndarray, tgt: np.ndarray, offs: np.ndarray, res: np.ndarray) -> None:
        """Check the I/Os held in ``buf`` (consecutive bs-sized slots) against the pattern."""
        if self._verify_seeds is None:
            return
        ok = np.flatnonzero(np.asarray(res) == self.bs)
        for i in ok.tolist():
            t = int(tgt[i])
            seed = self._verify_seeds[t]
            slot = buf[i * self.bs:(i + 1) * self.bs]
            if len(pattern.mismatched_ios(slot, offs[i:i + 1], self.bs, seed)):
                self.rec.verify_failures[t] += 1
                if len(self.rec.bad_offsets) < MAX_BAD_OFFSETS:
                    self.rec.bad_offsets.append((t, int(offs[i])))
