"""bam: BaM's mechanism, a user-space NVMe driver writing commands into the controller's own
queues, over vfio-pci with the IOMMU on and no kernel module.

A target is an NVMe namespace named by its block device /dev/nvmeXnY (or its char device
/dev/ngXnY), as for uring-cmd: the job takes the controller behind it from the nvme driver
for the job's length (its namespaces vanish from /dev meanwhile) and gives it back after.
Every worker owns one polled I/O queue pair of ``iodepth`` entries (numjobs pairs; iodepth
at most CAP.MQES + 1 less the one slot a ring keeps empty). Data lands in pinned host memory
mapped for the controller's DMA; transfers over two pages go through per-slot PRP lists.

The submitter here is a CPU stand-in (results say ``submitter = cpu-stand-in``): it writes
the SQEs of io/nvme_queue.py into the SQ, rings the SQ doorbell, polls the CQ's phase tags
and rings the CQ head doorbell. GPU threads take the same QueuePair (io/nvme_driver.py).
A guardian process (io/nvme_guardian.py) gives the controller back if the runner dies.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core.checks import Check
from gpufio.core.errors import BadInput
from gpufio.core.slots import SlotTable
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.io import nvme_driver, vfio
from gpufio.io import nvme_queue as nq
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

SUBMITTER = "cpu-stand-in"


def _controller(job: Job, targets: list[Target]) -> str:
    """The one controller behind every target of the job (BadInput otherwise), from the
    facts gathered when the targets were opened: while gpufio holds the controller, and
    after, when the nvme driver may have named it anew, sysfs no longer leads there."""
    found = {t.facts.get("pci_address") for t in targets}
    if None in found:
        raise BadInput(f"job '{job.name}': engine 'bam' finds no PCIe controller behind "
                       f"{', '.join(t.path for t in targets)} (NVMe over fabrics or a "
                       "virtual namespace)")
    if len(found) > 1:
        raise BadInput(f"job '{job.name}': engine 'bam' drives one controller per job; its "
                       f"targets are on {', '.join(sorted(found))}")  # type: ignore[arg-type]
    return found.pop()  # type: ignore[return-value]


class _Shared:
    """A job's controller, brought up once for all its workers (threads), each taking one
    queue pair; the last worker to close shuts it down and gives it back."""

    lock = threading.Lock()
    open: dict[str, _Shared] = {}

    def __init__(self, bdf: str, writes: bool, pairs: int, depth: int,
                 targets: list[Target]) -> None:
        self.bdf = bdf
        # the engine reads no target descriptor; open ones would pin the old controller
        # instance, and the nvme driver would give the controller a new name on return
        for t in targets:
            t.close()
        self.session = nvme_driver.Session(bdf, writes=writes)
        try:
            assert self.session.controller is not None
            self.pairs = self.session.controller.create_pairs(pairs, depth)
        except BaseException:
            self.session.close()
            raise
        self.users = 0

    @classmethod
    def acquire(cls, bdf: str, writes: bool, pairs: int, depth: int, worker: int,
                targets: list[Target]) -> tuple[_Shared, nvme_driver.QueuePair]:
        """The job's controller (brought up by the first worker) and worker's own pair."""
        with cls.lock:
            shared = cls.open.get(bdf)
            if shared is None:
                shared = cls.open[bdf] = cls(bdf, writes, pairs, depth, targets)
            shared.users += 1
            return shared, shared.pairs[worker]

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users:
                return
            del self.open[self.bdf]
        self.pairs = []
        self.session.close()


@register
class Bam(Engine):
    """NVMe commands written by a CPU stand-in into the controller's own queues over vfio."""

    name = "bam"
    summary = ("BaM's user-space NVMe driver over vfio-pci (IOMMU on): SQEs written into the "
               "controller's own queues, doorbells rung, CQ phase tags polled; the "
               "controller is taken from the nvme driver for the job and given back")
    peer = "BaM (ZaidQureshi/bam), SPDK perf"
    iodepth_means = "commands in flight on each worker's own NVMe queue pair"
    worker_kind = "thread"  # one process holds the controller; workers share it

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return True

    @classmethod
    def unavailable(cls) -> str | None:
        if not sys.platform.startswith("linux"):
            return "needs Linux (vfio-pci)"
        if not vfio.SYS_PCI.joinpath("devices").exists():
            return "no /sys/bus/pci (no PCI devices to take)"
        return None

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.fsync or job.fdatasync or job.end_fsync:
            raise BadInput(f"job '{job.name}': engine 'bam' sends no NVMe Flush yet; drop "
                           "fsync, fdatasync and end_fsync")
        if job.bs % nq.PAGE and nq.PAGE % job.bs:
            raise BadInput(f"job '{job.name}': engine 'bam' needs bs to divide or be a "
                           f"multiple of {nq.PAGE} (one PRP entry per memory page)")
        if job.bs > nq.PAGE * (nq.PRP_PER_PAGE + 1):
            raise BadInput(f"job '{job.name}': bs {job.bs} needs a chained PRP list; engine "
                           f"'bam' takes at most {nq.PAGE * (nq.PRP_PER_PAGE + 1)}")

    @classmethod
    def guardian(cls, job: Job, targets: list[Target]) -> list[str]:
        return [sys.executable, "-m", "gpufio.io.nvme_guardian", _controller(job, targets)]

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        return {**super().describe(job), "page_cache": False, "submitter": SUBMITTER,
                "mode": SUBMITTER, "doorbells": "cpu", "queues": "host memory"}

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        return nvme_driver.doctor_checks(host, cls.name, needed=bool(jobs))

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        bdf = _controller(job, targets)
        if job.iodepth + 1 > 65536:
            raise BadInput(f"job '{job.name}': iodepth {job.iodepth} is past NVMe's queues")
        self._shared, self.pair = _Shared.acquire(bdf, job.writes, job.numjobs,
                                                  job.iodepth + 1, ctx.worker, targets)
        try:
            self._setup(job, targets)
        except BaseException:
            self._shared.release()
            raise

    def _setup(self, job: Job, targets: list[Target]) -> None:
        session = self._shared.session
        assert session.device is not None
        info = session.info
        spaces: dict[int, dict[str, int]] = info["ns"]  # type: ignore[assignment]
        self._nsid = np.array([t.facts["nsid"] for t in targets], np.uint32)
        self._shift = np.array([spaces[int(n)]["lba_bytes"].bit_length() - 1
                                for n in self._nsid], np.uint64)
        most = int(info["max_transfer"])  # type: ignore[call-overload]
        if most and job.bs > most:
            raise BadInput(f"job '{job.name}': bs {job.bs} is over the controller's largest "
                           f"transfer (MDTS: {most} bytes)")
        depth = job.iodepth
        self._data = session.device.memory(depth * job.bs)
        self._slots = np.frombuffer(self._data.map, np.uint8)[:depth * job.bs].reshape(
            depth, job.bs)
        pages = nq.prp_count(0, job.bs)
        self._lists = session.device.memory(depth * nq.PAGE) if pages > 2 else None
        prp1 = np.zeros(depth, np.uint64)
        prp2 = np.zeros(depth, np.uint64)
        for s in range(depth):
            list_iova = self._lists.iova + s * nq.PAGE if self._lists else 0
            p1, p2, entries = nq.prp_pointers(self._data.iova + s * job.bs, job.bs, list_iova)
            prp1[s], prp2[s] = p1, p2
            if len(entries):
                assert self._lists is not None
                np.frombuffer(self._lists.map, "<u8", len(entries),
                              s * nq.PAGE)[:] = entries
        self._prp = (prp1, prp2)

    def run(self) -> None:
        ctx, job, pair = self.ctx, self.job, self.pair
        depth = job.iodepth
        table = SlotTable(depth, targets=len(self.targets) > 1, offsets=ctx.verifying)
        slot_writes = np.full(depth, job.writes)
        free = np.arange(depth, dtype=np.int64)
        clock = time.perf_counter_ns
        issuing, inflight = True, 0
        dog, completed = Watchdog(STALL_LIMIT_NS, clock()), 0
        while True:
            want = min(len(free), pair.space()) if issuing else 0
            if want and inflight:
                want, _ = ctx.due(want)
            if want:
                tgt, offs = ctx.next_batch(want)
                k = len(offs)
                if k:
                    slots, free = free[:k], free[k:]
                    writes = ctx.last_writes()
                    if writes is not False:
                        ctx.fill(self._slots, tgt, offs, slots)
                    w = writes if job.mixed else job.writes
                    slot_writes[slots] = w
                    pair.submit(nq.io_commands(
                        write=w, nsid=self._nsid[tgt], lba_shift=self._shift[tgt],
                        off=offs, length=job.bs, cid=slots, prp1=self._prp[0][slots],
                        prp2=self._prp[1][slots]))
                    table.issue(slots, tgt, offs, clock())
                    inflight += k
                else:
                    issuing = False
            if inflight == 0:
                if not issuing:
                    return
                continue
            cids, status = pair.reap()
            now, completed = clock(), completed + len(cids)
            if dog.update(completed, now):
                raise Stalled(self._stalled(inflight))
            if not len(cids):
                continue
            inflight -= len(cids)
            res = nq.result(status, job.bs)
            bad = self._bad(cids, res) if ctx.verifying else None
            table.complete(ctx, cids, res, now, bad, slot_writes[cids] if job.mixed
                           else job.writes)
            free = np.concatenate((free, cids)) if len(free) else cids

    def _stalled(self, inflight: int) -> str:
        return (f"{inflight} NVMe commands in flight on queue {self.pair.qid} of "
                f"{self._shared.bdf} and none completed for {STALL_LIMIT_NS / 1e9:g} s")

    def _bad(self, done: np.ndarray, res: np.ndarray) -> Callable[[np.ndarray, np.ndarray],
                                                                   list[int]]:
        """The CPU check of the slots ``done`` landed in (DMA-mapped host memory)."""
        return lambda tgt, offs: self.ctx.mismatches(self._slots[done], tgt, offs, res)

    def close(self) -> None:
        self._slots = None
        self.pair = None  # type: ignore[assignment]
        self._shared.release()
