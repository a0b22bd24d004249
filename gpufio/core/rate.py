"""fio's ``rate_iops`` and ``rate_process``: when each of a worker's I/Os may be issued.

As in fio, the cap is per worker (each of ``numjobs`` gets it). ``linear`` spaces the I/Os
evenly, I/O k due ``k / rate`` seconds after the worker's first; ``poisson`` draws the gaps
from an exponential distribution of mean ``1 / rate`` (arrivals of a Poisson process, the
open-loop load latency-at-load tests need), from a generator seeded by the job's randseed and
the worker, so a run's schedule is reproducible. A worker that fell behind its schedule (a
stalled device) catches up, as fio's does, so the count issued in the first T seconds never
exceeds what the schedule allows by then.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from gpufio.core.options import Option

PROCESSES = ("linear", "poisson")
OPTIONS: tuple[Option, ...] = (
    Option("rate_iops", "int", 0, "cap each worker at this many I/Os per second (fio's "
           "rate_iops; 0: no cap)", minimum=0),
    Option("rate_process", "str", "linear", "how capped I/Os are spaced: 'linear' (evenly) or "
           "'poisson' (exponential gaps, an open-loop arrival process), as fio's",
           choices=PROCESSES),
)
# the due times drawn ahead at once: one numpy call per this many I/Os, not one per I/O
_AHEAD = 4096
# the longest one wait sleeps before it looks at the stop word again
_NAP_NS = 20_000_000


class Pacer:
    """One worker's schedule: how many I/Os are due at a moment, and how long until the next."""

    def __init__(self, rate: float, process: str = "linear", seed: tuple[int, ...] = (0,),
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        """``clock``: nanoseconds, monotonic (a test passes a fake one)."""
        self.gap_ns = 1e9 / rate
        self.process = process
        self._rng = np.random.default_rng(seed) if process == "poisson" else None
        self._clock = clock
        self._t0: int | None = None
        self._due = np.empty(0, dtype=np.float64)  # due times (ns after t0) not yet taken
        self._drawn = 0  # I/Os whose due times have been drawn
        self._last = 0.0  # the due time of the last one drawn
        self.issued = 0

    def gaps(self, n: int) -> np.ndarray:
        """The next ``n`` gaps between due times, in ns (poisson: fresh draws)."""
        if self._rng is None:
            return np.full(n, self.gap_ns)
        return self._rng.exponential(self.gap_ns, n)

    def _draw(self) -> None:
        if self._rng is None:  # exact multiples of the gap: no drift summing gaps
            k = np.arange(self._drawn, self._drawn + _AHEAD, dtype=np.float64)
            fresh = k * self.gap_ns
        else:  # I/O 0 is due at once, each later one a drawn gap after the one before
            g = self.gaps(_AHEAD)
            if self._drawn == 0:
                g[0] = 0.0
            fresh = self._last + np.cumsum(g)
        self._drawn += _AHEAD
        self._last = float(fresh[-1])
        self._due = np.concatenate((self._due, fresh))

    def _now(self) -> float:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        return float(now - self._t0)

    def due(self, n: int) -> tuple[int, int]:
        """How many of ``n`` I/Os may go now, and, when none may, the ns until the next one
        may. Nothing is taken: ``take`` says how many went."""
        now = self._now()
        while len(self._due) < n:
            self._draw()
        k = int(np.searchsorted(self._due[:n], now, side="right"))
        return k, 0 if k else int(self._due[0] - now) + 1

    def schedule(self, n: int) -> np.ndarray:
        """Take the next ``n`` I/Os with their due times, in ns on the pacer's clock (int64;
        the first handed out starts the schedule), for a loop that issues each no earlier than
        its own (io/loops.c compares them with CLOCK_MONOTONIC, time.monotonic_ns's clock)."""
        self._now()
        while len(self._due) < n:
            self._draw()
        # I/O k is due once the clock reaches its due time (``due``'s side="right")
        at = np.ceil(self._due[:n]).astype(np.int64) + np.int64(self._t0)
        self.take(n)
        return at

    def take(self, k: int) -> None:
        """``k`` due I/Os were issued."""
        self._due = self._due[k:]
        self.issued += k

    def wait(self, n: int, stopping: Callable[[], bool]) -> int:
        """Block until at least one of ``n`` I/Os is due, or ``stopping()``; take the due ones
        and return how many (0 only when stopping or asked for none)."""
        while n > 0:
            k, wait = self.due(n)
            if k:
                self.take(k)
                return k
            if stopping():
                return 0
            time.sleep(min(wait, _NAP_NS) / 1e9)
        return 0


def pacer_for(options: Mapping[str, Any], seed: int, worker: int) -> Pacer | None:
    """The pacer of one worker of a job whose options are ``options`` (None: no cap)."""
    rate = options.get("rate_iops", 0)
    if not rate:
        return None
    return Pacer(rate, options.get("rate_process", "linear"), seed=(seed, worker, 0x7A7E))


def unpaced(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without a cap: the passes run beside a job (preconditioning, read-back)
    go as fast as they can."""
    return {k: v for k, v in options.items() if k != "rate_iops"}
