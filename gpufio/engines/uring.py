"""uring: io_uring submitted by the CPU on host memory, with real queue depth (fio io_uring).

One ring per worker thread keeps ``iodepth`` reads (or writes, WRITE / WRITE_FIXED) in
flight. The ring is set up as fio sets up its own (SINGLE_ISSUER|DEFER_TASKRUN where the
kernel has them), and each round is one io_uring_enter that submits and waits. The loop runs
compiled where it can (io/loops.py: one call per batch of offsets, latencies stamped around
the submitting and reaping calls only); otherwise in Python, which pushes a batch of SQEs
for the slots that just completed, waits for at least one completion, and reaps every CQE
available, all with numpy batch operations so Python cost is per batch, not per I/O. Waits
have no time limit: a poll of the job's stop eventfd stays in flight, so a stop wakes them.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, ChannelSpec, File
from gpufio.core.slots import SlotTable
from gpufio.core.targets import aligned_buffer
from gpufio.engines import register
from gpufio.engines.base import (
    COMPILED_BATCH,
    NOP_OP,
    Engine,
    check_nop,
    compiled_loop,
    loop_facts,
    nop_facts,
    run_compiled,
)
from gpufio.facts.device import poll_refusal
from gpufio.io import loops, uring
from gpufio.io.uring_channel import UringChannel
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog, ring_report

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target

WAIT_NS = 200_000_000


@register
class Uring(Engine):
    """CPU-submitted io_uring reads into (optionally registered) host buffers."""

    name = "uring"
    summary = "io_uring submitted by the CPU into host memory, real queue depth"
    peer = "fio io_uring"
    fio_engines = {"io_uring": "", "libaio": "ioengine=libaio runs as gpufio's uring engine "
                   "(io_uring at the same iodepth)"}
    options = (
        Option("sqpoll", "bool", False, "a kernel thread polls the SQ (IORING_SETUP_SQPOLL)"),
        Option("sq_thread_idle", "time", 1_000_000_000,
               "SQPOLL thread idle time before it sleeps", minimum=1_000_000),
        Option("fixedbufs", "bool", False, "register the buffers and use READ_FIXED / "
               "WRITE_FIXED"),
        Option("registerfiles", "bool", False, "register the targets' descriptors"),
        Option("ring_entries", "int", 0, "SQ size (default: iodepth rounded up to a power of 2)",
               minimum=0),
        Option("hipri", "bool", False, "polled completions (IORING_SETUP_IOPOLL, fio's hipri): "
               "O_DIRECT on targets whose queue polls (queue/io_poll = 1)"),
        Option("defer_taskrun", "bool", True,
               "IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN, as fio (ignored with sqpoll)"),
        NOP_OP,
    )

    capability = Capability(memory=(HOST,))

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> UringChannel:
        return UringChannel(files, spec)

    @classmethod
    def unavailable(cls) -> str | None:
        facts = uring.probe()
        return None if facts["available"] else facts["reason"]

    @classmethod
    def check_job(cls, job: Job) -> None:
        o = cls.settings(job)
        uring.sq_entries(job.iodepth, o.ring_entries, f"job '{job.name}': ")
        check_nop(job, o.op)
        if o.hipri and (not job.direct or o.op == "nop"):
            raise BadInput(f"job '{job.name}': key 'hipri': polled completions need O_DIRECT "
                           "reads or writes (direct = true, op = \"io\")")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        return {**super().describe(job), "sqpoll": o.sqpoll, "fixedbufs": o.fixedbufs,
                "registerfiles": o.registerfiles, "hipri": o.hipri,
                "defer_taskrun": o.defer_taskrun,
                **nop_facts(o.op), **loop_facts(job)}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        o = self.settings(job)
        if o.sqpoll and not uring.probe().get("sqpoll"):
            raise BadInput(uring.probe().get("sqpoll_reason", "SQPOLL is not available"))
        for t in targets if o.hipri else ():
            why = poll_refusal(t.path)
            if why:
                raise BadInput(f"key 'hipri': {t.path} cannot be polled: {why}")
        depth = job.iodepth
        self._mem = aligned_buffer(depth * job.bs)
        # aligned_buffer rounds up to whole pages: the slots are its first depth * bs bytes
        self._slots = np.frombuffer(self._mem, dtype=np.uint8)[:depth * job.bs].reshape(depth, job.bs)
        self._base = np.uint64(self._slots.ctypes.data)
        self.ring = uring.Ring(o.ring_entries or depth, sqpoll=o.sqpoll,
                               sq_thread_idle_ms=max(o.sq_thread_idle // 1_000_000, 1),
                               single_issuer=o.defer_taskrun, iopoll=o.hipri)
        self._nop = o.op == "nop"
        ops = (uring.OP_NOP, uring.OP_NOP) if self._nop else (uring.OP_READ, uring.OP_WRITE)
        self._sqe_flags = 0
        self._fds = np.array([t.fd for t in targets], dtype=np.int64)
        if o.registerfiles:
            self.ring.register_files([t.fd for t in targets])
            self._fds = np.arange(len(targets), dtype=np.int64)
            self._sqe_flags = uring.SQE_FIXED_FILE
        if o.fixedbufs:
            self.ring.register_buffers([uring.Region(int(self._base), depth * job.bs)])
            if not self._nop:
                ops = (uring.OP_READ_FIXED, uring.OP_WRITE_FIXED)
        slots = np.arange(depth, dtype=np.uint64)
        # One ready-made SQE per buffer slot, written into the ring once: a batch only sets the
        # offset (and the first word, opcode and descriptor, for several targets or a mix).
        self._template = uring.sqe_words(
            opcode=ops[not job.reads], sqe_flags=self._sqe_flags,
            fd=np.full(depth, self._fds[0]), off=np.zeros(depth, np.uint64),
            addr=self._base + slots * np.uint64(job.bs), length=job.bs, user_data=slots)
        zeros = np.zeros(len(targets), np.uint64)
        # [direction, target] -> first SQE word
        self._word0 = np.stack([uring.sqe_words(
            opcode=op, sqe_flags=self._sqe_flags, fd=self._fds, off=zeros, addr=zeros,
            length=0, user_data=zeros)[:, 0] for op in ops])

    def run(self) -> None:
        share = uring.SqThreadShare([self.ring]) if self.settings(self.job).sqpoll else None
        if self._wakes:
            self.ring.arm_wake(self.ctx.stop_fd)
        self.ring.sqes[:self.job.iodepth] = self._template  # row s: buffer slot s, all run
        try:
            if compiled_loop(self.job):
                self._run_compiled(share)
            else:
                self._run(share)
        finally:
            for key, values in (share.facts() if share is not None else {}).items():
                self.ctx.note(key, values)

    def _run_compiled(self, share: uring.SqThreadShare | None) -> None:
        ctx, job = self.ctx, self.job
        loop = loops.NativeLoop(
            loops.URING, depth=job.iodepth, bs=job.bs, bufs=int(self._base),
            stop=ctx.stop_address, fds=self._fds,
            seeds=ctx.seeds(np.arange(len(self.targets))) if job.writes else None,
            magic=pattern.MAGIC, halt_on_error=not ctx.continue_on_error,
            batch=COMPILED_BATCH, writes=bool(job.writes), nop=self._nop, ring=self.ring,
            word0=tuple(int(w) & 0xFFFFFFFF for w in self._word0[:, 0]),
            stop_ud=uring.WAKE_UD if self._wakes else 0,
            wait_ns=0 if self.ring.iopoll else WAIT_NS)

        def measured() -> None:
            if share is not None and not share.begun and ctx.measuring:
                share.begin()
        run_compiled(ctx, loop, measured if share is not None else None,
                     lambda n: f"ring state {dict(self.ring.state(), inflight=n)}",
                     STALL_LIMIT_NS)

    def _run(self, share: uring.SqThreadShare | None) -> None:
        ctx, ring = self.ctx, self.ring
        depth, job = self.job.iodepth, self.job
        multi_target = len(self.targets) > 1
        verifying = ctx.verifying
        table = SlotTable(depth, targets=multi_target, offsets=verifying)
        slot_writes = np.full(depth, not job.reads)  # each slot's direction (a mix changes it)
        fds = [t.fd for t in self.targets]
        syncing = False  # fsync due: let the writes in flight finish, then sync
        free = np.arange(depth, dtype=np.int64)
        sqes = ring.sqes
        clock = time.perf_counter_ns
        issuing = True
        dog, completed = Watchdog(STALL_LIMIT_NS, clock()), 0
        while True:
            if syncing and ring.inflight == 0:
                ctx.sync(fds)
                syncing = False
            want = min(len(free), ring.space()) if issuing and not syncing else 0
            if want and job.writes and not job.mixed:
                want = min(want, ctx.until_sync)
            until_due = None
            if want and ring.inflight:  # rate_iops: reap while nothing is due, never sleep
                want, due_ns = ctx.due(want)
                until_due = due_ns or None
            if want:
                tgt, offs = ctx.next_batch(want)
                k = len(offs)
                if k:
                    slots = free[:k]
                    free = free[k:]
                    writes = ctx.last_writes()
                    if writes is not False:
                        ctx.fill(self._slots, tgt, offs, slots)
                    if job.mixed:
                        slot_writes[slots] = writes
                        sqes[slots, 0] = self._word0[writes.astype(np.intp), tgt]
                    elif multi_target:
                        sqes[slots, 0] = self._word0[int(job.writes), tgt]
                    sqes[slots, 1] = offs
                    table.issue(slots, tgt, offs, clock())
                    ring.push_slots(slots)
                    nwrites = int(np.count_nonzero(writes)) if job.mixed else k * job.writes
                    syncing = bool(nwrites) and ctx.sync_due(nwrites)
                else:
                    issuing = False
            if ring.inflight == 0:
                if syncing:
                    continue
                if not issuing:
                    return
                if not want:
                    # SQPOLL can post the completions of a batch before it moves the SQ head:
                    # nothing is in flight, yet no SQ slot is free. Not the end of the job.
                    ring.submit()
                    os.sched_yield()
                    continue
            # no limit while the stop poll can wake the wait (unless a capped I/O is due
            # sooner); without it, the watchdog's turn
            limit = None if self._wakeable() else WAIT_NS
            ring.submit(wait=1, timeout_ns=until_due if until_due is not None and (
                limit is None or until_due < limit) else limit)
            ud, res = ring.reap()
            now = clock()
            completed += len(ud)
            if dog.update(completed, now):
                raise Stalled(f"{ring.inflight} I/Os in flight and none completed for "
                              f"{STALL_LIMIT_NS / 1e9:g} s: "
                              f"{ring_report(ring, [t.fd for t in self.targets])}")
            if len(ud) == 0:
                continue
            done = ud.view(np.int64)
            if self._nop:  # a NOP completes with 0: it did all a NOP does
                res = np.where(res == 0, job.bs, res).astype(np.int32)
            wrote = slot_writes[done] if job.mixed else job.writes
            table.complete(ctx, done, res, now, self._bad(done, res) if verifying else None,
                           wrote)
            if share is not None and not share.begun and ctx.measuring:
                share.begin()
            free = np.concatenate((free, done)) if len(free) else done

    @property
    def _wakes(self) -> bool:
        """Whether the ring keeps a poll of the stop eventfd (an IOPOLL ring takes none; its
        waits poll the device and return with each completion)."""
        return self.ctx.stop_fd >= 0 and not self.ring.iopoll

    def _wakeable(self) -> bool:
        return self.ring.iopoll or (self._wakes and not self.ring.woken)

    def _bad(self, done: np.ndarray, res: np.ndarray) -> Callable[[np.ndarray, np.ndarray],
                                                                   list[int]]:
        """The CPU check of the slots ``done`` landed in (host memory), for the slot table."""
        return lambda tgt, offs: self.ctx.mismatches(self._slots[done], tgt, offs, res)

    def close(self) -> None:
        self.ring.close()
        self._slots = None
        self._mem.close()
