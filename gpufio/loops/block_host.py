"""The block workload's one I/O loop, written once over the engines' Channel (core/requests).

Every engine whose primitive for the job is its channel, landing in host memory (loops/block
picks), gets its block jobs moved here: slots of ``bs`` bytes in page-aligned host memory,
offsets from ``ctx.next_batch``, the pattern filled for writes (``ctx.fill``), a mix of
reads and writes (``ctx.last_writes``), reads verified as they land, fio's fsync = N, a rate
cap (``ctx.due``: reap while nothing is due), the one stall rule (loops/steps: a path whose
requests stop completing ends in Stalled, with where the channel stood) and a stop
that wakes a waiting channel. Where a channel can hand its batches to a compiled loop
(``Channel.native``: io/loops.py) and the job needs nothing the compiled loops lack
(engines/base.compiled_loop), that loop runs them instead, with no Python per I/O.

Latencies are fio's lat: from a request's taking into its slot (fio's start_time, before
the call that submits it) to the reaping of its completion, or the channel's own for a
synchronous one (each pread timed around the call). A reap's completions are recorded only
once their slots have taken their next requests, so no slot waits unstamped for that.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core.requests import ChannelSpec
from gpufio.core.slots import SlotTable
from gpufio.core.targets import aligned_buffer
from gpufio.engines.base import Engine, compiled_loop
from gpufio.loops.block_compiled import COMPILED_BATCH, run_compiled
from gpufio.io.watchdog import STALL_LIMIT_NS
from gpufio.loops.steps import StallWatch

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target

# requests a synchronous channel (one after another inside submit) is handed at once
SYNC_BATCH = 64
# how long a wait for completions lasts where no stop can end it (the watchdog's turn then)
WAIT_NS = 200_000_000
# a job's worker threads share its targets: one at a time closes them
_CLOSING = threading.Lock()


class BlockLoop:
    """One worker's block job over its engine's channel: everything set up here, before
    the clock (slots, the channel with its ring or probe); ``run`` moves the job's I/Os,
    ``close`` releases both."""

    def __init__(self, engine_cls: type[Engine], job: "Job", targets: list["Target"],
                 ctx: "WorkerContext") -> None:
        cap = engine_cls.capability
        assert cap is not None
        self.job, self.targets, self.ctx = job, targets, ctx
        self._data, self._sync = cap.moves_data, cap.synchronous
        # an NVMe Flush where the controller was taken from its driver: no file to fsync
        self._flushes = engine_cls.flushes_itself
        if not cap.descriptors:  # the channel takes the device behind them
            with _CLOSING:
                for t in targets:
                    t.close()
        depth = SYNC_BATCH if cap.synchronous else job.iodepth
        # a synchronous channel writes one batch while the next is filled on a thread
        # (a fill between its writes would leave the drive idle, as fio's psync never does)
        self._halves = 2 if (cap.synchronous and cap.moves_data and job.writes
                             and not job.reads and not (job.fsync or job.fdatasync)) else 1
        nslots = self._halves * depth
        self._mem: Any = None
        self._slots: np.ndarray | None = None
        base = 0
        if cap.moves_data:
            self._mem = aligned_buffer(nslots * job.bs)
            # aligned_buffer rounds up to whole pages: the slots are its first bytes
            self._slots = np.frombuffer(self._mem, dtype=np.uint8)[:nslots * job.bs].reshape(
                nslots, job.bs)
            base = self._slots.ctypes.data
        self._addr = np.uint64(base) + np.arange(nslots, dtype=np.uint64) * np.uint64(job.bs)
        spec = ChannelSpec(depth=depth, largest=job.bs, writes=bool(job.writes),
                           region=(base, nslots * job.bs) if cap.moves_data else None,
                           stop_fd=ctx.stop_fd)
        try:
            self.channel = engine_cls.channel(job, targets, spec)
        except BaseException:
            self._release()
            raise
        try:  # in setup, before the clock, as fio allocates its io_us: no I/O waits for it
            self._native = self.channel.native(job, ctx, COMPILED_BATCH, WAIT_NS) \
                if compiled_loop(job) else None
        except BaseException:
            self.close()
            raise
        self._measured = False

    def run(self) -> None:
        """Issue the job's I/Os until the context hands out no more; record every one."""
        ctx, ch = self.ctx, self.channel
        try:
            loop = self._native
            if loop is not None:
                run_compiled(ctx, loop, self._note_measuring, lambda n: ch.state(), STALL_LIMIT_NS)
            elif self._halves == 2:
                self._run_writes()
            else:
                self._run()
            if self._flushes and self.job.end_fsync and self.job.writes:
                self._sync_files([t.fd for t in self.targets])
        finally:
            for key, values in ch.notes().items():
                ctx.note(key, values)

    def _sync_files(self, fds: list[int]) -> None:
        """fsync = N (end_fsync too where the engine flushes itself): the files' fsync, or
        the channel's own sync (an NVMe Flush), counted and timed as fio's sync block."""
        if not self._flushes:
            self.ctx.sync(fds)
            return
        t0 = time.perf_counter_ns()
        self.channel.sync(fds)
        self.ctx.synced(len(fds), time.perf_counter_ns() - t0)

    def _note_measuring(self) -> None:
        """Tell the channel once the measured phase has begun (what it measures of itself
        starts there)."""
        if not self._measured and self.ctx.measuring:
            self._measured = True
            self.channel.measured()

    def _run(self) -> None:
        ctx, ch, job = self.ctx, self.channel, self.job
        depth = ch.spec.depth
        verifying = ctx.verifying and self._data
        table = SlotTable(depth, targets=len(self.targets) > 1, offsets=verifying)
        slot_writes = np.full(depth, not job.reads)  # each slot's direction (a mix changes it)
        lengths = np.full(depth, job.bs, dtype=np.int64)
        fds = [t.fd for t in self.targets]
        syncing = False  # fsync due: let the writes in flight finish, then sync
        free = np.arange(depth, dtype=np.int64)
        clock = time.perf_counter_ns
        issuing = True
        watch, completed = StallWatch(STALL_LIMIT_NS, clock), 0
        record: Callable[[], None] | None = None  # the last reap's, once its slots are taken
        while True:
            if syncing and ch.inflight == 0:
                self._sync_files(fds)
                syncing = False
            want = min(len(free), ch.room()) if issuing and not syncing else 0
            if want and job.writes and not job.mixed:
                want = min(want, ctx.until_sync)
            until_due = None
            if want and ch.inflight:  # rate_iops: reap while nothing is due, never sleep
                want, due_ns = ctx.due(want)
                until_due = due_ns or None
            if want:
                tgt, offs = ctx.next_batch(want)
                k = len(offs)
                if k:
                    slots = free[:k]
                    free = free[k:]
                    writes = ctx.last_writes()
                    if writes is not False and self._data:
                        ctx.fill(self._slots, tgt, offs, slots)
                    if job.mixed:
                        slot_writes[slots] = writes
                    table.issue(slots, tgt, offs, clock())
                    ch.submit(tgt, offs, lengths[:k], self._addr[slots], writes, slots)  # room
                    nwrites = int(np.count_nonzero(writes)) if job.mixed else k * job.writes
                    syncing = bool(nwrites) and ctx.sync_due(nwrites)
                else:
                    issuing = False
            if record is not None:
                record()
                record = None
            if ch.inflight == 0:
                if syncing:
                    continue
                if not issuing:
                    return
                if not want:
                    # SQPOLL can post the completions of a batch before it moves the SQ head:
                    # nothing is in flight, yet no SQ slot is free. Not the end of the job.
                    ch.reap(None)
                    os.sched_yield()
                    continue
            # long while a stop can wake the wait (unless a capped I/O is due sooner);
            # without it, the watchdog's turn
            limit = STALL_LIMIT_NS if ch.wakeable else WAIT_NS
            done, res = ch.reap(limit if until_due is None else min(until_due, limit))
            now = clock()
            completed += len(done)
            watch.check(completed, f"{ch.inflight} I/Os in flight", ch.state, now)
            if len(done) == 0:
                continue
            res = res.astype(np.int32)
            took = ch.times()
            if took is not None:  # the channel timed each request itself
                table.t_issue[done] = now - took
            bad = self._bad(done, res) if verifying else None
            # recorded once the freed slots have taken their next I/Os (at the loop's top):
            # a slot waits unstamped only for the checks and the taking, as fio's io_u
            record = table.reaped(ctx, done, res, now, bad, slot_writes[done] if job.mixed
                                  else job.writes)
            self._note_measuring()
            free = np.concatenate((free, done)) if len(free) else done

    def _run_writes(self) -> None:
        """Write-only on a synchronous channel: the next batch's pattern is generated on a
        fill thread while this batch's writes go out."""
        ctx, ch = self.ctx, self.channel
        n = ch.spec.depth
        halves = (np.arange(n, dtype=np.int64), np.arange(n, 2 * n, dtype=np.int64))
        lengths = np.full(n, self.job.bs, dtype=np.int64)
        h = 0
        tgt, offs = ctx.next_batch(n)
        ctx.fill(self._slots, tgt, offs, halves[h][:len(offs)])
        with ThreadPoolExecutor(1, thread_name_prefix="gpufio-fill") as pool:
            while len(offs):
                nxt_tgt, nxt_offs = ctx.next_batch(n)
                filling = pool.submit(ctx.fill, self._slots, nxt_tgt, nxt_offs,
                                      halves[1 - h][:len(nxt_offs)])
                slots = halves[h][:len(offs)]
                ch.submit(tgt, offs, lengths[:len(offs)], self._addr[slots], True, slots)
                done, res = ch.reap(None)
                took = ch.times()
                ctx.complete(took if took is not None else np.zeros(len(done), np.int64),
                             tgt[done - slots[0]], res.astype(np.int32), True)
                self._note_measuring()
                filling.result()
                tgt, offs, h = nxt_tgt, nxt_offs, 1 - h

    def _bad(self, done: np.ndarray, res: np.ndarray) -> Callable[[np.ndarray, np.ndarray],
                                                                   list[int]]:
        """The CPU check of the slots ``done`` landed in (host memory), for the slot table."""
        return lambda tgt, offs: self.ctx.mismatches(self._slots[done], tgt, offs, res)

    def _release(self) -> None:
        self._slots = None
        if self._mem is not None:
            self._mem.close()
            self._mem = None

    def close(self) -> None:
        """Close the channel (what is in flight lands first), then free the slots."""
        try:
            self.channel.close()
        finally:
            self._release()
