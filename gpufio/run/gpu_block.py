"""Which GPU-memory block loop a worker runs for an engine that has no loop of its own:
the engine's channel capability decides (core/requests), never its name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufio.core.requests import GPU, HOST
from gpufio.run.gpu_slots import GpuSlotLoop
from gpufio.run.staged import StagedLoop

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.engines.base import Engine


def loop_class(engine: type["Engine"]) -> type | None:
    """The block loop for ``engine``'s block jobs, which land in GPU memory: over a channel
    into GPU memory, its slots are GPU memory; over one into host memory, its requests are
    staged through pinned segments. None for engines whose jobs stay in host memory, and
    for channels a CPU thread does not submit or that move no data."""
    cap = engine.capability
    if cap is None or not engine.uses_gpu or cap.submitter != "cpu" or not cap.moves_data:
        return None
    if GPU in cap.memory:
        return GpuSlotLoop
    return StagedLoop if HOST in cap.memory else None


def gpu_block_loop(engine: type["Engine"], job: "Job", targets: list["Target"],
                   ctx: "WorkerContext") -> Any:
    """One worker's block loop over ``engine``'s channel (set up now, before the clock:
    ``run()``, then ``close()``), or None where no GPU-memory loop fits it."""
    cls = loop_class(engine)
    return None if cls is None else cls(engine, job, targets, ctx)
