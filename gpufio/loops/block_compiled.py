"""The block loop over a compiled loop (io/loops.c, through io/loops.NativeLoop): the
context's batches handed to C, which submits, reaps and times every I/O with no Python per
I/O; here only the hand-over, the records and the stall rule."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.io.loops import CALL_NS
from gpufio.loops.steps import StallWatch

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext

# the most I/Os one call of a compiled loop is handed
COMPILED_BATCH = 4096


def run_compiled(ctx: "WorkerContext", loop: Any, on_batch: Callable[[], None] | None = None,
                 state: Callable[[int], str] | None = None, stall_ns: int | None = None) -> None:
    """Hand ``loop`` (io/loops.NativeLoop) the context's batches until it hands out no more,
    record every completion, then wait for what is still in flight; ``on_batch()`` after
    each call. A loop that stopped waiting without a completion (after the stop) feeds the
    watchdog, which ends a job whose I/Os never complete; ``state(inflight)`` says where
    the path stood, for that diagnostic (after ``stall_ns``, io/watchdog's limit unless
    given). Under a rate cap each batch comes with its due times, which the loop keeps."""
    clock = time.perf_counter_ns
    # fed only by calls that timed out waiting: a rate-capped loop idles between due
    # times with nothing in flight, which is no stall
    watch, completed = StallWatch(stall_ns, clock), 0
    tgt, offs, due = ctx.next_scheduled(COMPILED_BATCH)
    writes = ctx.last_writes()
    mixed = isinstance(writes, np.ndarray)
    draining = len(offs) == 0
    while True:
        used, k = loop.run(tgt, offs, writes if mixed else None, clock() + CALL_NS, due)
        completed += k
        if k:
            # a call begun in the ramp returns when the window begins: its completions are
            # the ramp's, the I/Os it left in flight the window's
            ctx.complete(loop.lat[:k], loop.tgt[:k], loop.res[:k],
                         loop.write[:k].view(bool) if mixed else writes,
                         ramp=loop.began_in_ramp)
        if on_batch is not None:
            on_batch()
        if loop.timed_out:
            watch.check(completed, f"{loop.inflight} I/Os in flight",
                        lambda: state(loop.inflight) if state is not None else "no state")
        if draining:
            if loop.inflight == 0:
                return
            continue
        tgt, offs = tgt[used:], offs[used:]
        if mixed:
            writes = writes[used:]
        if due is not None:
            due = due[used:]
        if len(offs) == 0 or loop.stopped or ctx.done:
            tgt, offs, due = ctx.next_scheduled(COMPILED_BATCH)
            writes = ctx.last_writes()
            mixed = isinstance(writes, np.ndarray)
            draining = len(offs) == 0
