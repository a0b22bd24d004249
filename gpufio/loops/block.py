"""Which block loop moves a worker's data: chosen from the engine's primitive for the job
(core/requests CHANNEL or QUEUE) and the memory its data lands in, never from the engine's
name.

- a channel into host memory (a CPU path): block_host (compiled over io/loops.c where the
  channel and the job allow, block_compiled);
- a channel of GPU buffers, for a GPU path: block_gpu_slots;
- a channel of host buffers, for a GPU path: block_staged (pinned segments, copied);
- a request queue GPU threads submit to: block_device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufio.core.requests import CHANNEL, GPU, HOST, QUEUE

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.engines.base import Engine


def loop_class(engine: type["Engine"], job: "Job") -> type | None:
    """The block loop for ``engine``'s block ``job`` (whose primitive the engine says, for
    one with both); None where none fits: a channel that moves no data into GPU memory,
    or no primitive."""
    primitive = engine.primitive(job)
    if primitive == QUEUE:
        from gpufio.loops.block_device import DeviceBlockLoop  # the GPU plumbing: where used

        return DeviceBlockLoop
    cap = engine.capability
    if primitive != CHANNEL or cap is None:
        return None
    if not engine.uses_gpu:
        from gpufio.loops.block_host import BlockLoop

        return BlockLoop
    if not cap.moves_data:
        return None
    if GPU in cap.memory:
        from gpufio.loops.block_gpu_slots import GpuSlotLoop

        return GpuSlotLoop
    if HOST in cap.memory:
        from gpufio.loops.block_staged import StagedLoop

        return StagedLoop
    return None


def block_loop(engine: type["Engine"], job: "Job", targets: list["Target"],
               ctx: "WorkerContext") -> Any:
    """One worker's block loop over ``engine``'s primitive, set up now, before the clock
    (``run()``, then ``close()``); RuntimeError where none fits."""
    cls = loop_class(engine, job)
    if cls is None:
        raise RuntimeError(f"engine '{engine.name}' offers no primitive a block loop fits")
    return cls(engine, job, targets, ctx)
