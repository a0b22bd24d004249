"""The block loop that lands host-memory requests in GPU memory, segment by segment.

Written once over any channel whose buffers are host memory (core/requests): the requests
of a segment of slots go out together into page-locked host memory (io/staging); once all
of a segment's reads are in, it is copied to GPU memory in one asynchronous transfer on its
own CUDA stream, so many small reads share a copy and the next segments' reads overlap it.
There are SPARE times as many segments as the requests in flight need, so one waiting for
its slowest read or its copy holds back no new reads. A read is complete when its bytes are
in GPU memory: its latency runs from issue until its segment's copy is observed done (with
verify, checked there), and iodepth counts the reads in that span, copying ones too, so
IOPS x mean latency is the depth (Little's law); a segment is topped up to what the depth
has room for. Writes go the other way: a segment's pattern is generated in GPU
memory, copied down to its slots in one transfer and written from there; a write's latency
runs from the start of its segment's copy until the write completes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from gpufio.core.requests import HOST, ChannelSpec
from gpufio.core.slots import SlotTable
from gpufio.io.staging import SEGMENTS, SPARE, SegmentedStaging, segment_shape
from gpufio.loops.steps import StallWatch

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.engines.base import Engine

FREE, READING, COPYING, WRITING = 0, 1, 2, 3
WAIT_NS = 200_000_000
POLL_NS = 20_000


def staging_shape(engine: type["Engine"], job: "Job") -> tuple[int, int]:
    """(segments in flight, slots per segment): the engine's ``segments`` where it offers
    that option (io/staging.SEGMENTS, or one of its own with another default), else
    SEGMENTS' default."""
    offered = any(o.name == SEGMENTS.name for o in engine.options)
    segments = engine.settings(job).segments if offered else SEGMENTS.default
    return segment_shape(segments, job.iodepth)


class StagedLoop:
    """One worker's block loop over ``engine``'s host-memory channel, landing in (or
    writing from) GPU memory; built before the clock starts, like an engine."""

    def __init__(self, engine: type["Engine"], job: "Job", targets: list["Target"],
                 ctx: "WorkerContext") -> None:
        self.job, self.targets, self.ctx = job, targets, ctx
        nseg, self._seg = staging_shape(engine, job)
        self._nseg = SPARE * nseg
        self._cap = job.iodepth  # requests between issue and landing, at most
        # a synchronous channel writes a segment inside submit: nothing stays in flight, so
        # the segments copying down need no room kept for them and the next ones copy down
        # while it writes
        self._sync = engine.capability is not None and engine.capability.synchronous
        slots = self._nseg * self._seg
        self.landing = SegmentedStaging(job.gpu_of(ctx.worker), self._nseg, self._seg, job.bs,
                                        ctx.verifying, writes=job.writes)
        try:
            self.channel = engine.channel(job, targets, ChannelSpec(
                depth=self._cap, memory=HOST, largest=job.bs, writes=job.writes,
                region=(self.landing.host_addr, slots * job.bs),
                access="random" if job.random else "sequential"))
        except BaseException:
            self.landing.close()
            raise
        # each slot's host address, length and tag (its index), sliced per segment
        self._addr = (np.uint64(self.landing.host_addr)
                      + np.arange(slots, dtype=np.uint64) * np.uint64(job.bs))
        self._len = np.full(slots, job.bs, dtype=np.int64)
        self._tags = np.arange(slots, dtype=np.int64)
        self._fds = [t.fd for t in targets]

    def _push(self, s: int, tgt: np.ndarray, offs: np.ndarray, write: bool) -> None:
        """Hand segment ``s``'s requests (reads into, or writes from, its slots) to the
        channel, which has room for a whole segment whenever the loop sends one."""
        self._push_all([(s, tgt, offs)], write)

    def _push_all(self, segs: list[tuple[int, np.ndarray, np.ndarray]], write: bool) -> None:
        """``_push`` for several segments (``(s, tgt, offs)`` each) in one channel call: a
        call costs a channel tens of microseconds, which the segments after the first would
        otherwise spend issued but not yet handed over."""
        parts = ([self._tags[s * self._seg:s * self._seg + len(o)] for s, _, o in segs],
                 [t for _, t, _ in segs], [o for _, _, o in segs])
        # one segment's arrays as they are: a copy only where there are several to join
        tags, tgt, offs = (a[0] if len(a) == 1 else np.concatenate(a) for a in parts)
        k = len(offs)
        sent = self.channel.submit(tgt, offs, self._len[:k], self._addr[tags], write, tags)
        if sent != k:
            raise RuntimeError(f"the channel took {sent} of a pass's {k} requests with "
                               f"{self.channel.inflight} of {self._cap} in flight")

    def _check(self, watch: StallWatch, progress: int, what: str,
               states: Callable[[], list[int]]) -> None:
        """The one stall rule over the segments' progress (their I/Os and copies); its
        words (``states()``: each segment's state) are made only once stuck: this runs
        every pass."""
        if watch.stuck(progress):
            now = states()
            watch.check(progress, f"{sum(st != FREE for st in now)} segments of {what} or "
                        "copies in flight",
                        lambda: f"segment states {now}; {self.channel.state()}")

    def run(self) -> None:
        if self.job.writes:
            self._run_writes()
            return
        ctx, seg, cap = self.ctx, self._seg, self._cap
        seg_n = np.zeros(self._nseg, dtype=np.int64)      # reads issued in each segment
        seg_done = np.zeros(self._nseg, dtype=np.int64)   # reads completed in each segment
        table = SlotTable(self._nseg * seg)
        slot_res = np.zeros(self._nseg * seg, dtype=np.int32)
        records: list[Callable[[], None]] = []  # finished segments' recordings
        # segments landed, not yet checked: (segment, reads, when seen landed); checked
        # once the next reads are out, or before their segment is issued again
        landed: list[tuple[int, int, int]] = []
        # the segments by state as Python lists, and the reads between issue and landing:
        # between a landing and the next issue every microsecond is a slot left idle; a
        # landed segment goes to the bottom of the free stack, so it is rarely the next
        free, reading, copying = list(range(self._nseg - 1, -1, -1)), [], []
        taken, issuing = 0, True
        watch, progress = StallWatch(), 0  # reads + copies
        # each segment to the channel as it is issued where a synchronous channel moves it
        # inside submit, or a rate cap may hold the next batch back: else one call a pass
        alone = self._sync or ctx.pacer is not None

        def states() -> list[int]:
            return [READING if s in reading else COPYING if s in copying else FREE
                    for s in range(self._nseg)]

        while True:
            out: list[tuple[int, np.ndarray, np.ndarray]] = []  # the segments issued now
            while issuing and free and taken < cap:
                s = free[-1]
                # a landed segment's slots about to be reused: checked and recorded first
                if landed and any(s == seen[0] for seen in landed):
                    records.append(self._settle(landed, s, table, slot_res))
                tgt, offs = ctx.next_batch(min(seg, cap - taken))
                k = len(offs)
                if not k:
                    issuing = False
                    break
                # stamped before the channel has them: a synchronous one (a mapping's
                # gather) moves them inside submit
                table.issue(slice(s * seg, s * seg + k), tgt, offs, time.perf_counter_ns())
                out.append((s, tgt, offs))
                if alone:
                    self._push_all(out, False)
                    out = []
                free.pop()
                reading.append(s)
                seg_n[s], seg_done[s] = k, 0
                taken += k
            if out:
                self._push_all(out, False)
            while landed:
                records.append(self._settle(landed, landed[-1][0], table, slot_res))
            moved = None
            if records:  # the segments freed last time, once the new reads are with the
                # channel (handed over now: the recording overlaps them, not delays them)
                if self.channel.inflight:
                    moved = self._reaped(*self.channel.reap(None), slot_res, seg_done) or None
                while records:
                    records.pop()()
            if moved is None:
                moved = self._wait(copying, slot_res, seg_done)
            if moved is None and not issuing:
                return
            progress += moved or 0
            # here, not after the landings: from a landing to the next issue a slot is idle
            self._check(watch, progress, "reads", states)
            for s in [s for s in reading if seg_done[s] == seg_n[s]] if moved else ():
                reading.remove(s)
                self._copy(s, int(seg_n[s]), table)
                copying.append(s)
            done = [s for s in copying if self.landing.done(s)]
            now = time.perf_counter_ns()  # their end: checking and recording come after
            for s in done:
                landed.append((s, int(seg_n[s]), now))
                copying.remove(s)
                free.insert(0, s)
                taken -= int(seg_n[s])
                progress += 1

    def _run_writes(self) -> None:
        """Segments go FREE -> COPYING (pattern generated on the GPU, copied down; the
        channel told what is coming) -> WRITING (the channel writes from the host slots) ->
        FREE; fsync between segments; once all are written, the channel finishes."""
        ctx, ch, seg = self.ctx, self.channel, self._seg
        state = np.full(self._nseg, FREE, dtype=np.int8)
        seg_n = np.zeros(self._nseg, dtype=np.int64)
        seg_done = np.zeros(self._nseg, dtype=np.int64)
        table = SlotTable(self._nseg * seg)
        slot_res = np.zeros(self._nseg * seg, dtype=np.int32)
        issuing, syncing = True, False
        watch, progress = StallWatch(), 0
        while True:
            if syncing and not np.any(state != FREE):
                ctx.sync(self._fds)
                syncing = False
            for s in np.flatnonzero(state == FREE).tolist() if issuing and not syncing else ():
                room = self._cap - ch.inflight - int(seg_n[state == COPYING].sum())
                if not self._sync and room <= 0:
                    break
                tgt, offs = ctx.next_batch(min(seg, ctx.until_sync,
                                               seg if self._sync else room))
                k = len(offs)
                if not k:
                    issuing = False
                    break
                lo = s * seg
                table.issue(slice(lo, lo + k), tgt, offs, time.perf_counter_ns())
                ch.expect(tgt, offs, self._len[lo:lo + k], True)
                self.landing.stage_out(s, k, offs, ctx.seeds(tgt))
                seg_n[s], seg_done[s], state[s] = k, 0, COPYING
                if ctx.sync_due(k):
                    syncing = True
                    break
            for s in np.flatnonzero(state == COPYING).tolist():
                if self.landing.done(s):
                    lo, k = s * seg, int(seg_n[s])
                    self._push(s, table.tgt[lo:lo + k], table.off[lo:lo + k], True)
                    state[s] = WRITING
                    progress += 1
            moved = self._wait(np.flatnonzero(state == COPYING).tolist(), slot_res, seg_done)
            if moved is None and not issuing and not syncing:
                ch.finish()
                return
            progress += moved or 0
            for s in np.flatnonzero((state == WRITING) & (seg_done == seg_n)).tolist():
                lo, k = s * seg, int(seg_n[s])
                table.complete(ctx, slice(lo, lo + k), slot_res[lo:lo + k].copy(),
                               time.perf_counter_ns(), write=True)
                state[s] = FREE
            self._check(watch, progress, "writes", state.tolist)

    def _wait(self, copying: list[int], slot_res: np.ndarray, seg_done: np.ndarray
              ) -> int | None:
        """Wait for what is in flight: reap the channel's completions into ``slot_res`` and
        ``seg_done`` (how many), or wait for the oldest of the ``copying`` segments (0);
        None when nothing is."""
        ch = self.channel
        if ch.inflight:
            return self._reaped(*ch.reap(POLL_NS if copying else WAIT_NS), slot_res, seg_done)
        if copying:
            self.landing.wait(copying[0])
            return 0
        return None

    def _reaped(self, done: np.ndarray, res: np.ndarray, slot_res: np.ndarray,
                seg_done: np.ndarray) -> int:
        """Completions ``done`` (tags) with ``res`` into ``slot_res`` and ``seg_done``;
        how many."""
        slot_res[done] = res
        seg_done += np.bincount(done // self._seg, minlength=self._nseg)
        return len(done)

    def _copy(self, s: int, k: int, table: SlotTable) -> None:
        lo = s * self._seg
        if self.ctx.verifying:
            self.landing.copy(s, k, table.off[lo:lo + k], self.ctx.seeds(table.tgt[lo:lo + k]))
        else:
            self.landing.copy(s, k)

    def _settle(self, landed: list[tuple[int, int, int]], s: int, table: SlotTable,
                slot_res: np.ndarray) -> Callable[[], None]:
        """Landed segment ``s`` (taken out of ``landed``): its reads are in GPU memory at the
        time stamped when it was seen landed; checked now, their recording returned
        (core/slots.SlotTable.reaped), for after the loop has taken the next reads."""
        i = next(i for i, seen in enumerate(landed) if seen[0] == s)
        _, k, now = landed.pop(i)
        lo = s * self._seg
        res = slot_res[lo:lo + k].copy()
        bad = (lambda tgt, offs: self.landing.mismatches(s, res)) if self.ctx.verifying else None
        return table.reaped(self.ctx, slice(lo, lo + k), res, now, bad)

    def close(self) -> None:
        """What is in flight lands (the channel waits for it) before the slots go."""
        self.channel.close()
        self.landing.close()
