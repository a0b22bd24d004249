"""uring: io_uring submitted by the CPU on host memory, with real queue depth (fio io_uring).

One ring per worker thread keeps ``iodepth`` reads (or writes, WRITE / WRITE_FIXED) in
flight: the engine's channel (io/uring_channel.py), set up as the job's keys say and as fio
sets up its own ring (SINGLE_ISSUER|DEFER_TASKRUN where the kernel has them). The block loop
(loops/block_host.py) drives it: compiled where it can (io/loops.py: one call per batch of
offsets; as fio, ``iodepth_batch_submit`` I/Os per io_uring_enter, one by default; a
latency is fio's lat, from the I/O's taking into its slot, its wait for the submitting call
included, to just after the reaping call), else in Python with numpy batch operations, so
Python cost is per batch, not per I/O. A poll of the job's stop eventfd stays in flight, so
a stop wakes any wait. The result's ``slat_mean_ns`` is fio's slat (fio's clat is the
latency less it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, ChannelSpec, File
from gpufio.engines import register
from gpufio.engines.base import NOP_OP, Engine, check_nop, loop_facts, nop_facts
from gpufio.facts.device import poll_refusal
from gpufio.io import uring
from gpufio.io.uring_channel import RingOptions, UringChannel

if TYPE_CHECKING:
    from gpufio.core.job import Job


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
        Option("iodepth_batch_submit", "int", 1,
               "the most I/Os one io_uring_enter of the compiled loop submits, as fio's "
               "(0: every free slot's at once, fewer calls; 1: each I/O its own call, and "
               "what completed reaped once all are in, instead of sleeping for each "
               "completion)",
               minimum=0),
        Option("wait_spin", "time", 3_000,
               "compiled loop: before a wait sleeps, look this long for a completion "
               "(IORING_SQ_TASKRUN), so one a moment away costs no wake-up; looks that find "
               "none come ever more rarely; a worker allowed one CPU does not look (0: sleep "
               "at once, as fio)", minimum=0),
        Option("defer_taskrun", "bool", True,
               "IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN, as fio (ignored with sqpoll)"),
        NOP_OP,
    )

    capability = Capability(memory=(HOST,))

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> UringChannel:
        """The ring the job's settings ask for (SQPOLL, IOPOLL, registered files and
        buffers, NOPs), refused in one line where this host or a target cannot give it."""
        o = cls.settings(job)
        if o.sqpoll and not uring.probe().get("sqpoll"):
            raise BadInput(uring.probe().get("sqpoll_reason", "SQPOLL is not available"))
        for f in files if o.hipri else ():
            why = poll_refusal(f.path)
            if why:
                raise BadInput(f"key 'hipri': {f.path} cannot be polled: {why}")
        return UringChannel(files, spec, options=RingOptions(
            entries=o.ring_entries, sqpoll=o.sqpoll,
            sq_thread_idle_ms=max(o.sq_thread_idle // 1_000_000, 1),
            single_issuer=o.defer_taskrun, iopoll=o.hipri, registerfiles=o.registerfiles,
            fixedbufs=o.fixedbufs, nop=o.op == "nop", batch_submit=o.iodepth_batch_submit,
            spin_ns=o.wait_spin))

    @classmethod
    def unavailable(cls) -> str | None:
        facts = uring.probe()
        return None if facts["available"] else facts["reason"]

    @classmethod
    def check_job(cls, job: Job) -> None:
        o = cls.settings(job)
        if job.iodepth is not None:  # None: the rows' depth is picked when they are fetched
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
                "defer_taskrun": o.defer_taskrun, "iodepth_batch_submit": o.iodepth_batch_submit,
                "wait_spin": o.wait_spin,
                **nop_facts(o.op), **loop_facts(job)}

