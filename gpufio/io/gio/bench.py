"""What the GPU's requester threads of every GPU-initiated engine occupy and can do: the
block size of their kernels (TPB), the GPU they take (gpu_price) and the jobs they refuse
(check_bench_job). The loops that launch them are in gpufio/loops (block_device, rows_device).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufio.core.job import Job

TPB = 128


def gpu_price(rings: int, requesters: int, sms: int) -> dict[str, int]:
    """What the mechanism occupies of the GPU while it runs: one agent warp (a block of its
    own) per ring and the requester threads in blocks of TPB, each block on one SM; the
    persistent kernels hold them for the whole job. ``sms_occupied``: at most one SM per block."""
    blocks = -(-requesters // TPB)
    return {"agent_warps": rings, "requester_threads": requesters,
            "requester_warps": -(-requesters // 32), "blocks": rings + blocks, "sms": sms,
            "sms_occupied": min(rings + blocks, sms)}


def check_bench_job(job: "Job", engine: str) -> None:
    """BadInput for what the benchmark's GPU threads cannot do (``engine`` names the path):
    a read-write mix, an fsync among writes the host does not order, offsets from an iolog
    or from any distribution but uniform."""
    from gpufio.core.errors import BadInput

    if job.mixed:
        raise BadInput(f"job '{job.name}': {engine}'s GPU threads either read or write; "
                       f"rw = {job.rw} (a mix) is not supported by this engine")
    if job.fsync or job.fdatasync:
        raise BadInput(f"job '{job.name}': {engine}'s writes are posted by GPU threads, "
                       "which the host does not order an fsync among; use end_fsync")
    if job.read_iolog:
        raise BadInput(f"job '{job.name}': {engine}'s GPU threads pick their own offsets; "
                       "replaying an iolog (read_iolog) is not supported by this engine")
    if job.random_distribution.kind != "random":
        raise BadInput(f"job '{job.name}': {engine} draws offsets on the GPU, uniformly; "
                       f"random_distribution '{job.random_distribution.kind}' is not "
                       "supported by this engine")
