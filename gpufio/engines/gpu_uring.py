"""gpu-uring: GPU threads issue the reads themselves, through io_uring on a stock kernel.

BaM's idea without BaM's kernel module: requester threads on the GPU pick their own offsets
and post requests into device memory; one agent warp per ring turns them into SQEs in rings
that live in CUDA-registered host memory; the kernel's SQPOLL threads execute them; the
agents hand the completions back; the requesting warps copy the landed blocks into GPU
memory and bin their latencies on the GPU. No CPU user code runs per I/O: the host thread
only sets flags, wakes SQPOLL threads that fell asleep, reads live counters every 100 ms,
and stops the kernels with a diagnostic when completions stop (the watchdog). The engine
makes the queue (``queue``); the loops that drive it, the block benchmark and the row
gather, are in gpufio/loops. The kernels are in kernels/gio_agent.cu and gio_bench.cu; the
ring plumbing in gpufio/io/gio/backends/rings.py.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import DeviceQueue, File, QueueSpec
from gpufio.core.rows import RowRequest, RowSupport, RowTable, close_all, open_rows, row_depth
from gpufio.engines import register
from gpufio.engines.base import NOP_OP, Engine, check_nop, nop_facts
from gpufio.io import gpu, uring
from gpufio.io.nvme import passthru
from gpufio.io.gio.backends.rings import default_rings, ring_sizes
from gpufio.io.gio.backends.uring import default_sq_threads, make_queue, namespace_table
from gpufio.io.gio.bench import check_bench_job

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.facts.system import Host



@register
class GpuUring(Engine):
    """GPU requester threads and agent warps driving SQPOLL rings in registered host memory."""

    name = "gpu-uring"
    rows = RowSupport(gpu_only=True, cache=True, dim_multiple=4)
    summary = ("GPU threads issue the reads: agent warps write io_uring SQEs into rings in "
               "CUDA-registered host memory, SQPOLL kernel threads run them, no CPU code per I/O")
    peer = "BaM (needs its own kernel module and an unbound NVMe drive)"
    iodepth_means = "request slots per ring: rings x iodepth reads in flight per worker"
    uses_gpu = True
    paced = False  # GPU threads post the reads: no host loop to space them
    worker_kind = "thread"
    options = (
        Option("rings", "int", None, "io_uring rings, one SQPOLL kernel thread each (default: "
               "half the cores, at most 8, at least one per target)", minimum=1),
        Option("ring_entries", "int", None, "SQ entries per ring (default: iodepth); iodepth "
               "may not exceed it, the CQ gets twice as many", minimum=1),
        Option("threads", "int", None, "GPU requester threads (default: rings x iodepth, one "
               "per request slot); more than that share the slots", minimum=1),
        Option("sq_threads", "int", None, "SQPOLL kernel threads serving the rings (default: "
               "one per ring on RAM-backed targets, one per target on drives); ring i shares "
               "ring i % sq_threads's thread and io-wq (IORING_SETUP_ATTACH_WQ)", minimum=1),
        Option("sq_thread_cpu", "intlist", (), "CPUs the SQPOLL threads are pinned to, "
               "round-robin (default: not pinned)"),
        Option("sq_thread_idle", "time", 1_000_000_000, "how long an SQPOLL thread spins before "
               "it sleeps (the host wakes it)", minimum=1_000_000),
        Option("sqe_async", "bool", False, "set IOSQE_ASYNC: always hand reads to the kernel's "
               "io-wq workers, several per ring, instead of letting the SQPOLL thread issue them "
               "(it hands reads the file cannot do without blocking to one io-wq worker per ring); "
               "on RAM-backed targets it costs IOPS"),
        Option("registered", "bool", None, "register the targets and each ring's landing slots "
               "with io_uring (fixed files, READ_FIXED), as fio's registerfiles and fixedbufs "
               "(default: when sqe_async is off, where it helps)"),
        Option("land", "str", "gpu", "where a read's bytes end: 'gpu' (copied into GPU memory) "
               "or 'host' (left in the pinned host slots, for comparison)",
               choices=("gpu", "host")),
        Option("stall_timeout", "time", 10_000_000_000, "stop the kernels and fail when no read "
               "completes for this long", minimum=1_000_000),
        Option("passthrough", "bool", False, "the agents write each request as the NVMe "
               "command itself (IORING_OP_URING_CMD in 128-byte SQEs) to the targets' generic "
               "char devices /dev/ngXnY, past the block layer: the targets must be NVMe "
               "namespaces, bs a multiple of their logical block size"),
        NOP_OP,
    )

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return bool(cls.settings(job).passthrough)

    @classmethod
    def resolve(cls, job: Job) -> Any:
        """The rings, requester threads, SQPOLL threads and registration the job leaves to
        the engine, from this host's cores and the job's targets (threads stays None where
        the workload's engine picks its own depth: GNN rows, row_depth)."""
        o = job.engine_settings
        if o.rings and o.sq_threads and o.sq_threads > o.rings:
            raise BadInput(f"job '{job.name}': sq_threads ({o.sq_threads}) exceeds rings "
                           f"({o.rings}): each SQPOLL thread serves at least one ring")
        rings = o.rings or default_rings(max(len(job.targets), 1), os.cpu_count() or 1)
        threads = o.threads or (rings * job.iodepth if job.iodepth else None)
        return replace(o, rings=rings, threads=threads,
                       sq_threads=min(o.sq_threads or default_sq_threads(job, rings), rings),
                       registered=not o.sqe_async if o.registered is None else o.registered)

    @classmethod
    def unavailable(cls) -> str | None:
        facts = uring.probe()
        if not facts["available"]:
            return facts["reason"]
        for need in ("sqpoll", "no_mmap", "no_sqarray"):  # rings the GPU can drive
            if not facts.get(need):
                return facts.get(f"{need}_reason", f"io_uring lacks {need}")
        return super().unavailable()

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        """What GPU-initiated io_uring needs of the kernel, the CPUs and the environment."""
        area = "gpu-uring"
        disabled = host.io_uring_disabled()
        out = [Check(area, "io_uring enabled", {None: "ok", 0: "ok", 1: "warn"}.get(disabled, "fail"),
                     f"kernel.io_uring_disabled={disabled}" if disabled is not None
                     else "no io_uring_disabled sysctl",
                     "" if not disabled else "sysctl kernel.io_uring_disabled=0 (1 allows only "
                     "root and the io_uring_group)"),
               verdict(area, "kernel >= 6.6", host.kernel_version() >= (6, 6),
                       host.kernel_release(), "SQPOLL rings in user memory without an SQ array "
                       "(IORING_SETUP_NO_MMAP, NO_SQARRAY) need Linux 6.6", bad="fail")]
        cpus = host.cpus()
        for job in jobs:
            threads = cls.settings(job).sq_threads
            out.append(verdict(area, f"cores for job '{job.name}'", threads + 2 <= cpus,
                               f"{threads} SQPOLL threads on {cpus} CPUs",
                               "each ring's SQPOLL thread spins on a core: leave two for the "
                               "rest (fewer rings, or sq_threads)"))
        why = gpu.serialising_reason(host.env)
        out.append(verdict(area, "kernels run together", why is None, why or "nothing serialises "
                           "kernels", why or "", bad="fail"))
        lazy = gpu.module_loading_warning(host.env)
        out.append(verdict(area, "CUDA module loading", lazy is None,
                           host.env.get("CUDA_MODULE_LOADING", "default"), lazy or ""))
        if any(cls.settings(j).passthrough for j in jobs):
            out += passthru.passthrough_checks(host, f"{area} passthrough")
        return out

    @classmethod
    def check_job(cls, job: Job) -> None:
        check_bench_job(job, cls.name)
        o = cls.settings(job)
        check_nop(job, o.op)
        if o.passthrough and o.op == "nop":
            raise BadInput(f"job '{job.name}': passthrough sends NVMe commands; op = \"nop\" "
                           "sends none (choose one)")
        if job.iodepth is not None:  # None: the rows' depth is picked when they are fetched
            ring_sizes(job.iodepth, o.ring_entries, f"job '{job.name}': ")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        return {**super().describe(job), "gpus": list(job.gpu_list),
                "lands_in": ("nothing: NOPs" if o.op == "nop" else
                             "written from the slots, the pattern generated there by GPU threads"
                             if job.writes else "gpu memory" if o.land == "gpu"
                             else "pinned host memory"), **nop_facts(o.op),
                "rings": o.rings, "iodepth_per_ring": job.iodepth,
                "requester_threads": o.threads, "sq_threads": o.sq_threads,
                "sqe_async": o.sqe_async, "registered": o.registered or o.passthrough,
                "passthrough": o.passthrough,
                **({"warning": w} if (w := gpu.module_loading_warning()) else {})}

    @classmethod
    def queue(cls, job: Job, files: Sequence[File], spec: QueueSpec) -> DeviceQueue:
        """io_uring rings the GPU's agent warps drive (io/gio/backends/uring.UringQueue)
        over ``files``: for a worker's block job as its settings say (NOPs, passthrough to
        the namespaces); for the GNN rows with the engine's own defaults otherwise (inline,
        registered: on tmpfs they gathered faster than io-wq did)."""
        o = cls.settings(job)
        if spec.table is not None and spec.rows is not None:
            return _row_queue(o, spec.table, spec.rows, spec.slot_bytes)
        nop = o.op == "nop"
        q = make_queue(o, depth=spec.depth, slot_bytes=spec.slot_bytes,
                       fds=[f.fd for f in files], nop=nop,
                       namespaces=namespace_table(files) if o.passthrough else None)
        share = uring.SqThreadShare(q.rings.rings)
        return DeviceQueue(q, o.stall_timeout, threads=o.threads, land_gpu=o.land == "gpu",
                           nop=nop, begin=share.begin, notes=share.facts, close=q.close)


def _row_queue(o: Any, table: RowTable, request: RowRequest, row_bytes: int) -> DeviceQueue:
    """io_uring rings over the feature table's files (opened here, closed with the queue)
    for the GNN rows' gather on the GPU."""
    depth = row_depth(request, o.rings)
    fds = open_rows(table, request.direct)
    try:
        q = make_queue(o, depth=depth, slot_bytes=row_bytes, fds=fds)
    except BaseException:
        close_all(fds)
        raise

    def close() -> None:
        try:
            q.close()
        finally:
            close_all(fds)

    return DeviceQueue(q, o.stall_timeout, threads=o.rings * depth, close=close,
                       facts={"iodepth": depth, "rings": o.rings, "sqe_async": o.sqe_async})
