"""The block loop over a channel whose buffers are GPU memory: ``iodepth`` slots of GPU
memory, each request reading into (or writing from) its own slot, straight between the
files and the GPU as far as the engine's path allows.

Written once for every engine whose channel takes device pointers (core/requests GPU). A
read is complete when the channel says so, which for such a path means its bytes are in
GPU memory; with verify they are checked there (io/verify). A write's bytes are the pattern
of its offset, generated in its slot in GPU memory before the request goes out.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.requests import GPU, ChannelSpec
from gpufio.core.slots import SlotTable
from gpufio.io import gpu
from gpufio.io import verify as gpuverify
from gpufio.io.watchdog import STALL_LIMIT_NS
from gpufio.loops.steps import DrawnAhead, StallWatch

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.engines.base import Engine

PAGE = 4096
# slots per request that may be in flight: a reaped slot waits at the back of the free queue
# while its I/O is checked and recorded after the next ones go out
SPARE = 2


class GpuSlotLoop:
    """One worker's block loop over ``engine``'s GPU-memory channel; built before the
    clock starts, like an engine."""

    def __init__(self, engine: type["Engine"], job: "Job", targets: list["Target"],
                 ctx: "WorkerContext") -> None:
        self.job, self.targets, self.ctx = job, targets, ctx
        index = job.gpu_of(ctx.worker)
        cp = gpu.use(index)
        self._slots = SPARE * job.iodepth
        nbytes = self._slots * job.bs
        try:
            self._alloc = cp.empty(nbytes + PAGE, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            raise BadInput(f"gpu {index}: out of memory for {nbytes} bytes of buffers") from None
        # page-aligned slots: registered cuFile streams and GPUDirect want aligned buffers
        skip = -self._alloc.data.ptr % PAGE
        self.dev = self._alloc[skip:skip + nbytes]
        self._rows = self.dev.reshape(self._slots, job.bs)
        self._words = self.dev.view(cp.uint64)
        self._cp = cp
        if ctx.verifying or job.writes:
            gpuverify.compile_kernel()
        base = self.dev.data.ptr
        self.channel = engine.channel(job, targets, ChannelSpec(
            depth=job.iodepth, memory=GPU, largest=job.bs, writes=job.writes,
            region=(base, nbytes)))
        self._addr = np.uint64(base) + np.arange(self._slots, dtype=np.uint64) * np.uint64(job.bs)
        self._len = np.full(self._slots, job.bs, dtype=np.int64)

    def _fill(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray) -> None:
        """The pattern of each write's offset into its slot of GPU memory, finished before
        the channel's path reads the slots."""
        cp = self._cp
        gpuverify.fill(self._words, cp.asarray(slots.astype(np.uint64)),
                       cp.asarray(offs.astype(np.uint64)), cp.asarray(self.ctx.seeds(tgt)),
                       len(slots), self.job.bs)
        cp.cuda.Stream.null.synchronize()

    def run(self) -> None:
        ctx, job, ch = self.ctx, self.job, self.channel
        # a slot's target and offset stored only where read back: several targets (the
        # record's), verify (the check's); each store is time from a completion to an issue
        table = SlotTable(self._slots, targets=len(self.targets) > 1, offsets=ctx.verifying)
        slot_writes = np.zeros(self._slots, dtype=bool)
        # taken from the front, given back at the back: the channel keeps iodepth in flight,
        # so a reaped slot is not taken again before its I/O is checked and recorded
        free = collections.deque(range(self._slots))
        fds = [t.fd for t in self.targets]
        issuing, syncing = True, False
        # the last reap's (slots, results, when reaped), checked and recorded once the next
        # I/Os are out: from a completion to the next issue a slot is idle
        reaped: tuple[np.ndarray, np.ndarray, int] | None = None
        watch, completed = StallWatch().start(), 0
        ahead = DrawnAhead(ctx, job.iodepth) if not job.writes and ctx.pacer is None else None
        while True:
            if syncing and not ch.inflight:
                ctx.sync(fds)
                syncing = False
            room, k = min(len(free), ch.room()), 0
            if issuing and room and not syncing:
                tgt, offs = ahead.take(room) if ahead is not None else \
                    ctx.next_batch(min(room, ctx.until_sync) if job.writes else room)
                k = len(offs)
                issuing = bool(k)
            if k:  # a stopped worker's empty batch: its write flags are the last batch's
                # one flag for the batch unless the job mixes reads and writes
                kinds = False if ahead is not None else ctx.last_writes()
                slots = np.array([free.popleft()] if k == 1 else
                                 [free.popleft() for _ in range(k)], dtype=np.int64)
                nwrites = int(np.count_nonzero(kinds)) if job.mixed else k * bool(kinds)
                if nwrites:
                    self._fill(slots, tgt, offs)
                table.issue(slots, tgt, offs, time.perf_counter_ns())
                slot_writes[slots] = kinds
                sent = ch.submit(tgt, offs, self._len[:k], self._addr[slots], kinds, slots)
                if sent != k:
                    raise RuntimeError(f"the channel took {sent} of {k} requests with room "
                                       f"for {room}")
                syncing = bool(nwrites) and ctx.sync_due(nwrites)
            if reaped is not None:  # the last reap's bookkeeping, now the next I/Os are out
                done = reaped[0]
                completed += len(done)
                watch.stuck(completed, reaped[2])  # the progress noted, as cheaply as it goes
                free.extend(done.tolist())
                self._finish(*reaped, table, slot_writes)()
                reaped = None
            if ahead is not None and issuing:  # while the I/Os just issued are in flight
                ahead.fill()
            if not ch.inflight:
                if syncing:
                    continue
                return
            done, res = ch.reap(STALL_LIMIT_NS)
            now = time.perf_counter_ns()  # their end: just after the call that reaped them
            if not len(done):  # only a pass that brought nothing can be stuck: its words
                watch.check(completed, f"{ch.inflight} I/Os in flight", ch.state, now)
                continue
            # the reaped slots rejoin the free ones after the next issue: twice iodepth
            # slots leave room for a whole depth of new I/Os without them
            reaped = (done, res, now)

    def _finish(self, slots: np.ndarray, res64: np.ndarray, now: int, table: SlotTable,
                slot_writes: np.ndarray) -> Callable[[], None]:
        """The ``slots`` reaped at ``now``, checked; their recording returned
        (core/slots.SlotTable.reaped)."""
        res = res64.astype(np.int32)
        bad: Any = None
        if self.ctx.verifying:
            def bad(tgt: np.ndarray, offs: np.ndarray) -> list[int]:
                return gpuverify.landed_mismatches(self._rows[self._cp.asarray(slots)],
                                                   self.ctx.seeds(tgt), offs, res)
        return table.reaped(self.ctx, slots, res, now, bad,
                            slot_writes[slots] if self.job.mixed else self.job.writes)

    def close(self) -> None:
        """Requests still in flight (a failed run) land before their slots go away."""
        self.channel.close()
        self._rows = self._words = None
        self.dev = self._alloc = None
