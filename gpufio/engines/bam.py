"""bam: BaM's mechanism, a user-space NVMe driver writing commands into the controller's own
queues, over vfio-pci with the IOMMU on and no kernel module.

A target is an NVMe namespace named by its block device /dev/nvmeXnY (or its char device
/dev/ngXnY), as for uring-cmd: the job takes the controller behind it from the nvme driver
for the job's length (its namespaces vanish from /dev meanwhile) and gives it back after.
Every worker (or the GNN gather's channel) owns one polled I/O queue pair of ``iodepth``
entries (numjobs pairs; iodepth at most CAP.MQES + 1 less the one slot a ring keeps empty).
Data lands in pinned host memory mapped for the controller's DMA; transfers over two pages
go through per-slot PRP lists.

Two submitters write the SQEs of io/nvme_queue.py, ring the doorbells, poll the CQ's phase
tags and ring the CQ head doorbell, and every result names which (``submitter``):
- ``gpu``: GPU threads, BaM's mechanism (io/gio/backends/nvme.py's agent warps, the engine's
  ``queue``, under the block benchmark of loops/block_device.py, as gpu-uring's). Reads land in GPU memory and are verified
  there; doorbells are rung straight from the GPU (``direct``: BAR0 registered with CUDA as
  I/O memory) or by one CPU thread per worker (``relay``), named in the result.
- ``cpu``: a CPU stand-in (``cpu-stand-in``) on the same queue pairs, for hosts without a
  GPU (the NVMe rig): the engine's channel (``StandIn``, core/requests), so the block loop,
  the GNN row gather and any loop written over channels run on it unchanged.
A guardian process (io/nvme_guardian.py, started by io/nvme_driver.Session) gives the
controller back if the process holding it dies.

With ``controller = "model"`` the controller is gpufio's software NVMe controller
(io/nvme_model.py) in a process of its own, serving the job's one target file as
namespace 1: the GPU side runs unchanged on a machine with no NVMe (results say
``controller = model``; its rate is a Python loop's, not a drive's). With
``controller = "compiled"`` it is the same protocol served by compiled poller threads
(io/nvme/controller.c: ``controller_threads``, ``controller_backend``). A software
controller serves several files (a job's targets, a striped feature table's files) as
namespaces 1, 2 ... ``drive_model`` puts a drive's published rates in front of each
namespace (io/nvme/drives.py): every result then says ``emulated: <model>, rates from
<source>`` in its mode, as a compat cuFile run says compat.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.checks import Check
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import (CHANNEL, HOST, QUEUE, Capability, Channel, ChannelSpec,
                                  DeviceQueue, File, QueueSpec, drain)
from gpufio.core.rows import RowSupport, row_depth
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.facts.device import path_facts
from gpufio.io import nvme_cmd, nvme_driver, vfio
from gpufio.io.nvme import drives
from gpufio.io import nvme_queue as nq
from gpufio.io.gio.bench import check_bench_job
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.facts.system import Host

SUBMITTER = "cpu-stand-in"
MODEL_SLACK = 64 * nq.PAGE  # the model's admin queue, Identify pages, alignment
SOFTWARE = ("model", "compiled")  # the software controllers: one protocol, one process each
EMULATED = (*SOFTWARE, "qemu")  # controllers the job starts itself, serving its one file


def submitter(o: Any) -> str:
    """Who writes the commands: the option, else GPU threads on the software controller
    (which exists for them) and the CPU stand-in on a real one."""
    return o.submitter or ("gpu" if o.controller in SOFTWARE else "cpu")


def doorbells(o: Any) -> str:
    """How a GPU submitter's doorbells reach the controller: the option, else direct on the
    software controller (its BAR page is host memory CUDA registers) and the relay on a
    real one (NVIDIA's driver cannot register a BAR as I/O memory on recent kernels)."""
    if submitter(o) == "cpu":
        return "cpu"
    if o.doorbells != "auto":
        return o.doorbells
    return "direct" if o.controller in SOFTWARE else "relay"


def server(o: Any, namespaces: Sequence[str] = ()) -> Any:
    """The loop a software controller's process runs, serving ``namespaces`` as namespaces
    2, 3 ... (each a drive), each at the drive model's rates where one is named: the
    compiled controller's with the job's threads and backend; the Python model's; None
    for the model with neither (its own loop)."""
    if o.controller == "compiled":
        from gpufio.io.nvme import compiled

        return compiled.server(o.controller_threads, o.controller_backend,
                               drive=o.drive_model, namespaces=tuple(namespaces))
    if not o.drive_model and not namespaces:
        return None
    from gpufio.io import nvme_model

    return functools.partial(nvme_model.serve, drive=o.drive_model,
                             namespaces=tuple(namespaces))


def _compiled_available() -> bool:
    from gpufio.io.nvme import compiled

    return compiled.available()


def _qemu_missing() -> bool:
    from gpufio.io.nvme import qemu

    return qemu.binary() is None


def emulated(o: Any) -> str:
    """The mode's words for a modelled drive (", emulated: <model>, rates from <source>"),
    else ""."""
    return f", {drives.label(drives.model(o.drive_model))}" if o.drive_model else ""


def slot_bytes(bs: int) -> int:
    """A GPU submitter's landing slot: ``bs`` in whole pages (one PRP entry per page)."""
    return -(-bs // nq.PAGE) * nq.PAGE


def _namespaces(job: Job, files: Sequence[Any]) -> tuple[str, np.ndarray]:
    """(the one controller, each file's namespace id) behind ``files``: targets carry the
    facts gathered when they were opened (while gpufio holds the controller, and after,
    when the nvme driver may have named it anew, sysfs no longer leads there); any other
    file (a feature table on a namespace) is looked up now, before the controller is
    taken. BadInput for a file that is no NVMe namespace on PCIe, or for two controllers."""
    facts = [getattr(f, "facts", None) or path_facts(f.path) for f in files]
    paths = ", ".join(f.path for f in files)
    if any(f.get("kind") != "block" or "nsid" not in f for f in facts):
        raise BadInput(f"job '{job.name}': engine 'bam' reads NVMe namespaces (/dev/nvmeXnY), "
                       f"not files: {paths}")
    found = {f.get("pci_address") for f in facts}
    if None in found:
        raise BadInput(f"job '{job.name}': engine 'bam' finds no PCIe controller behind "
                       f"{paths} (NVMe over fabrics or a virtual namespace)")
    if len(found) > 1:
        raise BadInput(f"job '{job.name}': engine 'bam' drives one controller per job; its "
                       f"targets are on {', '.join(sorted(found))}")  # type: ignore[arg-type]
    return found.pop(), np.array([f["nsid"] for f in facts], np.uint32)  # type: ignore[return-value]


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
    """A job's controller, brought up once for all its channels and workers (threads),
    each taking one of its queue pairs; the last to let go shuts it down and gives it
    back."""

    lock = threading.Lock()
    open: dict[str, _Shared] = {}

    def __init__(self, bdf: str, writes: bool, pairs: int, depth: int,
                 opener: Callable[[], Any] | None = None) -> None:
        self.bdf = self.key = bdf
        self.session = opener() if opener else nvme_driver.Session(bdf, writes=writes)
        try:
            assert self.session.controller is not None
            self.pairs = self.session.controller.create_pairs(pairs, depth)
        except BaseException:
            self.session.close()
            raise
        self.free = list(self.pairs)
        self.users = 0
        self.registered: Any = None
        self.emulated = opener is not None

    @classmethod
    def acquire(cls, bdf: str, writes: bool, pairs: int, depth: int,
                opener: Callable[[], Any] | None = None
                ) -> tuple[_Shared, nvme_driver.QueuePair]:
        """The job's controller (brought up with ``pairs`` queue pairs of ``depth`` entries
        by the first taker; ``opener``: its session where gpufio starts the controller
        itself, else the drive at ``bdf`` is taken) and a queue pair of its own."""
        with cls.lock:
            shared = cls.open.get(bdf)
            if shared is None:
                shared = cls.open[bdf] = cls(bdf, writes, pairs, depth, opener)
            if not shared.free:
                raise BadInput(f"controller {bdf}: its {len(shared.pairs)} I/O queue pairs "
                               "are all in use")
            shared.users += 1
            return shared, shared.free.pop(0)

    def give(self, pair: nvme_driver.QueuePair) -> None:
        """``pair`` is free again (nothing of it in flight), then ``release``."""
        with self.lock:
            self.free.append(pair)
        self.release()

    @property
    def info(self) -> dict[str, Any]:
        return self.session.info  # type: ignore[return-value]

    def lba_shifts(self, nsids: np.ndarray) -> np.ndarray:
        """log2 of each namespace's block size, from Identify."""
        spaces = self.info["ns"]
        return np.array([spaces[int(n)]["lba_bytes"].bit_length() - 1 for n in nsids],
                        np.uint64)

    def gpu_memory(self, direct: bool) -> Any:
        """The controller's memory as the GPU side takes it (io/gio/backends/nvme.RegisteredVfio,
        made by the first GPU worker, every pair's rings registered): call under ``lock``."""
        from gpufio.io.gio.backends.nvme import RegisteredGuest, RegisteredVfio

        if self.registered is None and self.emulated:  # QEMU's: its guest RAM holds it all
            self.registered = RegisteredGuest(self.session.qemu)
        elif self.registered is None:
            self.registered = RegisteredVfio(self.session.device, direct)
            for p in self.pairs:
                self.registered.adopt(p)
        return self.registered

    def release(self) -> None:
        if not self._last():
            return
        self.pairs = self.free = []
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

    def __init__(self, path: str, lba_shift: int, dma_bytes: int, serve: Any = None) -> None:
        from gpufio.io import nvme_model
        from gpufio.io.gio.backends.nvme import RegisteredModel

        self.key = path
        self.served = nvme_model.ServedFile(path, lba_shift, dma_bytes, serve)
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
                model = cls.open[path] = cls(path, lba_shift, job.numjobs * per + MODEL_SLACK,
                                             server(Bam.settings(job)))
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
    # the CPU stand-in's channel: host buffers, NVMe namespaces (a feature table laid out
    # on one is read as feature_file = ["/dev/nvmeXnY"]); it takes the controller from the
    # nvme driver, so its files are handed over unopened. GPU threads (submitter = "gpu")
    # submit to the engine's queue instead (primitive, queue).
    capability = Capability(memory=(HOST,), namespaces=True, descriptors=False)
    # rows in whole 512-byte blocks (an NVMe read moves whole logical blocks); the GPU
    # cache in front of the GPU threads' reads
    rows = RowSupport(cache=True, dim_multiple=128)
    options = (
        Option("controller", "str", "vfio", "'vfio': the NVMe controller behind the targets, "
               "taken from the nvme driver over vfio-pci; 'model': gpufio's software NVMe "
               "controller (io/nvme_model.py) in a process of its own, serving the job's one "
               "target file as namespace 1 (no NVMe needed; its rate is a Python loop's); "
               "'compiled': the same protocol served by compiled poller threads "
               "(io/nvme/controller.c); 'qemu': QEMU's hw/nvme over qtest, no guest "
               "(io/nvme/qemu.py; GPU threads through the doorbell relay)",
               choices=("vfio", "model", "compiled", "qemu")),
        Option("controller_threads", "int", 1, "the compiled controller's poller threads, "
               "each serving a share of the queue pairs", minimum=1),
        Option("controller_backend", "str", "ram", "the compiled controller's data: 'ram' "
               "(the target file memory-mapped), 'file' (read and written through io_uring, "
               "O_DIRECT where the file system allows), 'none' (no data moved, PRPs still "
               "checked: the queues' ceiling)",
               choices=("none", "ram", "file")),
        Option("submitter", "str", None, "who writes the NVMe commands: 'gpu' (GPU threads, "
               "BaM's mechanism) or 'cpu' (a CPU stand-in on the same queues). Default: gpu "
               "on the software controllers, cpu on a real controller and on QEMU's",
               choices=("gpu", "cpu")),
        Option("doorbells", "str", "auto", "how GPU threads ring doorbells: 'direct' (stores "
               "into BAR0, registered with CUDA as I/O memory), 'relay' (into host memory, "
               "one CPU thread per worker writes the registers), 'auto' (direct on the model, "
               "relay on a real controller)", choices=("auto", "direct", "relay")),
        Option("model_lba", "int", 512, "the logical block size of the controller the job "
               "starts (model, compiled, qemu)",
               minimum=512),
        Option("drive_model", "str", None, "controller = \"model\" or \"compiled\": hold "
               "each completion (each namespace's, a drive each) to a "
               "drive's published rates (4 KiB random-read IOPS, sequential read, read "
               "latency, PCIe link; io/nvme/drives.toml, each figure with its source); every "
               "result says 'emulated: <model>, rates from <source>'",
               choices=drives.names()),
        Option("stall_timeout", "time", 10_000_000_000, "stop the GPU kernels and fail when no "
               "command completes for this long", minimum=1_000_000),
    )

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return cls.settings(job).controller == "vfio"

    @classmethod
    def primitive(cls, job: Job) -> str | None:
        return QUEUE if submitter(cls.settings(job)) == "gpu" else CHANNEL

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> Channel:
        return StandIn(job, files, spec)

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
        if o.drive_model and o.controller not in SOFTWARE:
            raise BadInput(f"job '{job.name}': drive_model = \"{o.drive_model}\" emulates a "
                           "drive on a software controller (controller = \"model\" or "
                           f"\"compiled\"), not on controller = \"{o.controller}\"")
        if o.controller in EMULATED:
            if who == "cpu" and len(job.targets) > 1 and o.controller not in SOFTWARE:
                raise BadInput(f"job '{job.name}': controller = \"{o.controller}\" serves "
                               f"one file as its namespace; the job names "
                               f"{len(job.targets)} targets")
            if o.controller == "compiled" and not _compiled_available():
                raise BadInput(f"job '{job.name}': controller = \"compiled\" needs a C "
                               "compiler (cc) to build io/nvme/controller.c")
            if o.controller == "qemu" and who == "gpu" and doorbells(o) == "direct":
                raise BadInput(f"job '{job.name}': GPU threads reach QEMU's doorbells "
                               "through the relay only (doorbells = \"relay\")")
            if o.controller == "qemu" and _qemu_missing():
                raise BadInput(f"job '{job.name}': controller = \"qemu\" needs "
                               "qemu-system-x86_64 (apt-get install qemu-system-x86)")
            if o.model_lba & (o.model_lba - 1) or o.model_lba > nq.PAGE:
                raise BadInput(f"job '{job.name}': model_lba {o.model_lba} is not a power "
                               f"of two from 512 to {nq.PAGE}")
            if job.bs % o.model_lba:
                raise BadInput(f"job '{job.name}': bs {job.bs} is not a multiple of the "
                               f"software controller's {o.model_lba}-byte blocks (model_lba)")
        if who == "gpu":
            check_bench_job(job, cls.name)
        elif o.doorbells != "auto":
            raise BadInput(f"job '{job.name}': doorbells = \"{o.doorbells}\" is for GPU "
                           "threads; the CPU stand-in rings them itself")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        who, bells = submitter(o), doorbells(o)
        where = o.controller if o.controller in EMULATED else "real"
        drive = {"drive": drives.describe(drives.model(o.drive_model))} if o.drive_model else {}
        if who == "cpu":
            return {**super().describe(job), "page_cache": False, "submitter": SUBMITTER,
                    "mode": f"{SUBMITTER}{emulated(o)}", **drive, "doorbells": "cpu",
                    "controller": where, "queues": "host memory"}
        return {**super().describe(job), "page_cache": False, "submitter": "gpu",
                "mode": f"gpu, {bells} doorbells, {where} controller{emulated(o)}", **drive,
                "doorbells": bells,
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

    @classmethod
    def queue(cls, job: Job, files: Sequence[File], spec: QueueSpec) -> DeviceQueue:
        """GPU threads' NVMe queue agents (io/gio/backends/nvme.NvmeQueues): for a worker's
        block job, on its own queue pair of the job's controller (``files``: its one
        namespace); for the GNN rows, on a software controller of the fetcher's own serving
        the feature table's files, a namespace each."""
        if spec.table is not None:
            return _row_queue(job, spec)
        o = cls.settings(job)
        if len(files) > 1:  # (a GNN table over several files has a namespace each)
            raise BadInput(f"job '{job.name}': engine 'bam' with GPU threads drives one "
                           f"namespace per block job; it names {len(files)} targets")
        if spec.depth + 1 > 65536:
            raise BadInput(f"job '{job.name}': iodepth {spec.depth} is past NVMe's queues")
        from gpufio.io import gpu

        why = gpu.probe()[1]
        if why:
            raise BadInput(f"engine 'bam' with submitter = \"gpu\" needs a GPU: {why}")
        gpu.use(job.gpu_of(spec.worker))  # before any registration: this worker's GPU
        if o.controller in SOFTWARE:
            shift = o.model_lba.bit_length() - 1
            model, pair = _Model.acquire(job, files[0].path, shift, spec.worker)
            try:
                return _block_queue(job, spec, model, model.registered, pair, 1, shift,
                                    "the software controller")
            except BaseException:
                model.release()
                raise
        opener = None
        if o.controller == "qemu":
            bdf, nsids = f"qemu {files[0].path}", np.ones(1, np.uint32)
            opener = _emulated(job, files[0].path, slot_bytes(job.bs), spec.depth)
        else:
            bdf, nsids = _namespaces(job, files)
        # open descriptors would pin the controller's old instance: the nvme driver would
        # give it a new name on return
        for t in files:
            t.close()
        shared, pair = _Shared.acquire(bdf, job.writes, job.numjobs, spec.depth + 1, opener)
        try:
            _check_transfer(job, shared, job.bs)
            with _Shared.lock:
                mem = shared.gpu_memory(doorbells(o) == "direct")
            return _block_queue(job, spec, shared, mem, pair, int(nsids[0]),
                                int(shared.lba_shifts(nsids)[0]), shared.bdf)
        except BaseException:
            shared.release()
            raise


def _check_transfer(job: Job, shared: _Shared, largest: int) -> None:
    """BadInput where ``largest`` bytes are past the controller's largest transfer (MDTS)."""
    most = int(shared.info["max_transfer"])
    if most and largest > most:
        raise BadInput(f"job '{job.name}': transfers of {largest} bytes are over controller "
                       f"{shared.bdf}'s largest (MDTS: {most} bytes)")


def _emulated(job: Job, path: str, largest: int, depth: int,
              namespaces: Sequence[str] = ()) -> Callable[[], Any]:
    """The session of the controller the job starts to serve ``path`` (EMULATED; a
    software one also ``namespaces`` as namespaces 2, 3 ...), sized for every worker's
    queue pair of ``depth`` commands, their slots of ``largest`` bytes and PRP lists."""
    from gpufio.io.nvme.emulated import EmulatedSession

    o = Bam.settings(job)
    slot = -(-largest // nq.PAGE) * nq.PAGE
    per = 3 * nq.PAGE + (depth + 1) * (nq.SQE_BYTES + nq.CQE_BYTES) + \
        depth * (slot + nq.PAGE)
    dma = max(job.numjobs, 1) * per + MODEL_SLACK
    shift = o.model_lba.bit_length() - 1
    return lambda: EmulatedSession(o.controller, path, shift, dma, server(o, namespaces))


class StandIn(Channel):
    """The CPU stand-in: requests as the 64-byte SQEs of io/nvme_queue.py written into a
    queue pair of the controller over vfio-pci (io/nvme_driver.QueuePair: SQ at the tail,
    one SQ doorbell per batch; completions by phase tag, one CQ head doorbell per reap),
    PRP lists for transfers over two pages, an NVMe Flush of each namespace for ``sync``.

    Data lands only in memory the IOMMU maps for the controller. A loop that hands its one
    buffer region (``spec.region``: the block loop's slots) has it mapped once, so the
    controller moves the bytes in place, as io_uring's fixed buffers. Any other buffer (the
    GNN gather's landing rows, which move as they grow; a mover's pieces of shards) goes
    through slots of the channel's own mapped memory, copied on submit (writes) and on
    reap (reads): mapping each batch's buffers would cost a map and an unmap ioctl, with
    their IOTLB flushes, per batch."""

    def __init__(self, job: Job, files: Sequence[File], spec: ChannelSpec) -> None:
        super().__init__(spec)
        if spec.memory != HOST:
            raise BadInput(f"job '{job.name}': engine 'bam''s CPU stand-in moves host memory "
                           "only")
        # the files come unopened or closed (Capability.descriptors: the block loop closes
        # its targets, the gather opens none)
        o = Bam.settings(job)
        depth = spec.depth
        opener = None
        if o.controller in EMULATED:  # gpufio starts the controller, a namespace per file
            if len(files) > 1 and o.controller not in SOFTWARE:
                raise BadInput(f"job '{job.name}': controller = \"{o.controller}\" serves "
                               f"one file; a table striped over {len(files)} files needs a "
                               "software controller (\"model\" or \"compiled\")")
            bdf = f"{o.controller} {files[0].path}"
            self._nsid = np.arange(1, len(files) + 1, dtype=np.uint32)
            opener = _emulated(job, files[0].path, spec.largest, spec.depth,
                               [f.path for f in files[1:]])
        else:
            bdf, self._nsid = _namespaces(job, files)
        self._shared, self.pair = _Shared.acquire(bdf, spec.writes, max(job.numjobs, 1),
                                                  depth + 1, opener)
        self._mapped: vfio.Memory | None = None
        self._bounce: vfio.Memory | None = None
        self._lists: vfio.Memory | None = None
        try:
            _check_transfer(job, self._shared, spec.largest)
            if spec.largest > nq.PAGE * nq.PRP_PER_PAGE:
                raise BadInput(f"job '{job.name}': transfers of {spec.largest} bytes need a "
                               "chained PRP list, which engine 'bam' does not build")
            self._shift = self._shared.lba_shifts(self._nsid)
            device = self._shared.session.device
            assert device is not None
            self._device = device
            self._slot = -(-spec.largest // nq.PAGE) * nq.PAGE
            if spec.region is not None and device.maps_host_memory:
                lo = spec.region[0] - spec.region[0] % nq.PAGE
                self._mapped = device.memory(sum(spec.region) - lo, lo)
            else:
                self._bounce = device.memory(depth * self._slot)
            if spec.largest > nq.PAGE:  # more than two pages: a PRP list page per slot
                self._lists = device.memory(depth * nq.PAGE)
        except BaseException:
            self.close()
            raise
        self._free = np.arange(depth, dtype=np.int64)
        self._tag = np.zeros(depth, np.int64)
        self._len = np.zeros(depth, np.int64)
        self._addr = np.zeros(depth, np.uint64)
        self._write = np.zeros(depth, bool)
        self._refused: list[tuple[np.ndarray, np.ndarray]] = []  # completions never sent
        self.facts = {"iodepth": depth, "submitter": SUBMITTER,
                      "mode": f"{SUBMITTER}{emulated(o)}",
                      "controller": o.controller if opener else "real",
                      "queue": self.pair.qid,
                      "buffers": "mapped" if self._mapped is not None else "bounced"}

    @property
    def inflight(self) -> int:
        return self.spec.depth - len(self._free) + sum(len(t) for t, _ in self._refused)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(len(off), self.room())
        if k <= 0:
            return 0
        tgt = np.asarray(tgt[:k], np.int64)
        off = np.asarray(off[:k], np.int64)
        length = np.asarray(length[:k], np.int64)
        addr = np.asarray(addr[:k], np.uint64)
        tag = np.asarray(tag[:k], np.int64)
        wr = np.asarray(write, bool)
        wr = np.full(k, bool(wr)) if wr.ndim == 0 else wr[:k]
        lba = np.int64(1) << self._shift[tgt].astype(np.int64)
        bad = ((off | length) & (lba - 1)).astype(bool) | (length <= 0)
        if bad.any():  # not whole logical blocks: the controller cannot move them
            self._refused.append((tag[bad], np.full(int(bad.sum()), -errno.EINVAL, np.int64)))
            ok = ~bad
            tgt, off, length, addr, tag, wr = tgt[ok], off[ok], length[ok], addr[ok], tag[ok], wr[ok]
        n = len(off)
        if n:
            slots, self._free = self._free[:n], self._free[n:]
            dma = self._dma(slots, addr, length, wr)
            prp1, prp2 = self._prps(slots, dma, length)
            self._tag[slots], self._len[slots] = tag, length
            self._addr[slots], self._write[slots] = addr, wr
            self.pair.submit(nq.io_commands(
                write=wr, nsid=self._nsid[tgt], lba_shift=self._shift[tgt], off=off,
                length=length, cid=slots, prp1=prp1, prp2=prp2))
        return k

    def _dma(self, slots: np.ndarray, addr: np.ndarray, length: np.ndarray,
             write: np.ndarray) -> np.ndarray:
        """The bus addresses the requests' data is at: in the mapped region, or in the
        bounce slots (a write's bytes copied there first)."""
        if self._mapped is not None:
            lo, hi = self._mapped.addr, self._mapped.addr + self._mapped.size
            if ((addr < lo) | (addr + length.astype(np.uint64) > hi)).any():
                raise ValueError("a request's buffer lies outside the channel's region")
            return addr - np.uint64(lo) + np.uint64(self._mapped.iova)
        assert self._bounce is not None
        at = slots.astype(np.uint64) * np.uint64(self._slot)
        for i in np.flatnonzero(write):
            ctypes.memmove(self._bounce.addr + int(at[i]), int(addr[i]), int(length[i]))
        return at + np.uint64(self._bounce.iova)

    def _prps(self, slots: np.ndarray, dma: np.ndarray, length: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """PRP1 and PRP2 of each request: the second page, or the slot's PRP list page
        (written here) for a transfer over two pages (io/nvme_queue.prp_pointers)."""
        prp2 = np.zeros(len(dma), np.uint64)
        for i in range(len(dma)):
            list_iova = self._lists.iova + int(slots[i]) * nq.PAGE if self._lists else 0
            _, prp2[i], entries = nq.prp_pointers(int(dma[i]), int(length[i]), list_iova)
            if len(entries):
                assert self._lists is not None and self._lists.map is not None
                np.frombuffer(self._lists.map, "<u8", len(entries),
                              int(slots[i]) * nq.PAGE)[:] = entries
        return dma, prp2

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        if self._refused:
            tags, res = (np.concatenate(x) for x in zip(*self._refused))
            self._refused = []
            return tags, res
        clock = time.perf_counter_ns
        deadline = None if wait_ns is None else clock() + wait_ns
        while True:  # polled: the CPU reads the CQ's phase tags, as a GPU thread would
            cids, status = self.pair.reap()
            if len(cids) or deadline is None or clock() >= deadline or not self.inflight:
                break
            os.sched_yield()
        res = nq.result(status, self._len[cids]).astype(np.int64)
        if self._bounce is not None:  # reads land in the slots: hand them on
            for i in np.flatnonzero(~self._write[cids] & (res > 0)):
                ctypes.memmove(int(self._addr[cids[i]]),
                               self._bounce.addr + int(cids[i]) * self._slot, int(res[i]))
        self._free = np.concatenate((self._free, cids))
        return self._tag[cids], res

    def state(self) -> str:
        p = self.pair
        csts = p.bar.r32(nq.REG_CSTS)
        return (f"{self.inflight} NVMe commands in flight on queue {p.qid} of "
                f"{self._shared.bdf} (SQ tail {p.tail}, CQ head {p.head}, phase {p.phase}, "
                f"CSTS {csts:#x}{': fatal' if csts & nq.CSTS_CFS else ''})")

    def sync(self, fds: Sequence[int]) -> None:
        """An NVMe Flush of each namespace of the channel, one at a time with nothing else
        in flight (the loops sync once their writes are reaped; the Flush's cid is one no
        request slot has). A Flush that fails ends the job (RuntimeError naming it)."""
        pair, clock = self.pair, time.perf_counter_ns
        for nsid in sorted({int(n) for n in self._nsid}):
            pair.submit(nq.flush_command(nsid, self.spec.depth))
            dog = Watchdog(STALL_LIMIT_NS, clock())
            while True:
                cids, status = pair.reap()
                if len(cids):
                    break
                if dog.update(0, clock()):
                    raise Stalled(f"NVMe Flush of namespace {nsid} on queue {pair.qid} of "
                                  f"{self._shared.bdf}: no completion for "
                                  f"{STALL_LIMIT_NS / 1e9:g} s")
            res = int(nq.result(status, 0)[0])
            if res:
                raise RuntimeError(f"NVMe Flush of namespace {nsid} on {self._shared.bdf}: "
                                   f"{nvme_cmd.error_name(-res)}")

    def close(self) -> None:
        """What is in flight lands (bounded), the memory is unmapped (the loop frees its
        region next), the pair goes back; the last user shuts the controller down."""
        shared = getattr(self, "_shared", None)
        if shared is None:
            return
        try:
            if hasattr(self, "_free"):
                self._refused = []
                drain(self, STALL_LIMIT_NS)
        finally:
            try:
                for mem in (self._mapped, self._bounce, self._lists):
                    if mem is not None:
                        self._device.forget(mem)
                self._mapped = self._bounce = self._lists = None
            finally:
                self._shared = None  # type: ignore[assignment]
                shared.give(self.pair)


def _block_queue(job: Job, spec: QueueSpec, owner: Any, mem: Any, pair: Any, nsid: int,
                 lba_shift: int, where: str) -> DeviceQueue:
    """A worker's NVMe queue agents on ``pair`` of ``owner``'s controller (a _Model or a
    _Shared, ``where`` for a failed Flush's message), which its ``close`` releases once no
    agent can touch the queues' memory."""
    from gpufio.io.gio.backends.nvme import NvmeQueues

    o = Bam.settings(job)
    with _Shared.lock, _Model.lock:  # the memory's allocators serve every worker
        queues = NvmeQueues(mem, [pair], depth=spec.depth, slot_bytes=slot_bytes(spec.slot_bytes),
                            nsid=nsid, lba_shift=lba_shift, mode=doorbells(o))

    def relay_notes() -> dict[str, Any]:
        relay = queues.relay  # what the relay did: MMIO writes, passes over the words
        return {} if relay is None else {"relay_writes": [relay.writes],
                                         "relay_passes": [relay.passes]}

    def close() -> None:
        try:
            queues.close()
        finally:
            # an agent that never stopped may still touch the queues' memory: it stays
            # (the GPU is marked unusable; the guardian gives a real controller back)
            if queues.kernels_done:
                owner.release()

    def sync() -> None:  # end_fsync: one NVMe Flush from a GPU thread once the writes are done
        res = queues.flush(o.stall_timeout)
        if res:
            raise RuntimeError(f"NVMe Flush from a GPU thread on {where}: "
                               f"{nvme_cmd.error_name(-res)}")

    return DeviceQueue(queues, o.stall_timeout, threads=spec.depth, final_notes=relay_notes,
                       sync=sync, close=close)


def _row_queue(job: Job, spec: QueueSpec) -> DeviceQueue:
    """GPU threads reading a feature table's rows through NVMe queue agents, as gpu-uring's
    do through io_uring. The files are served by a software controller of the queue's own
    (controller = "model" or "compiled"), a namespace each (a table striped over n drives:
    n namespaces, each at its drive model's rates): a real controller's namespace holds no
    feature file gpufio could lay out and find again."""
    from gpufio.io import nvme_model
    from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel

    o = Bam.settings(job)
    assert spec.table is not None and spec.rows is not None
    layout, paths = spec.table.layout, spec.table.paths
    if o.controller not in SOFTWARE:
        raise BadInput(f"job '{job.name}': engine 'bam' fetches GNN rows from a software "
                       "controller only (controller = \"model\" or \"compiled\"): a "
                       "namespace taken over vfio holds no feature file")
    if multiprocessing.current_process().daemon:  # a data-parallel job's trainer
        raise BadInput(f"job '{job.name}': engine 'bam' starts a software controller "
                       "process per row fetcher, which a data-parallel job's trainer "
                       "processes may not: give the job one GPU")
    if layout.header % o.model_lba or layout.row_bytes % o.model_lba:
        raise BadInput(f"job '{job.name}': feature rows of {layout.row_bytes} bytes from "
                       f"byte {layout.header} are not whole {o.model_lba}-byte blocks "
                       "(model_lba)")
    depth = row_depth(spec.rows)
    bells = doorbells(o)
    # the result's engine_mode: who submitted, the doorbells, the controller
    mode = f"gpu, {bells} doorbells, {o.controller} controller{emulated(o)}"
    facts: dict[str, Any] = {"iodepth": depth, "submitter": "gpu", "doorbells": bells,
                             "controller": o.controller, "mode": mode}
    if o.drive_model:
        facts["drive"] = drives.describe(drives.model(o.drive_model))
    shift = o.model_lba.bit_length() - 1
    row = slot_bytes(layout.row_bytes)
    dma = 2 * nq.PAGE + (depth + 1) * (nq.SQE_BYTES + nq.CQE_BYTES) + \
        depth * (row + nq.PAGE) + nq.PAGE + MODEL_SLACK
    # a table striped over n files: a namespace (a drive) each, on the one controller
    served = nvme_model.ServedFile(paths[0], shift, dma, server(o, paths[1:]))
    held: list[Any] = []  # what close releases, last made first

    def close() -> None:
        try:
            for thing in reversed(held):
                thing.close()
        finally:
            served.close()

    try:
        held.append(RegisteredModel(served.mem))
        pair = served.host.create_pair(1, depth + 1)
        held.append(NvmeQueues(held[0], [pair], depth=depth, slot_bytes=row, nsid=1,
                               lba_shift=shift, mode=bells, namespaces=layout.ntargets))
    except BaseException:
        close()
        raise
    return DeviceQueue(held[1], o.stall_timeout, threads=depth, facts=facts, mode=mode,
                       close=close)
