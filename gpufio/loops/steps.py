"""What every loop shares: the one stall rule, moving one batch through a channel, and a
worker's next reads drawn while the last ones are in flight.

The stall rule (``StallWatch``): a loop with I/Os in flight whose completion count has not
moved for the stall limit (io/watchdog.STALL_LIMIT_NS unless the path sets its own) ends in
io/watchdog.Stalled, whose message says what was in flight and where the path stood. The
block loops (host, staged, GPU slots, compiled), the device benchmark and ``move_all`` (the
rows' gather and the tensors' mover) all end a stall through it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from gpufio.core.requests import Channel, RequestFailed, drain
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext


class StallWatch:
    """The one stall rule over a loop's progress (a count of completions, or of any step
    that frees an I/O's slot: a staged segment's copy); ``stall_ns`` None: io/watchdog's
    limit. The clock starts at the first count it is fed (``start`` feeds zero now)."""

    def __init__(self, stall_ns: int | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.stall_ns = STALL_LIMIT_NS if stall_ns is None else stall_ns
        self._clock = clock
        self._dog = Watchdog(self.stall_ns, clock())

    def start(self) -> "StallWatch":
        """Start the clock now, with no progress yet: a loop whose first wait already
        spans the limit is stuck after it, not after a second one."""
        self.stuck(0)
        return self

    def stuck(self, progress: int, now: int | None = None) -> bool:
        """True once ``progress`` (the loop's count so far) has not moved for the limit."""
        return self._dog.update(progress, self._clock() if now is None else now)

    def check(self, progress: int, inflight: str, where: Callable[[], str],
              now: int | None = None) -> None:
        """Once stuck, Stalled: "<inflight> and none completed for <limit> s: <where()>"
        (``where`` is asked only then: a ring's report reads the kernel's view)."""
        if self.stuck(progress, now):
            raise Stalled(f"{inflight} and none completed for {self.stall_ns / 1e9:g} s: "
                          f"{where()}")


def move_all(ch: Channel, tgt: np.ndarray, off: np.ndarray, length: np.ndarray,
             addr: np.ndarray, write: bool, stall_ns: int | None = None) -> int:
    """Move every request of one batch through ``ch`` and wait until all are complete; the
    perf_counter_ns at which the first completed. RequestFailed for the first request that
    did not move whole (after the rest of what was in flight has landed), Stalled (the one
    rule, StallWatch) when nothing completes for ``stall_ns``."""
    n = len(off)
    tgt = np.asarray(tgt, dtype=np.int64)
    off = np.asarray(off, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    addr = np.asarray(addr, dtype=np.uint64)
    tags = np.arange(n, dtype=np.int64)
    watch = StallWatch(stall_ns).start()
    pushed = done = first = 0
    while done < n:
        if pushed < n:
            k = min(ch.room(), n - pushed)
            if k:
                end = pushed + k
                pushed += ch.submit(tgt[pushed:end], off[pushed:end], length[pushed:end],
                                    addr[pushed:end], write, tags[pushed:end])
        idx, res = ch.reap(watch.stall_ns)
        if not len(idx):
            if ch.inflight:
                watch.check(done, f"{ch.inflight} I/Os in flight", ch.state)
            continue
        first = first or time.perf_counter_ns()
        bad = np.flatnonzero(res != length[idx])
        if len(bad):
            drain(ch, watch.stall_ns)
            raise RequestFailed(int(idx[bad[0]]), int(res[bad[0]]))
        done += len(idx)
        watch.stuck(done)
    return first


class DrawnAhead:
    """A read-only, uncapped worker's next ``n`` (target, offset) pairs, drawn (``fill``)
    while its last reads are in flight, so that from a completion to the next issue only
    ``take`` runs, not the context's offset generator. Under a rate cap or with writes a
    batch depends on its moment (due times, syncs): loops draw those as they issue."""

    def __init__(self, ctx: "WorkerContext", n: int) -> None:
        self._ctx, self._n = ctx, n
        self._tgt, self._offs = ctx.next_batch(0)  # empty arrays of the context's types

    def fill(self) -> None:
        """Top the pairs drawn up to at least ``n`` (while the context has more), so that a
        ``take`` of up to ``n`` finds them all."""
        if len(self._offs) < self._n:
            tgt, offs = self._ctx.next_batch(self._n)
            if len(offs):
                self._tgt = np.concatenate((self._tgt, tgt))
                self._offs = np.concatenate((self._offs, offs))

    def take(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``k`` of the pairs drawn (drawing them now if too few are); empty once the
        worker should issue nothing more, whatever was drawn."""
        if self._ctx.done:
            return self._tgt[:0], self._offs[:0]
        if len(self._offs) < k:
            self.fill()
        tgt, offs = self._tgt[:k], self._offs[:k]
        self._tgt, self._offs = self._tgt[k:], self._offs[k:]
        return tgt, offs
