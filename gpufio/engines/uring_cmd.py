"""uring-cmd: NVMe read and write commands through io_uring passthrough (fio io_uring_cmd).

The CPU builds the NVMe command itself (opcode, namespace id, starting LBA, block count,
buffer: io/nvme_cmd.py, the layout the GPU builder shares) into 128-byte SQEs
(IORING_OP_URING_CMD, NVME_URING_CMD_IO) on the namespace's generic char device
/dev/ngXnY; the kernel hands it to the drive's queue without the block layer. A target may
be named by its char device, as fio's users do, or by its block device /dev/nvmeXnY, which
stands for the same namespace (core/targets.open_namespace). Completions come back as
32-byte CQEs: 0, an NVMe status (one failed I/O, named by its status), or -errno.
``hipri`` polls for them (IORING_SETUP_IOPOLL) where the namespace has poll queues.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.slots import BadIos, SlotTable
from gpufio.core.targets import aligned_buffer
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.io import nvme_cmd, uring
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

WAIT_NS = 200_000_000
PROBE_NS = 10_000_000_000


@register
class UringCmd(Engine):
    """NVMe commands built by the CPU, through io_uring passthrough on /dev/ngXnY."""

    name = "uring-cmd"
    summary = ("NVMe read/write commands built by the CPU, sent through io_uring passthrough "
               "(IORING_OP_URING_CMD) on the namespace's /dev/ngXnY, no block layer")
    peer = "fio io_uring_cmd (cmd_type=nvme)"
    fio_engines = {"io_uring_cmd": ""}  # cmd_type=nvme, its default (fio/jobfile.CMD_TYPES)
    options = (
        Option("hipri", "bool", False, "poll for completions (IORING_SETUP_IOPOLL); needs "
               "poll queues on the namespace (nvme.poll_queues > 0)"),
        Option("sqpoll", "bool", False, "a kernel thread polls the SQ (IORING_SETUP_SQPOLL)"),
        Option("fixedbufs", "bool", False, "register the buffers (IORING_URING_CMD_FIXED)"),
        Option("registerfiles", "bool", False, "register the char devices' descriptors"),
        Option("ring_entries", "int", 0, "SQ size (default: iodepth rounded up to a power of 2)",
               minimum=0),
    )

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return True

    @classmethod
    def unavailable(cls) -> str | None:
        facts = uring.probe()
        if not facts["available"]:
            return facts["reason"]
        return None if facts.get("big") else facts.get("big_reason", "io_uring has no SQE128")

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        out = nvme_cmd.passthrough_checks(host, cls.name)
        if any(cls.settings(j).hipri for j in jobs):
            polled = host.kernel_version() >= nvme_cmd.POLLED_KERNEL
            out.append(verdict(cls.name, "polled passthrough", polled, host.kernel_release(),
                               "hipri on passthrough needs Linux >= 6.1", bad="fail"))
        return out

    @classmethod
    def check_job(cls, job: Job) -> None:
        uring.sq_entries(job.iodepth, cls.settings(job).ring_entries, f"job '{job.name}': ")
        if job.fsync or job.fdatasync:
            raise BadInput(f"job '{job.name}': uring-cmd sends NVMe commands past the page "
                           "cache; fsync/fdatasync sync nothing of it (use end_fsync)")
        o = cls.settings(job)
        if o.hipri and o.sqpoll:
            raise BadInput(f"job '{job.name}': hipri and sqpoll together are not supported "
                           "by uring-cmd; choose one")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        return {**super().describe(job), "page_cache": False, "hipri": o.hipri,
                "sqpoll": o.sqpoll, "fixedbufs": o.fixedbufs, "registerfiles": o.registerfiles}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        o = self.settings(job)
        if o.hipri:
            for t in targets:
                if not t.facts.get("poll_queues"):
                    raise BadInput(f"target {t.path}: hipri needs poll queues, and "
                                   f"{t.facts.get('namespace', t.path)} has none (load nvme "
                                   "with poll_queues=N, or set hipri = false)")
        depth, bs = job.iodepth, job.bs
        self._mem = aligned_buffer(depth * bs)
        self._slots = np.frombuffer(self._mem, dtype=np.uint8)[:depth * bs].reshape(depth, bs)
        base = np.uint64(self._slots.ctypes.data)
        self.ring = uring.Ring(o.ring_entries or depth, sqpoll=o.sqpoll, big=True,
                               iopoll=o.hipri)
        fds = np.array([t.fd for t in targets], np.int64)
        flags = 0
        if o.registerfiles:
            self.ring.register_files([t.fd for t in targets])
            fds, flags = np.arange(len(targets), dtype=np.int64), uring.SQE_FIXED_FILE
        if o.fixedbufs:
            self.ring.register_buffers([uring.Region(int(base), depth * bs)])
        self._fds = fds
        self._nsid = np.array([t.facts["nsid"] for t in targets], np.uint32)
        self._shift = np.array([t.lba.bit_length() - 1 for t in targets], np.uint64)
        slots = np.arange(depth, dtype=np.uint64)
        # one whole SQE per buffer slot, written into the ring once; a batch sets the fields
        # of each I/O by name (nvme_cmd.set_io) and, for several targets, its fd and nsid
        self._template = nvme_cmd.build(
            write=not job.reads, fd=fds[0], nsid=self._nsid[0], lba_shift=self._shift[0],
            off=np.zeros(depth, np.uint64), length=bs, addr=base + slots * np.uint64(bs),
            user_data=slots, sqe_flags=flags, fixed_buffer=0 if o.fixedbufs else None)
        self._completed = 0
        try:
            self._probe()
        except BaseException:
            self.close()  # the runner closes only engines it got back
            raise

    def _probe(self) -> None:
        """Read each target's first block once, before the clock: a kernel, device or user
        that may not send NVMe commands is refused here in one line, not as I/O errors."""
        ring = self.ring
        for t in range(len(self.targets)):
            sqe = self._template[:1].copy()
            e = nvme_cmd.entries(sqe)
            e["fd"], e["nsid"] = self._fds[t], self._nsid[t]
            nvme_cmd.set_io(e, write=False, off=np.zeros(1, np.uint64),
                            lba_shift=self._shift[t], length=int(1 << int(self._shift[t])))
            ring.push(sqe)
            ring.submit()
            deadline = time.monotonic_ns() + PROBE_NS
            res = np.empty(0, np.int32)
            while not len(res) and time.monotonic_ns() < deadline:
                ring.submit(wait=1, timeout_ns=WAIT_NS)
                _, res = ring.reap()
            path = self.targets[t].path
            if not len(res):
                raise BadInput(f"target {path}: a first NVMe read through passthrough did not "
                               f"complete within {PROBE_NS / 1e9:g} s")
            why = nvme_cmd.refusal(path, -int(res[0]))
            if why:
                raise BadInput(why)

    def run(self) -> None:
        ctx, ring, job = self.ctx, self.ring, self.job
        depth, nt = job.iodepth, len(self.targets)
        table = SlotTable(depth, targets=nt > 1, offsets=ctx.verifying)
        slot_writes = np.full(depth, not job.reads)
        ring.sqes[:depth] = self._template
        sqes = nvme_cmd.entries(ring.sqes[:depth])
        free = np.arange(depth, dtype=np.int64)
        issuing = True
        dog = Watchdog(STALL_LIMIT_NS, time.perf_counter_ns())
        while True:
            want = min(len(free), ring.space()) if issuing else 0
            if want:
                tgt, offs = ctx.next_batch(want)
                if len(offs):
                    slots, free = free[:len(offs)], free[len(offs):]
                    self._issue(sqes, slots, tgt, offs, slot_writes, table)
                else:
                    issuing = False
            if ring.inflight == 0 and not issuing:
                return
            if ring.inflight == 0 and not want:
                # SQPOLL posts a batch's completions before it moves the SQ head: nothing in
                # flight, no SQ slot free yet
                ring.submit()
                os.sched_yield()
                continue
            ud, res, now = self._wait(dog)
            if len(ud):
                done = ud.view(np.int64)
                res = nvme_cmd.result(res, job.bs)
                table.complete(ctx, done, res, now,
                               self._bad(done, res) if ctx.verifying else None,
                               slot_writes[done] if job.mixed else job.writes)
                free = np.concatenate((free, done)) if len(free) else done

    def _wait(self, dog: Watchdog) -> tuple[np.ndarray, np.ndarray, int]:
        """The completions there are after waiting up to WAIT_NS for one, and when they were
        taken; Stalled once none has come for STALL_LIMIT_NS with commands in flight."""
        ring = self.ring
        ring.submit(wait=1, timeout_ns=WAIT_NS)
        ud, res = ring.reap()
        now = time.perf_counter_ns()
        self._completed += len(ud)
        if dog.update(self._completed, now):
            raise Stalled(f"{ring.inflight} NVMe commands in flight and none completed "
                          f"for {STALL_LIMIT_NS / 1e9:g} s: ring state {ring.state()}")
        return ud, res, now

    def _bad(self, done: np.ndarray, res: np.ndarray) -> BadIos:
        """The pattern check of the slots ``done`` landed in, for the slot table."""
        return lambda tgt, offs: self.ctx.mismatches(self._slots[done], tgt, offs, res)

    def _issue(self, sqes: np.ndarray, slots: np.ndarray, tgt: np.ndarray | int,
               offs: np.ndarray, slot_writes: np.ndarray, table: SlotTable) -> None:
        """Write the batch's commands into their slots' SQEs and publish them."""
        ctx, job = self.ctx, self.job
        writes = ctx.last_writes()
        if writes is not False:
            ctx.fill(self._slots, tgt, offs, slots)
        if job.mixed:
            slot_writes[slots] = writes
        e = sqes[slots]
        if len(self.targets) > 1:
            e["fd"], e["nsid"] = self._fds[tgt], self._nsid[tgt]
        nvme_cmd.set_io(e, write=slot_writes[slots], off=offs,
                        lba_shift=self._shift[tgt] if len(self.targets) > 1 else self._shift[0],
                        length=job.bs)
        sqes[slots] = e
        table.issue(slots, tgt, offs, time.perf_counter_ns())
        self.ring.push_slots(slots)

    def close(self) -> None:
        self.ring.close()
        self._slots = None
        self._mem.close()
