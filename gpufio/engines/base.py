"""The one interface every data path implements.

As in fio, an engine is one module that fills in a small table of operations and registers
itself by name; the runner never names an engine. Construction does all setup (rings,
buffers, kernel compilation) and happens before the clock starts; ``run`` only moves data.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from gpufio.core.checks import Check
from gpufio.core.options import Option, settings_class
from gpufio.core.requests import Capability, Channel, ChannelSpec, File
from gpufio.core.rows import RowRequest, RowSupport, RowTable
from gpufio.core.tensors import Extent, Mover, TensorRequest, TensorSupport

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host


def label(engine: str, facts: dict[str, Any]) -> str:
    """How tables name a job's data path: the engine, the API it drives where it has a choice,
    and its mode where it has one (a cuFile run in compat mode must never pass for GPUDirect
    Storage)."""
    name = f"{engine} {facts['api']}" if facts.get("api") else engine
    mode = facts.get("mode")
    return f"{name} ({mode})" if mode else name


# For engines whose workers hold a CUDA context (threads by default): the same workers as
# spawned processes, so numjobs workers stop sharing the interpreter lock.
PROCESSES = Option("processes", "bool", False, "run each worker in a spawned process with its "
                   "own CUDA context, so numjobs workers do not share the interpreter lock")


# For engines that can post IORING_OP_NOP through their own rings and loop: the request rate
# of the submission mechanism itself, with no storage and no copy.
NOP_OP = Option("op", "str", "io", "'io': read or write the targets; 'nop': IORING_OP_NOP "
                "through the same rings and loop, touching no storage (the submission path's "
                "own ceiling; each NOP counts as one block)", choices=("io", "nop"))


def check_nop(job: "Job", op: str) -> None:
    """A NOP job moves no data: refuse the settings that need data (BadInput)."""
    from gpufio.core.errors import BadInput

    if op == "nop" and (job.writes or job.verify):
        raise BadInput(f"job '{job.name}': op = \"nop\" moves no data, so it neither "
                       f"writes nor verifies (rw = {job.rw}, verify = {str(job.verify).lower()})")


# the most I/Os one call of a compiled loop is handed; and the largest write block it fills
# itself (larger writes keep the Python loop, whose fill runs on several threads)
COMPILED_BATCH = 4096
COMPILED_WRITE_BS = 128 << 10


def compiled_loop(job: "Job") -> bool:
    """Whether the job's I/Os go through the compiled loops (io/loops.py) instead of the
    engine's Python loop: where they are built, for jobs that neither verify as they read
    nor sync every N writes (both stay in Python), and whose writes are small enough to fill
    on the loop's own thread. A rate-capped job stays in Python too: its loop reaps while no
    I/O is due, where the compiled one would wait for the cap with I/Os in flight."""
    from gpufio.io import loops

    return (not (job.verify and job.reads) and not (job.fsync or job.fdatasync)
            and not job.workload_options.get("rate_iops")
            and (not job.writes or job.bs <= COMPILED_WRITE_BS) and loops.available())


def loop_facts(job: "Job") -> dict[str, Any]:
    """What a job's result says of the loop that issued its I/Os."""
    return {"loop": "compiled" if compiled_loop(job) else "python"}


def run_compiled(ctx: "WorkerContext", loop: Any, on_batch: Any = None,
                 state: Any = None, stall_ns: int | None = None) -> None:
    """Hand ``loop`` (io/loops.NativeLoop) the context's batches until it hands out no more,
    record every completion, then wait for what is still in flight; ``on_batch()`` after
    each call. A loop that stopped waiting without a completion (after the stop) feeds the
    watchdog, which ends a job whose I/Os never complete; ``state(inflight)`` says where
    the path stood, for that diagnostic (after ``stall_ns``, io/watchdog's limit unless
    given)."""
    import time

    from gpufio.io.loops import CALL_NS
    from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog

    clock = time.perf_counter_ns
    stall_ns = STALL_LIMIT_NS if stall_ns is None else stall_ns
    dog, completed = Watchdog(stall_ns, clock()), 0
    tgt, offs = ctx.next_batch(COMPILED_BATCH)
    writes = ctx.last_writes()
    mixed = isinstance(writes, np.ndarray)
    draining = len(offs) == 0
    while True:
        used, k = loop.run(tgt, offs, writes if mixed else None, clock() + CALL_NS)
        if k:
            completed += k
            ctx.complete(loop.lat[:k], loop.tgt[:k], loop.res[:k],
                         loop.write[:k].view(bool) if mixed else writes)
        if on_batch is not None:
            on_batch()
        if loop.timed_out and dog.update(completed, clock()):
            where = f": {state(loop.inflight)}" if state is not None else ""
            raise Stalled(f"{loop.inflight} I/Os in flight and none completed for "
                          f"{stall_ns / 1e9:g} s{where}")
        if draining:
            if loop.inflight == 0:
                return
            continue
        tgt, offs = tgt[used:], offs[used:]
        if mixed:
            writes = writes[used:]
        if len(offs) == 0 or loop.stopped or ctx.done:
            tgt, offs = ctx.next_batch(COMPILED_BATCH)
            writes = ctx.last_writes()
            mixed = isinstance(writes, np.ndarray)
            draining = len(offs) == 0


def nop_facts(op: str) -> dict[str, Any]:
    """What a job's result says of its op."""
    return {"op": op, **({"storage": "none: NOPs"} if op == "nop" else {})}


class Engine(ABC):
    """A data path. One instance per worker thread of a job."""

    name: ClassVar[str]
    summary: ClassVar[str]
    peer: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    uses_gpu: ClassVar[bool] = False
    # what the profile's iodepth means for this path (shown by 'gpufio engines')
    iodepth_means: ClassVar[str] = "I/Os in flight per worker"
    # what the engine's row fetcher offers (None: it fetches no rows for workloads)
    rows: ClassVar[RowSupport | None] = None
    # where the engine's tensor mover finds shards (None: it saves and restores no tensors)
    tensors: ClassVar[TensorSupport | None] = None
    # what the engine's channel (the one I/O primitive, core/requests) can do; None: it
    # opens no channel (its loop runs on the device only)
    capability: ClassVar[Capability | None] = None
    # fio's names for this path, for job files: "ioengine" or "ioengine:cuda_io", each with
    # the note a user reads when it maps to gpufio's engine ("" when it is the same path)
    fio_engines: ClassVar[dict[str, str]] = {}
    # this engine's options as a typed, frozen dataclass (settings_class of ``options``)
    Settings: ClassVar[type]
    # "process": each worker is a forked process, so Python time per batch scales with
    # numjobs as fio's job processes do; "thread" for engines holding a CUDA context.
    worker_kind: ClassVar[str] = "process"
    # whether its workers make end_fsync's sync themselves (an NVMe Flush of a controller
    # taken from its driver, which leaves no file to fsync): the runner then syncs nothing
    flushes_itself: ClassVar[bool] = False
    # whether its workers take their I/Os from ctx.next_batch, so a rate cap (rate_iops)
    # holds; False for engines whose loop runs on the device
    paced: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.Settings = settings_class(f"{cls.__name__}Settings", cls.options)

    @classmethod
    def settings(cls, job: "Job") -> Any:
        """The job's options of this engine, typed (``settings(job).sqpoll``)."""
        return cls.Settings(**job.engine_options)

    @classmethod
    def worker_kind_for(cls, job: "Job") -> str:
        """How this job's workers run: "process" (forked), "thread", or "spawn" (a fresh
        process, for engines that hold a CUDA context and must not share the interpreter):
        the class's kind, or "spawn" when it offers PROCESSES and the job sets it."""
        if PROCESSES in cls.options and cls.settings(job).processes:
            return "spawn"
        return cls.worker_kind

    @classmethod
    def generic_targets(cls, job: "Job") -> bool:
        """True when this job sends NVMe commands: its targets must be NVMe namespaces, and
        each is opened at its generic char device (core/targets.open_namespace)."""
        return False

    @classmethod
    def channel(cls, job: "Job", files: Sequence[File], spec: ChannelSpec) -> Channel:
        """The engine's one I/O primitive over ``files`` (opened by the caller, who closes
        them): a Channel moving batches of (file, offset, length, buffer, op) requests as
        ``spec`` asks. Engines with ``capability`` set implement it."""
        raise NotImplementedError(f"engine '{cls.name}' opens no channel")

    @classmethod
    def row_fetcher(cls, job: "Job", table: RowTable, xp: Any, request: RowRequest) -> Any:
        """This path's row fetcher for a workload: ``fetch(rows)`` returns the rows, in
        order, as an ``xp`` array of ``request.dim`` float32 columns (in GPU memory for CuPy),
        ``rows`` counts the rows fetched, ``facts`` says how (for the result), ``close()``.
        Engines with ``rows`` set implement it."""
        raise NotImplementedError(f"engine '{cls.name}' fetches no rows")

    @classmethod
    def tensor_mover(cls, job: "Job", files: list["Target"], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> Mover:
        """This path's tensor mover for a workload (core/tensors.Mover): it saves shards
        (``xp`` arrays: NumPy in host memory, CuPy in GPU memory) to their ``extents`` of the
        opened ``files`` and restores them. Engines with ``tensors`` set implement it."""
        raise NotImplementedError(f"engine '{cls.name}' moves no tensors")

    @classmethod
    def guardian(cls, job: "Job", targets: list["Target"]) -> list[str] | None:
        """The command of a process that must outlive this job's runner (the runner starts
        it before the workers, closes its standard input when the job is over, and the
        kernel closes it when the runner dies): an engine that takes a device from its
        kernel driver gives it back there. None: no such process."""
        return None

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this engine cannot run on this host, or None if it can."""
        if cls.uses_gpu:
            from gpufio.io.gpu import probe

            return probe()[1]
        return None

    @classmethod
    def host_memory(cls) -> tuple[str, ...]:
        """What this path moves in host memory, with no GPU: 'block' (the block jobs of a
        CPU path), 'rows' and 'tensors' (the workloads' jobs with device = "cpu")."""
        what = () if cls.uses_gpu else ("block",)
        if cls.rows is not None and not cls.rows.gpu_only:
            what += ("rows",)
        if cls.tensors is not None and cls.tensors.host:
            what += ("tensors",)
        return what

    @classmethod
    def gpu_memory(cls) -> tuple[str, ...]:
        """What this path moves into or out of GPU memory: its block jobs, rows, tensors."""
        if not cls.uses_gpu:
            return ()
        what: tuple[str, ...] = ("block",)
        if cls.rows is not None:
            what += ("rows",)
        if cls.tensors is not None and cls.tensors.gpu:
            what += ("tensors",)
        return what

    @classmethod
    def host_unavailable(cls) -> str | None:
        """Why this path cannot move host memory here (``host_memory``), or None if it can:
        a GPU path's host side needs no GPU."""
        return None if cls.uses_gpu else cls.unavailable()

    @classmethod
    def doctor(cls, host: "Host", jobs: list["Job"]) -> list[Check]:
        """What ``gpufio doctor`` checks for this path on ``host`` (readings under a root
        directory), for ``jobs`` of this engine (none: the path in general)."""
        return []

    @classmethod
    def status(cls) -> str:
        """One line for 'gpufio info': why it cannot run here, or how it would run."""
        return cls.unavailable() or "available"

    @classmethod
    def check_job(cls, job: "Job") -> None:
        """Raise BadInput for settings this engine cannot honour (checked before any I/O)."""

    @classmethod
    def describe(cls, job: "Job") -> dict[str, Any]:
        """Facts about how this engine ran the job, for the result (e.g. page cache use; for
        spawned workers, whether the CUDA MPS daemon lets their contexts share the GPU)."""
        facts: dict[str, Any] = {"page_cache": not job.direct}
        if PROCESSES in cls.options:
            from gpufio.io.gpu import mps_active

            facts["processes"] = cls.settings(job).processes
            if facts["processes"]:
                facts["mps"] = mps_active()
        return facts

    def __init__(self, job: "Job", targets: list["Target"], ctx: "WorkerContext") -> None:
        self.job = job
        self.targets = targets
        self.ctx = ctx

    @abstractmethod
    def run(self) -> None:
        """Issue I/O until ``ctx`` hands out no more work; record every completion."""

    def close(self) -> None:
        """Release what the constructor set up; called even when ``run`` failed."""
