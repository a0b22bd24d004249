"""bam: BaM's mechanism, a user-space NVMe driver writing commands into the controller's own
queues, over vfio-pci with the IOMMU on and no kernel module.

A target is an NVMe namespace named by its block device /dev/nvmeXnY (or its char device
/dev/ngXnY), as for uring-cmd: the job takes the controller behind it from the nvme driver
for the job's length (its namespaces vanish from /dev meanwhile) and gives it back after.
Every worker owns one polled I/O queue pair of ``iodepth`` entries (numjobs pairs; iodepth
at most CAP.MQES + 1 less the one slot a ring keeps empty). Data lands in pinned host memory
mapped for the controller's DMA; transfers over two pages go through per-slot PRP lists.

Two submitters write the SQEs of io/nvme_queue.py, ring the doorbells, poll the CQ's phase
tags and ring the CQ head doorbell, and every result names which (``submitter``):
- ``gpu``: GPU threads, BaM's mechanism (io/gio/nvme.py's agent warps under the block
  benchmark of io/gio/bench.py, as gpu-uring's). Reads land in GPU memory and are verified
  there; doorbells are rung straight from the GPU (``direct``: BAR0 registered with CUDA as
  I/O memory) or by one CPU thread per worker (``relay``), named in the result.
- ``cpu``: a CPU stand-in (``cpu-stand-in``) on the same queue pairs, for hosts without a
  GPU (the NVMe rig).
A guardian process (io/nvme_guardian.py) gives the controller back if the runner dies.

With ``controller = "model"`` the controller is gpufio's software NVMe controller
(io/nvme_model.py) in a process of its own, serving the job's one target file as
namespace 1: the GPU side runs unchanged on a machine with no NVMe (results say
``controller = model``; its rate is a Python loop's, not a drive's).
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core.checks import Check
from gpufio.core.context import READ, WRITE, DeviceTotals
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import GPU, Capability
from gpufio.core.rows import RowRequest, RowSupport, RowTable, row_depth
from gpufio.core.slots import SlotTable
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.io import nvme_cmd, nvme_driver, vfio
from gpufio.io import nvme_queue as nq
from gpufio.io.gio.bench import check_bench_job
from gpufio.io.gio.gather import QueueGather
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

SUBMITTER = "cpu-stand-in"
MODEL_SLACK = 64 * nq.PAGE  # the model's admin queue, Identify pages, alignment


def submitter(o: Any) -> str:
    """Who writes the commands: the option, else GPU threads on the software controller
    (which exists for them) and the CPU stand-in on a real one."""
    return o.submitter or ("gpu" if o.controller == "model" else "cpu")


def doorbells(o: Any) -> str:
    """How a GPU submitter's doorbells reach the controller: the option, else direct on the
    software controller (its BAR page is host memory CUDA registers) and the relay on a
    real one (NVIDIA's driver cannot register a BAR as I/O memory on recent kernels)."""
    if submitter(o) == "cpu":
        return "cpu"
    if o.doorbells != "auto":
        return o.doorbells
    return "direct" if o.controller == "model" else "relay"


def slot_bytes(bs: int) -> int:
    """A GPU submitter's landing slot: ``bs`` in whole pages (one PRP entry per page)."""
    return -(-bs // nq.PAGE) * nq.PAGE


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


class _Held:
    """Something a job's workers (threads) share, listed in its class's ``open`` by
    ``key`` while ``users`` hold it."""

    lock: threading.Lock
    open: dict[str, Any]
    key: str
    users: int

    def _last(self) -> bool:
        """One user fewer; True for the last, who then closes it (no longer listed)."""
        with self.lock:
            self.users -= 1
            if self.users:
                return False
            del self.open[self.key]
        return True


class _Shared(_Held):
    """A job's controller, brought up once for all its workers (threads), each taking one
    queue pair; the last worker to close shuts it down and gives it back."""

    lock = threading.Lock()
    open: dict[str, _Shared] = {}

    def __init__(self, bdf: str, writes: bool, pairs: int, depth: int,
                 targets: list[Target]) -> None:
        self.bdf = self.key = bdf
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
        self.registered: Any = None

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

    def gpu_memory(self, direct: bool) -> Any:
        """The controller's memory as the GPU side takes it (io/gio/nvme.RegisteredVfio,
        made by the first GPU worker, every pair's rings registered): call under ``lock``."""
        from gpufio.io.gio.backends.nvme import RegisteredVfio

        if self.registered is None:
            self.registered = RegisteredVfio(self.session.device, direct)
            for p in self.pairs:
                self.registered.adopt(p)
        return self.registered

    def release(self) -> None:
        if not self._last():
            return
        self.pairs = []
        try:
            if self.registered is not None:
                self.registered.close()
        finally:
            self.session.close()


class _Model(_Held):
    """A job's software controller (io/nvme_model.ServedFile) serving its one target,
    started by the first worker, each worker taking one queue pair; the last to close
    stops it."""

    lock = threading.Lock()
    open: dict[str, _Model] = {}

    def __init__(self, path: str, lba_shift: int, dma_bytes: int) -> None:
        from gpufio.io import nvme_model
        from gpufio.io.gio.backends.nvme import RegisteredModel

        self.key = path
        self.served = nvme_model.ServedFile(path, lba_shift, dma_bytes)
        try:
            self.registered = RegisteredModel(self.served.mem)
        except BaseException:
            self.served.close()
            raise
        self.users = 0

    @classmethod
    def acquire(cls, job: Job, path: str, lba_shift: int, worker: int) -> tuple[_Model, Any]:
        """The job's controller and worker's own queue pair (qid worker + 1)."""
        with cls.lock:
            model = cls.open.get(path)
            if model is None:
                per = 2 * nq.PAGE + (job.iodepth + 1) * (nq.SQE_BYTES + nq.CQE_BYTES) + \
                    job.iodepth * (slot_bytes(job.bs) + nq.PAGE) + nq.PAGE
                model = cls.open[path] = cls(path, lba_shift, job.numjobs * per + MODEL_SLACK)
            model.users += 1
            try:
                return model, model.served.host.create_pair(worker + 1, job.iodepth + 1)
            except BaseException:
                model.users -= 1
                raise

    def release(self) -> None:
        if not self._last():
            return
        try:
            self.registered.close()
        finally:
            self.served.close()


@register
class Bam(Engine):
    """NVMe commands written by GPU threads (or a CPU stand-in) into the controller's own
    queues, over vfio-pci or into the software controller."""

    name = "bam"
    summary = ("BaM's user-space NVMe driver over vfio-pci (IOMMU on): GPU threads (or a CPU "
               "stand-in) write SQEs into the controller's own queues, ring its doorbells "
               "(direct or relayed), poll its CQ; the controller is taken from the nvme "
               "driver for the job and given back, or is gpufio's software controller")
    peer = "BaM (ZaidQureshi/bam), SPDK perf"
    iodepth_means = "commands in flight on each worker's own NVMe queue pair"
    worker_kind = "thread"  # one process holds the controller; workers share it
    flushes_itself = True  # a taken controller's namespaces have no file to fsync
    # GPU threads submit; the block workload runs on the engine's own device loop
    capability = Capability(memory=(GPU,), submitter="gpu")
    # rows in whole 512-byte blocks: an NVMe read moves whole logical blocks
    rows = RowSupport(gpu_only=True, cache=True, dim_multiple=128)
    options = (
        Option("controller", "str", "vfio", "'vfio': the NVMe controller behind the targets, "
               "taken from the nvme driver over vfio-pci; 'model': gpufio's software NVMe "
               "controller (io/nvme_model.py) in a process of its own, serving the job's one "
               "target file as namespace 1 (no NVMe needed; its rate is a Python loop's)",
               choices=("vfio", "model")),
        Option("submitter", "str", None, "who writes the NVMe commands: 'gpu' (GPU threads, "
               "BaM's mechanism) or 'cpu' (a CPU stand-in on the same queues; real "
               "controllers only). Default: gpu on the model, cpu on a real controller",
               choices=("gpu", "cpu")),
        Option("doorbells", "str", "auto", "how GPU threads ring doorbells: 'direct' (stores "
               "into BAR0, registered with CUDA as I/O memory), 'relay' (into host memory, "
               "one CPU thread per worker writes the registers), 'auto' (direct on the model, "
               "relay on a real controller)", choices=("auto", "direct", "relay")),
        Option("model_lba", "int", 512, "the software controller's logical block size",
               minimum=512),
        Option("stall_timeout", "time", 10_000_000_000, "stop the GPU kernels and fail when no "
               "command completes for this long", minimum=1_000_000),
    )

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return cls.settings(job).controller == "vfio"

    @classmethod
    def row_fetcher(cls, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
        return BamFetch(job, table, xp, request)

    @classmethod
    def gpu_memory(cls) -> tuple[str, ...]:
        # not uses_gpu: the CPU stand-in needs none, and doctor keeps the vfio checks on a
        # host without one; GPU threads land block reads and GNN rows in GPU memory
        return ("block", "rows")

    @classmethod
    def unavailable(cls) -> str | None:
        if not sys.platform.startswith("linux"):
            return "needs Linux (vfio-pci)"
        if not vfio.SYS_PCI.joinpath("devices").exists():
            return "no /sys/bus/pci (no PCI devices to take)"
        return None

    @classmethod
    def check_job(cls, job: Job) -> None:
        o = cls.settings(job)
        who = submitter(o)
        if job.bs % nq.PAGE and nq.PAGE % job.bs:
            raise BadInput(f"job '{job.name}': engine 'bam' needs bs to divide or be a "
                           f"multiple of {nq.PAGE} (one PRP entry per memory page)")
        if job.bs > nq.PAGE * (nq.PRP_PER_PAGE + 1):
            raise BadInput(f"job '{job.name}': bs {job.bs} needs a chained PRP list; engine "
                           f"'bam' takes at most {nq.PAGE * (nq.PRP_PER_PAGE + 1)}")
        if o.controller == "model":
            if who == "cpu":
                raise BadInput(f"job '{job.name}': engine 'bam' drives the software "
                               "controller from GPU threads only (submitter = \"gpu\")")
            if o.model_lba & (o.model_lba - 1) or o.model_lba > nq.PAGE:
                raise BadInput(f"job '{job.name}': model_lba {o.model_lba} is not a power "
                               f"of two from 512 to {nq.PAGE}")
            if job.bs % o.model_lba:
                raise BadInput(f"job '{job.name}': bs {job.bs} is not a multiple of the "
                               f"software controller's {o.model_lba}-byte blocks (model_lba)")
        if who == "gpu":
            if len(job.targets) > 1:
                raise BadInput(f"job '{job.name}': engine 'bam' with GPU threads drives one "
                               f"namespace per job; it names {len(job.targets)} targets")
            check_bench_job(job, cls.name)
        elif o.doorbells != "auto":
            raise BadInput(f"job '{job.name}': doorbells = \"{o.doorbells}\" is for GPU "
                           "threads; the CPU stand-in rings them itself")

    @classmethod
    def guardian(cls, job: Job, targets: list[Target]) -> list[str] | None:
        if cls.settings(job).controller == "model":
            return None
        return [sys.executable, "-m", "gpufio.io.nvme_guardian", _controller(job, targets)]

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        who, bells = submitter(o), doorbells(o)
        where = "model" if o.controller == "model" else "real"
        if who == "cpu":
            return {**super().describe(job), "page_cache": False, "submitter": SUBMITTER,
                    "mode": SUBMITTER, "doorbells": "cpu", "controller": where,
                    "queues": "host memory"}
        return {**super().describe(job), "page_cache": False, "submitter": "gpu",
                "mode": f"gpu, {bells} doorbells, {where} controller", "doorbells": bells,
                "controller": where, "queues": "host memory", "gpus": list(job.gpu_list),
                "lands_in": "written from the slots, the pattern generated there by GPU "
                            "threads" if job.writes else "gpu memory",
                "iodepth_per_queue": job.iodepth}

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        from gpufio.io import gpu
        from gpufio.io.gio.backends import nvme

        real = [j for j in jobs if cls.settings(j).controller == "vfio"]
        relays = [(j.name, j.numjobs) for j in jobs if doorbells(cls.settings(j)) == "relay"]
        out = nvme_driver.doctor_checks(host, cls.name, needed=bool(real))
        if host.root != Path("/"):  # a recorded tree: nothing of this machine's GPU applies
            return out
        return out + nvme.gpu_doctor_checks(cls.name, relays, host.cpus(), gpu.probe()[1])

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        o = self._opts = self.settings(job)
        self._gpu = submitter(o) == "gpu"
        self._model: _Model | None = None
        self._shared: _Shared | None = None
        self.queues: Any = None
        self._bench: Any = None
        if job.iodepth + 1 > 65536:
            raise BadInput(f"job '{job.name}': iodepth {job.iodepth} is past NVMe's queues")
        if self._gpu:
            from gpufio.io import gpu

            why = gpu.probe()[1]
            if why:
                raise BadInput(f"engine 'bam' with submitter = \"gpu\" needs a GPU: {why}")
            gpu.use(job.gpu_of(ctx.worker))  # before any registration: this worker's GPU
        if o.controller == "model":
            shift = o.model_lba.bit_length() - 1
            self._model, self.pair = _Model.acquire(job, targets[0].path, shift, ctx.worker)
            try:
                self._gpu_setup(self._model.registered, 1, shift)
            except BaseException:
                self._model.release()
                raise
            return
        bdf = _controller(job, targets)
        self._shared, self.pair = _Shared.acquire(bdf, job.writes, job.numjobs,
                                                  job.iodepth + 1, ctx.worker, targets)
        try:
            self._setup(job, targets)
            if self._gpu:
                with _Shared.lock:
                    mem = self._shared.gpu_memory(doorbells(o) == "direct")
                self._gpu_setup(mem, int(self._nsid[0]), int(self._shift[0]))
        except BaseException:
            self._shared.release()
            raise

    def _gpu_setup(self, mem: Any, nsid: int, lba_shift: int) -> None:
        """GPU threads on this worker's pair: the NVMe queue agents and the block benchmark."""
        from gpufio.io.gio.bench import DeviceBench
        from gpufio.io.gio.backends.nvme import NvmeQueues

        job = self.job
        with _Shared.lock, _Model.lock:  # the memory's allocators serve every worker
            self.queues = NvmeQueues(mem, [self.pair], depth=job.iodepth,
                                     slot_bytes=slot_bytes(job.bs), nsid=nsid,
                                     lba_shift=lba_shift, mode=doorbells(self._opts))
        try:
            self._bench = DeviceBench(self.queues, job, self.ctx, ntargets=1,
                                      threads=job.iodepth, land_gpu=True,
                                      direction=WRITE if job.writes else READ)
        except BaseException:
            self.queues.close()
            self.queues = None
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
        if self._gpu:  # the GPU side lays out its own slots and PRP lists
            return
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
        if self._gpu:
            self._run_gpu()
            return
        ctx, job, pair = self.ctx, self.job, self.pair
        depth = job.iodepth
        table = SlotTable(depth, targets=len(self.targets) > 1, offsets=ctx.verifying)
        slot_writes = np.full(depth, job.writes)
        free = np.arange(depth, dtype=np.int64)
        clock = time.perf_counter_ns
        issuing, syncing, inflight = True, False, 0
        dog, completed = Watchdog(STALL_LIMIT_NS, clock()), 0
        while True:
            if syncing and inflight == 0:  # fsync = N: the writes before the Flush landed
                self._flush()
                syncing = False
            want = min(len(free), pair.space()) if issuing and not syncing else 0
            if want and inflight:
                want, _ = ctx.due(want)
            if want and job.writes:
                want = min(want, ctx.until_sync)
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
                    nwrites = int(np.count_nonzero(w)) if job.mixed else k * bool(w)
                    syncing = bool(nwrites) and ctx.sync_due(nwrites)
                else:
                    issuing = False
            if inflight == 0:
                if not issuing:
                    if job.end_fsync and job.writes:
                        self._flush()
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

    def _flush(self) -> None:
        """An NVMe Flush of every namespace of the job on this worker's pair, one at a time,
        with nothing else in flight (so the pair's next completion is the Flush's); counted
        as fio counts an fsync. A Flush that fails ends the job (RuntimeError naming it)."""
        pair, clock = self.pair, time.perf_counter_ns
        t0 = clock()
        nsids = sorted({int(n) for n in self._nsid})
        for nsid in nsids:
            pair.submit(nq.flush_command(nsid, self.job.iodepth))  # a cid no data slot has
            dog = Watchdog(STALL_LIMIT_NS, clock())
            while True:
                cids, status = pair.reap()
                if len(cids):
                    break
                if dog.update(0, clock()):
                    raise Stalled(f"NVMe Flush of namespace {nsid} on queue {pair.qid} of "
                                  f"{self._where()}: no completion for "
                                  f"{STALL_LIMIT_NS / 1e9:g} s")
            res = int(nq.result(status, 0)[0])
            if res:
                raise RuntimeError(f"NVMe Flush of namespace {nsid} on {self._where()}: "
                                   f"{nvme_cmd.error_name(-res)}")
        self.ctx.synced(len(nsids), clock() - t0)

    def _run_gpu(self) -> None:
        """GPU threads run the block benchmark through the NVMe queue agents; end_fsync is
        one NVMe Flush from a GPU thread once the writes are done."""
        o = self._opts
        try:
            self._bench.run(o.stall_timeout)
        finally:
            if self._bench.totals is not None:
                self.ctx.absorb(DeviceTotals(**self._bench.totals))
        self.ctx.note("gpu_price", [self._bench.price])
        relay = self.queues.relay
        if relay is not None:  # what the relay did: MMIO writes, passes over the words
            self.ctx.note("relay_writes", [relay.writes])
            self.ctx.note("relay_passes", [relay.passes])
        if self.job.end_fsync and self.job.writes:
            t0 = time.perf_counter_ns()
            res = self.queues.flush(o.stall_timeout)
            if res:
                raise RuntimeError(f"NVMe Flush from a GPU thread on {self._where()}: "
                                   f"{nvme_cmd.error_name(-res)}")
            self.ctx.synced(1, time.perf_counter_ns() - t0)

    def _where(self) -> str:
        return self._shared.bdf if self._shared is not None else "the software controller"

    def _stalled(self, inflight: int) -> str:
        return (f"{inflight} NVMe commands in flight on queue {self.pair.qid} of "
                f"{self._where()} and none completed for {STALL_LIMIT_NS / 1e9:g} s")

    def _bad(self, done: np.ndarray, res: np.ndarray) -> Callable[[np.ndarray, np.ndarray],
                                                                   list[int]]:
        """The CPU check of the slots ``done`` landed in (DMA-mapped host memory)."""
        return lambda tgt, offs: self.ctx.mismatches(self._slots[done], tgt, offs, res)

    def close(self) -> None:
        self._slots = None
        try:
            if self._bench is not None:
                self._bench.close()
            if self.queues is not None:
                self.queues.close()
        finally:
            self.pair = None  # type: ignore[assignment]
            owner = self._model if self._model is not None else self._shared
            assert owner is not None
            # an agent that never stopped may still touch the queues' memory: it stays
            # (the GPU is marked unusable; the guardian gives a real controller back)
            if self.queues is None or self.queues.kernels_done:
                owner.release()


class BamFetch(QueueGather):
    """The ``bam`` path for the GNN workload's aggregation: GPU threads read the rows through
    NVMe queue agents (io/gio/nvme.py) with the gather of io/gio/gather.py, as gpu-uring's
    do through io_uring, through the GPU cache when one is asked. The feature file is served
    by a software controller of its own (controller = "model"): a real controller's
    namespace holds no feature file gpufio could lay out and find again."""

    page_cache = False

    def __init__(self, job: Job, table: RowTable, xp: Any, request: RowRequest) -> None:
        from gpufio.io import nvme_model
        from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel

        o = Bam.settings(job)
        layout = table.layout
        if o.controller != "model":
            raise BadInput(f"job '{job.name}': engine 'bam' fetches GNN rows from the software "
                           "controller only (controller = \"model\"): a namespace taken over "
                           "vfio holds no feature file")
        if multiprocessing.current_process().daemon:  # a data-parallel job's trainer
            raise BadInput(f"job '{job.name}': engine 'bam' starts a software controller "
                           "process per row fetcher, which a data-parallel job's trainer "
                           "processes may not: give the job one GPU")
        if layout.ntargets != 1:
            raise BadInput(f"job '{job.name}': engine 'bam' serves one feature file as its "
                           f"namespace; the table is striped over {layout.ntargets} files")
        if layout.header % o.model_lba or layout.row_bytes % o.model_lba:
            raise BadInput(f"job '{job.name}': feature rows of {layout.row_bytes} bytes from "
                           f"byte {layout.header} are not whole {o.model_lba}-byte blocks "
                           "(model_lba)")
        depth = row_depth(request)
        bells = doorbells(o)
        # the result's engine_mode: who submitted, the doorbells, the controller
        self.mode = f"gpu, {bells} doorbells, model controller"
        self.facts: dict[str, Any] = {"iodepth": depth, "submitter": "gpu",
                                      "doorbells": bells, "controller": "model",
                                      "mode": self.mode}
        shift = o.model_lba.bit_length() - 1
        row = slot_bytes(layout.row_bytes)
        dma = 2 * nq.PAGE + (depth + 1) * (nq.SQE_BYTES + nq.CQE_BYTES) + \
            depth * (row + nq.PAGE) + nq.PAGE + MODEL_SLACK
        self._served = nvme_model.ServedFile(table.paths[0], shift, dma)
        self._registered: Any = None
        self.queue: Any = None
        try:
            self._registered = RegisteredModel(self._served.mem)
            pair = self._served.host.create_pair(1, depth + 1)
            self.queue = NvmeQueues(self._registered, [pair], depth=depth, slot_bytes=row,
                                    nsid=1, lba_shift=shift, mode=bells)
            super().__init__(self.queue, table, xp, request.dim, depth, o.stall_timeout,
                             request.cache_bytes)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.queue is not None:
                self.queue.close()
            if self._registered is not None:
                self._registered.close()
        finally:
            self._served.close()
