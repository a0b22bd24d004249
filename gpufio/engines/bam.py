"""bam: BaM's mechanism, a user-space NVMe driver writing commands into the controller's own
queues, over vfio-pci with the IOMMU on and no kernel module.

A target is an NVMe namespace named by its block device /dev/nvmeXnY (or its char device
/dev/ngXnY), as for uring-cmd: the job takes the controller behind it from the nvme driver
for the job's length (its namespaces vanish from /dev meanwhile) and gives it back after.
Every worker (or the GNN gather's channel) owns one polled I/O queue pair of ``iodepth``
entries (numjobs pairs; iodepth at most CAP.MQES + 1 less the one slot a ring keeps empty).
Data lands in pinned host memory mapped for the controller's DMA; transfers over two pages
go through per-slot PRP lists.

Two submitters write the SQEs of io/nvme/spec.py, ring the doorbells, poll the CQ's phase
tags and ring the CQ head doorbell, and every result names which (``submitter``):
- ``gpu``: GPU threads, BaM's mechanism (io/gio/backends/nvme.py's agent warps, the engine's
  ``queue``, under the block benchmark of loops/block_device.py, as gpu-uring's; the GNN
  row fetch drives ``row_pairs`` pairs of a software controller of its own, an agent warp
  each). Reads land in GPU memory and are verified there; doorbells are rung straight from
  the GPU (``direct``: BAR0 registered with CUDA as I/O memory) or by one CPU thread per
  worker (``relay``), named in the result.
- ``cpu``: a CPU stand-in (``cpu-stand-in``) on the same queue pairs, for hosts without a
  GPU (the NVMe rig): the engine's channel (io/nvme/cpu_channel.py), so the block loop,
  the GNN row gather and any loop written over channels run on it unchanged.
A guardian process (io/nvme/guardian.py, started by io/nvme/pcie_vfio.Session) gives the
controller back if the process holding it dies.

With ``controller = "model"`` the controller is gpufio's software NVMe controller
(io/nvme/model.py) in a process of its own, serving the job's one target file as
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

import functools
import multiprocessing
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.checks import Check
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import (CHANNEL, HOST, QUEUE, Capability, Channel, ChannelSpec,
                                  DeviceQueue, File, QueueSpec)
from gpufio.core.rows import RowSupport, row_depth
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.facts.device import path_facts
from gpufio.io.gio.backends.nvme import model_memory, shared_memory
from gpufio.io.gio.bench import check_bench_job
from gpufio.io.nvme import drives, pcie_vfio, vfio
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme.cpu_channel import SUBMITTER, CpuChannel
from gpufio.io.nvme.session import Model, Shared, dma_bytes, slot_bytes

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.facts.system import Host

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
    from gpufio.io.nvme import model

    return functools.partial(model.serve, drive=o.drive_model,
                             namespaces=tuple(namespaces))


def lba_shift(o: Any) -> int:
    """log2 of the software controller's block size (``model_lba``, a power of two)."""
    return o.model_lba.bit_length() - 1


def row_pairs(o: Any, namespaces: int) -> int:
    """The queue pairs a GNN row fetch over ``namespaces`` drives: the option, else one per
    compiled poller thread (thread t serves the pairs whose CQ id c has (c - 1) % N == t:
    fewer pairs leave threads idle), at least one per namespace; 1 on the Python model,
    whose one loop serves every pair in turn (more would add agents, not service)."""
    if o.row_pairs is not None:
        return o.row_pairs
    from gpufio.io.nvme.model import MAX_QUEUES  # a default never asks past the controller's

    return min(max(o.controller_threads, namespaces), MAX_QUEUES) \
        if o.controller == "compiled" else 1


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
               "controller (io/nvme/model.py) in a process of its own, serving the job's one "
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
        Option("row_pairs", "int", None, "NVMe queue pairs the GNN row fetch drives (one GPU "
               "agent warp each, iodepth reads in flight on each). Default: one per compiled "
               "poller thread (controller_threads), at least one per namespace of a striped "
               "table; 1 on controller = \"model\", whose one loop serves every pair",
               minimum=1),
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
        """The CPU stand-in (io/nvme/cpu_channel.py) on a queue pair of the job's controller:
        the drive behind ``files``, or one the job starts, a namespace per file. The files
        come unopened or closed (Capability.descriptors: the block loop closes its targets,
        the gather opens none)."""
        o = cls.settings(job)
        opener = None
        if o.controller in EMULATED:  # gpufio starts the controller, a namespace per file
            if len(files) > 1 and o.controller not in SOFTWARE:
                raise BadInput(f"job '{job.name}': controller = \"{o.controller}\" serves "
                               f"one file; a table striped over {len(files)} files needs a "
                               "software controller (\"model\" or \"compiled\")")
            bdf = f"{o.controller} {files[0].path}"
            nsids = np.arange(1, len(files) + 1, dtype=np.uint32)
            opener = _emulated(job, files[0].path, spec.largest, spec.depth,
                               [f.path for f in files[1:]])
        else:
            bdf, nsids = _namespaces(job, files)
        return CpuChannel(spec, job=job.name, key=bdf, nsids=nsids, pairs=max(job.numjobs, 1),
                          opener=opener, facts={"mode": f"{SUBMITTER}{emulated(o)}",
                                                "controller": o.controller if opener else "real"})

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
        out = pcie_vfio.doctor_checks(host, cls.name, needed=bool(real))
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
            shift = lba_shift(o)
            model, pair = Model.acquire(files[0].path, shift, job.numjobs, spec.depth, job.bs,
                                        server(o))
            try:
                return _block_queue(job, spec, model, model_memory(model), pair, 1, shift,
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
        shared, pair = Shared.acquire(bdf, job.writes, job.numjobs, spec.depth + 1, opener)
        try:
            shared.check_transfer(job.name, job.bs)
            mem = shared_memory(shared, doorbells(o) == "direct")
            return _block_queue(job, spec, shared, mem, pair, int(nsids[0]),
                                int(shared.lba_shifts(nsids)[0]), shared.bdf)
        except BaseException:
            shared.release()
            raise


def _emulated(job: Job, path: str, largest: int, depth: int,
              namespaces: Sequence[str] = ()) -> Callable[[], Any]:
    """The session of the controller the job starts to serve ``path`` (EMULATED; a
    software one also ``namespaces`` as namespaces 2, 3 ...), sized for every worker's
    queue pair of ``depth`` commands, their slots of ``largest`` bytes and PRP lists."""
    from gpufio.io.nvme.emulated import EmulatedSession

    o = Bam.settings(job)
    dma = dma_bytes(job.numjobs, depth, largest)
    return lambda: EmulatedSession(o.controller, path, lba_shift(o), dma,
                                   server(o, namespaces))


def _block_queue(job: Job, spec: QueueSpec, owner: Any, mem: Any, pair: Any, nsid: int,
                 lba_shift: int, where: str) -> DeviceQueue:
    """A worker's NVMe queue agents on ``pair`` of ``owner``'s controller (a session.Model or
    a session.Shared, ``where`` for a failed Flush's message), which its ``close`` releases once no
    agent can touch the queues' memory."""
    from gpufio.io.gio.backends.nvme import NvmeQueues

    o = Bam.settings(job)
    with Shared.lock, Model.lock:  # the memory's allocators serve every worker
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
                               f"{nq.error_name(-res)}")

    return DeviceQueue(queues, o.stall_timeout, threads=spec.depth, final_notes=relay_notes,
                       sync=sync, close=close)


def _row_queue(job: Job, spec: QueueSpec) -> DeviceQueue:
    """GPU threads reading a feature table's rows through NVMe queue agents, as gpu-uring's
    do through io_uring rings: ``row_pairs`` queue pairs, an agent warp each. The files are
    served by a software controller of the queue's own (controller = "model" or
    "compiled"), a namespace each (a table striped over n drives: n namespaces, each at its
    drive model's rates): a real controller's namespace holds no feature file gpufio could
    lay out and find again."""
    from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel
    from gpufio.io.nvme import model

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
    n = row_pairs(o, layout.ntargets)
    if n > model.MAX_QUEUES:  # the compiled controller's MAX_QUEUES too
        raise BadInput(f"job '{job.name}': row_pairs {n}: the software controller offers "
                       f"at most {model.MAX_QUEUES} I/O queue pairs")
    depth = row_depth(spec.rows, n)
    bells = doorbells(o)
    # the result's engine_mode: who submitted, the doorbells, the controller
    mode = f"gpu, {bells} doorbells, {o.controller} controller{emulated(o)}"
    facts: dict[str, Any] = {"iodepth": depth, "queue_pairs": n, "submitter": "gpu",
                             "doorbells": bells, "controller": o.controller, "mode": mode}
    if o.drive_model:
        facts["drive"] = drives.describe(drives.model(o.drive_model))
    row = slot_bytes(layout.row_bytes)
    served, pairs = _row_controller(o, paths, n, depth, row)
    held: list[Any] = []  # what close releases, last made first

    def close() -> None:
        try:
            for thing in reversed(held):
                thing.close()
        finally:
            served.close()

    try:
        held.append(RegisteredModel(served.mem))
        held.append(NvmeQueues(held[0], pairs, depth=depth, slot_bytes=row, nsid=1,
                               lba_shift=lba_shift(o), mode=bells,
                               namespaces=layout.ntargets))
    except BaseException:
        close()
        raise
    return DeviceQueue(held[1], o.stall_timeout, threads=n * depth, facts=facts, mode=mode,
                       final_notes=_pollers_busy(o, served, n),
                       drive_reads=_drive_reads(o, served, layout.ntargets), close=close)


def _pollers_busy(o: Any, served: Any, pairs: int) -> Callable[[], dict[str, Any]] | None:
    """The compiled controller's measure of itself for a row fetch's facts, read before it
    stops: the ns its poller threads spent on work since now (not on the admin commands
    that made the pairs) and how many serve one of ``pairs`` (thread t the pairs whose CQ
    id c has (c - 1) % N == t); None on the Python model."""
    if o.controller != "compiled":
        return None
    from gpufio.io.nvme import compiled

    threads, before = min(o.controller_threads, pairs), compiled.busy_ns(served.mem)
    return lambda: {"controller_busy_ns": compiled.busy_ns(served.mem) - before,
                    "controller_threads": threads}


def _drive_reads(o: Any, served: Any, drives: int) -> Callable[[], list[int]] | None:
    """The commands each of the ``drives`` drive models of the compiled controller admitted
    so far (a GPU cache's hits never reach one); None without drive models or on the
    Python model, which counts none."""
    if o.controller != "compiled" or not o.drive_model:
        return None
    from gpufio.io.nvme import compiled

    return lambda: compiled.admitted(served.mem, drives)


def _row_controller(o: Any, paths: Sequence[str], n: int, depth: int,
                    row: int) -> tuple[Any, list[Any]]:
    """(the software controller a row fetch starts, its ``n`` I/O queue pairs): the table's
    files served a namespace each (a table striped over n files: a drive each), its memory
    sized for the pairs' ``depth`` commands with landing slots of ``row`` bytes; ``close``
    on the first stops it."""
    from gpufio.io.nvme import model

    served = model.ServedFile(paths[0], lba_shift(o), dma_bytes(n, depth, row),
                              server(o, paths[1:]))
    try:
        return served, served.host.create_pairs(n, depth + 1)  # a ring keeps one slot empty
    except BaseException:
        served.close()
        raise
