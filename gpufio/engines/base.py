"""The one interface every data path implements.

As in fio, an engine is one module that fills in a small table of operations and registers
itself by name; the runner never names an engine. An engine provides one or both of two I/O
primitives (core/requests) and nothing that runs: ``channel``, requests a host thread
submits, and ``queue``, a request queue GPU threads submit to. Every loop that drives them
(block, rows, tensors) is in gpufio/loops, chosen from the primitive (``primitive``) and the
memory the data lands in, never from the engine.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from gpufio.core.checks import Check
from gpufio.core.errors import BadInput
from gpufio.core.options import Option, settings_class
from gpufio.core.requests import (CHANNEL, GPU, HOST, QUEUE, Capability, Channel, ChannelSpec,
                                  DeviceQueue, File, QueueSpec)

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.core.rows import RowSupport
    from gpufio.core.tensors import TensorSupport
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


# the largest write block a compiled loop fills itself (larger writes keep the Python loop,
# whose fill runs on several threads)
COMPILED_WRITE_BS = 128 << 10


def compiled_loop(job: "Job") -> bool:
    """Whether the job's I/Os go through the compiled loops (io/loops.py) instead of the
    block loop's Python one (loops/block_host.py), for an engine whose channel has one: where
    they are built, for jobs that neither verify as they read nor sync every N writes (both
    stay in Python), and whose writes are small enough to fill on the loop's own thread. A
    rate-capped job stays compiled: each batch comes with its due times, and the loop
    reaps while none is due."""
    from gpufio.io import loops

    return (not (job.verify and job.reads) and not (job.fsync or job.fdatasync)
            and (not job.writes or job.bs <= COMPILED_WRITE_BS) and loops.available())


def loop_facts(job: "Job") -> dict[str, Any]:
    """What a job's result says of the loop that issued its I/Os."""
    return {"loop": "compiled" if compiled_loop(job) else "python"}


def nop_facts(op: str) -> dict[str, Any]:
    """What a job's result says of its op."""
    return {"op": op, **({"storage": "none: NOPs"} if op == "nop" else {})}


class Engine(ABC):
    """A data path: a table of class attributes and class methods, never instantiated."""

    name: ClassVar[str]
    summary: ClassVar[str]
    peer: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    uses_gpu: ClassVar[bool] = False
    # what the profile's iodepth means for this path (shown by 'gpufio engines')
    iodepth_means: ClassVar[str] = "I/Os in flight per worker"
    # the extras of the GNN rows gathered through this engine's channel (a GPU cache,
    # mapping advice, a row-width multiple, the loaders' baseline); for an engine with no
    # channel, all of what the gather over its queue offers (None: no rows)
    rows: ClassVar[RowSupport | None] = None
    # for an engine with no channel a host thread submits to: where the checkpoint mover
    # would find shards once it has one (None: no tensors)
    tensors: ClassVar[TensorSupport | None] = None
    # False for a path that touches no storage (null): a job of it naming no targets gets
    # an offset space of its size, with no file laid out
    touches_storage: ClassVar[bool] = True
    # what the engine's channel (the primitive a host thread submits to, core/requests) can
    # do; None: it opens no channel (GPU threads submit to its queue only)
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
    # holds; False for engines whose GPU threads pick their own (its queue's loop)
    paced: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.Settings = settings_class(f"{cls.__name__}Settings", cls.options, cls.__module__,
                                      f"{cls.__qualname__}.Settings")

    @classmethod
    def settings(cls, job: "Job") -> Any:
        """The job's options of this engine, typed (``settings(job).sqpoll``), as the loader
        resolved them once (engines.settle): nothing is worked out again per call."""
        return job.engine_settings

    @classmethod
    def resolve(cls, job: "Job") -> Any:
        """The job's settings with what this engine picks picked: ``job.engine_settings``
        holds the profile's values typed, None where the engine picks. Called once per job
        (engines.settle); BadInput for values that contradict each other. The default
        picks nothing."""
        return job.engine_settings

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
    def primitive(cls, job: "Job") -> str | None:
        """Which primitive moves ``job``'s I/Os: CHANNEL where a host thread submits to the
        engine's channel (``capability``), else QUEUE where GPU threads submit to its
        ``queue``; None: neither (it moves nothing here). An engine with both says per job."""
        if cls.capability is not None:
            return CHANNEL
        return QUEUE if cls.queue.__func__ is not Engine.queue.__func__ else None

    @classmethod
    def queue(cls, job: "Job", files: Sequence[File], spec: QueueSpec) -> DeviceQueue:
        """The engine's other primitive over ``files`` (a worker's targets, opened by the
        caller, who closes them; none where ``spec.table`` names a feature table's files):
        a request queue GPU threads submit to, with what a loop must know of it
        (core/requests.DeviceQueue), set up now, before the clock. Engines whose
        ``primitive`` can be QUEUE implement it."""
        raise NotImplementedError(f"engine '{cls.name}' makes no request queue")

    @classmethod
    def row_support(cls) -> RowSupport | None:
        """What the GNN rows through this engine offer, for the workloads' checks: for a
        channel a host thread submits to, the generic gather's (GPU memory only when the
        channel takes no host buffers) with the extras ``rows`` declares; else ``rows``."""
        cap = cls.capability
        if cap is None:
            return cls.rows
        if cap.namespaces:  # feature tables are files: rows only where the engine reads
            return cls.rows  # one laid out on a namespace (feature_file naming the device)
        from gpufio.core.rows import RowSupport  # here: a block run's start needs no rows

        return replace(cls.rows or RowSupport(), gpu_only=HOST not in cap.memory)

    @classmethod
    def tensor_support(cls) -> TensorSupport | None:
        """Where the checkpoint mover over this engine's channel finds shards: host shards
        for a channel of host buffers; GPU shards straight for one of GPU buffers, or
        through pinned host memory for a GPU engine's host channel. Without a channel a host
        thread submits to: what ``tensors`` declares."""
        cap = cls.capability
        if cap is None:
            return cls.tensors
        if cap.namespaces:  # checkpoints are files, not NVMe namespaces
            return None
        from gpufio.core.tensors import TensorSupport  # here: nor tensors

        host = HOST in cap.memory
        return TensorSupport(host=host, gpu=GPU in cap.memory or (host and cls.uses_gpu))

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
        rows, tensors = cls.row_support(), cls.tensor_support()
        if rows is not None and not rows.gpu_only:
            what += ("rows",)
        if tensors is not None and tensors.host:
            what += ("tensors",)
        return what

    @classmethod
    def gpu_memory(cls) -> tuple[str, ...]:
        """What this path moves into or out of GPU memory: its block jobs, rows, tensors."""
        if not cls.uses_gpu:
            return ()
        what: tuple[str, ...] = ("block",)
        tensors = cls.tensor_support()
        if cls.row_support() is not None:
            what += ("rows",)
        if tensors is not None and tensors.gpu:
            what += ("tensors",)
        return what

    @classmethod
    def host_unavailable(cls) -> str | None:
        """Why this path cannot move host memory here (``host_memory``), or None if it can:
        a GPU path's host side needs no GPU."""
        return None if cls.uses_gpu else cls.unavailable()

    @classmethod
    def buffered(cls, job: "Job") -> bool:
        """Whether the job's reads go through the page cache: direct off, or a path that
        reads through it whatever ``direct`` says (a mapping)."""
        return not job.direct or (cls.capability is not None and cls.capability.page_cache)

    @classmethod
    def refuse_if_unavailable(cls, job_name: str, gpu: bool = True) -> None:
        """BadInput naming the job where this path cannot run here: on the GPU (``gpu``),
        else in host memory; one line, never the import error of a missing library."""
        why = cls.unavailable() if gpu else cls.host_unavailable()
        if why:
            raise BadInput(f"job '{job_name}': engine '{cls.name}' cannot run here: {why}")

    @classmethod
    def doctor(cls, host: "Host", jobs: list["Job"]) -> list[Check]:
        """What ``gpufio doctor`` checks for this path on ``host`` (readings under a root
        directory), for ``jobs`` of this engine (none: the path in general)."""
        return []

    @classmethod
    def availability(cls) -> dict[str, Any]:
        """Where this path runs here, the one answer ``gpufio engines`` and ``gpufio info``
        give: per side ("host memory", "GPU memory") what it moves there (``moves``) and why
        not here (``why not``, "" where it can); ``available`` where any side runs, else
        ``why not`` the first side's reason."""
        sides = {"host memory": (cls.host_memory(), cls.host_unavailable),
                 "GPU memory": (cls.gpu_memory(), cls.unavailable)}
        where = {side: {"moves": list(moves), "why not": (why() or "") if moves else ""}
                 for side, (moves, why) in sides.items()}
        usable = [w for w in where.values() if w["moves"] and not w["why not"]]
        blocked = [w["why not"] for w in where.values() if w["moves"] and w["why not"]]
        return {"available": bool(usable), "why not": "" if usable else blocked[0], **where}

    @classmethod
    def status(cls) -> str:
        """One line for ``gpufio info``, from ``availability``: why it cannot run here,
        "available", or the memory it runs in here and the one it does not, and why."""
        a = cls.availability()
        sides = [(side, a[side]) for side in ("host memory", "GPU memory") if a[side]["moves"]]
        blocked = [f"{side}: {w['why not']}" for side, w in sides if w["why not"]]
        if not a["available"] or not blocked:
            return a["why not"] or "available"
        runs = [f"{side} ({', '.join(w['moves'])})" for side, w in sides if not w["why not"]]
        return f"available in {'; '.join(runs)}; not in {'; '.join(blocked)}"

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
