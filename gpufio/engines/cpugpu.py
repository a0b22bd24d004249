"""cpu-gpu: the strongest CPU-driven path between storage and GPU memory (gdsio -x 2/3, done
properly).

Reads go through io_uring (real queue depth, O_DIRECT) into page-locked host memory; each
segment of slots, once all its reads are in, is copied to GPU memory in one asynchronous
transfer on its own CUDA stream, so many small reads share a copy and the next segments'
reads overlap the copies. There are twice as many landing segments as the ``iodepth`` reads
in flight need: a segment still waiting for its slowest read, or for its copy, does not
hold back new reads (with exactly iodepth slots one slow read stalled the rest). An I/O
is complete when its
bytes are in GPU memory: its latency runs from issue until its segment's copy event is
observed done. fio's and elbencho's GPU paths copy synchronously from pageable memory, one
I/O at a time; this does not. Writes run the other way: a segment's blocks are generated in
GPU memory (the pattern of their offsets), copied down to its pinned slots in one transfer,
and written from there by io_uring, while the next segments copy; a write's latency runs from
the start of its segment's copy until the write completes.

This module is the engine: its options and its channel (io_uring into host memory,
io/uring_channel). The segment loop is loops/block_staged's, written over any channel whose buffers
are host memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, ChannelSpec, File
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import uring
from gpufio.io.staging import SEGMENTS, SPARE, segment_shape
from gpufio.io.uring_channel import UringChannel

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.facts.system import Host


@register
class CpuGpu(Engine):
    """io_uring into registered host memory, then batched asynchronous H2D copies."""

    name = "cpu-gpu"
    summary = "io_uring into pinned host buffers, then batched asynchronous H2D copies"
    peer = "gdsio -x 2/3, fio libcufile cuda_io=posix (synchronous, pageable)"
    fio_engines = {"libcufile:posix": "cuda_io=posix runs as cpu-gpu: gpufio's path is "
                   "asynchronous io_uring into pinned memory with overlapped copies, fio's is "
                   "synchronous and pageable"}
    uses_gpu = True
    worker_kind = "thread"
    options = (
        SEGMENTS,
        Option("sqe_async", "bool", None, "set IOSQE_ASYNC: the kernel's io-wq workers run the "
               "reads in parallel instead of the submitting thread one after another "
               "(default: off, but on for GNN rows of tables that live in memory)"),
        PROCESSES,
    )

    capability = Capability(memory=(HOST,))

    @classmethod
    def host_unavailable(cls) -> str | None:
        """Rows into host memory (device = "cpu") go through io_uring, with no GPU."""
        facts = uring.probe()
        return None if facts["available"] else facts["reason"]

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        """Workers in processes each hold a CUDA context: without MPS they time-slice."""
        spawned = [j.name for j in jobs if cls.settings(j).processes]
        if not spawned:
            return []
        pipes = host.env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        running = host.path(pipes).joinpath("control").exists()
        return [verdict("cpu-gpu", "MPS daemon", running,
                        f"{'running' if running else 'not running'} ({pipes}); processes = true "
                        f"in {', '.join(spawned)}",
                        "start it (nvidia-cuda-mps-control -d) so the workers' contexts share "
                        "the GPU")]

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        nseg, per_segment = segment_shape(cls.settings(job).segments, job.iodepth)
        return {**super().describe(job), "gpus": list(job.gpu_list), "lands_in": "gpu memory",
                "segments": nseg, "landing_slots": SPARE * nseg * per_segment}

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.iodepth is not None:  # None: the rows' depth is picked when they are fetched
            uring.sq_entries(job.iodepth, 0, f"job '{job.name}': ")
        if job.mixed:
            raise BadInput(f"job '{job.name}': cpu-gpu moves a segment one way at a time; "
                           f"rw = {job.rw} (a mix) is not supported by this engine")

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> UringChannel:
        """io_uring into host memory; with sqe_async the kernel's io-wq workers run the
        requests. The block loop above (loops/block_staged) lands them in GPU memory."""
        given = cls.settings(job).sqe_async
        # with no sqe_async given, reads of files that live in memory go to io-wq (RAM-backed
        # rows gather faster so); a drive's reads stay inline
        sqe_async = spec.ram_backed if given is None else given
        ch = UringChannel(files, spec, uring.SQE_ASYNC if sqe_async else 0)
        ch.facts["sqe_async"] = sqe_async
        return ch

