"""The slot table every CPU-driven engine keeps: for each slot (a buffer an I/O lands in or
is written from), which target and offset its I/O touches and when it was issued. Completing slots checks them
(the engine's verify, when verifying) and hands latencies, targets and results to the worker
context, in one place for uring, cpu-gpu and cufile."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpufio.core.context import WorkerContext

# (targets, offsets) of completed slots -> indices among them whose bytes were wrong
BadIos = Callable[[np.ndarray, np.ndarray], list[int]]


class SlotTable:
    """``n`` slots. ``targets``/``offsets`` False: the engine never needs them (one target;
    not verifying), so issuing skips those stores on its hot path."""

    def __init__(self, n: int, *, targets: bool = True, offsets: bool = True) -> None:
        self.tgt = np.zeros(n, dtype=np.int32)
        self.off = np.zeros(n, dtype=np.uint64)
        self.t_issue = np.zeros(n, dtype=np.int64)
        self._targets, self._offsets = targets, offsets
        self._now = np.zeros((), dtype=np.int64)  # subtracting from a 0-d array beats an int

    def issue(self, slots: np.ndarray | slice | int, tgt: np.ndarray | int,
              offs: np.ndarray | int, now: int) -> None:
        """Slots ``slots`` now hold I/Os of ``tgt`` at ``offs``, issued at ``now`` (ns)."""
        if self._targets:
            self.tgt[slots] = tgt
        if self._offsets:
            self.off[slots] = offs
        self.t_issue[slots] = now

    def complete(self, ctx: WorkerContext, slots: np.ndarray | slice, res: np.ndarray,
                 now: int, bad: BadIos | None = None, write: np.ndarray | bool = False) -> None:
        """The I/Os in ``slots`` finished with ``res`` at ``now``: verify them with ``bad``
        (when given) and record them, as writes where ``write`` says so."""
        self.reaped(ctx, slots, res, now, bad, write)()

    def reaped(self, ctx: WorkerContext, slots: np.ndarray | slice, res: np.ndarray,
               now: int, bad: BadIos | None = None, write: np.ndarray | bool = False
               ) -> Callable[[], None]:
        """``complete``, but what it records is returned, to be called later: the slots
        are free at once, and a loop that takes their next I/Os first leaves no slot
        unstamped while it records (the recording keeps its own copies)."""
        n = len(res)
        tgt = self.tgt[slots] if self._targets else self.tgt[:n]
        if isinstance(slots, slice):
            tgt = tgt.copy()  # a view of the table, which the next issue overwrites
        if bad is not None:
            offs = self.off[slots]
            ctx.record_mismatches(tgt, offs, bad(tgt, offs))
        self._now[()] = now
        lat = self._now - self.t_issue[slots]
        return lambda: ctx.complete(lat, tgt, res, write)
