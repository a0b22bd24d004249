"""The one I/O primitive: an engine moves batches of requests and hands back completions.

A request is (target, offset, length, buffer address, op): read ``length`` bytes of target
``target`` at ``offset`` into the buffer, or write them from it. An engine opens a
``Channel`` (``Engine.channel``) over targets a workload opened; the loops that make
requests (the block loops, the GNN row gather, the checkpoint save and restore) live in
gpufio/loops, above the engines, written once for every engine whose ``Capability`` fits.
Defined here, below both, so neither names the other. (The other primitive, a queue GPU
threads submit to, is io/gio/queue.RequestQueue.)
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from gpufio.core.rows import RowRequest, RowTable


# where a request's buffer lives
HOST = "host"  # host memory, page-aligned where the channel's targets are O_DIRECT
GPU = "gpu"  # GPU memory: the address is a device pointer

# a batch with no completion for this long is stuck (a wedged drive or mount)
STALL_NS = 10_000_000_000


class File(Protocol):
    """A file a channel moves requests to and from, opened by whoever asked for the channel
    (core/targets.Target is one)."""

    path: str
    fd: int


@dataclass(frozen=True)
class Capability:
    """What an engine's channel can do, for the loops above the engines to check.

    ``memory``: where its requests' buffers may live (HOST, GPU). ``writes``: it writes as
    well as reads. ``moves_data``: False for a path that completes requests without moving
    bytes (null), whose buffers hold nothing afterwards. ``page_cache``: reads come from the
    page cache whatever O_DIRECT says (a mapping). A host thread submits every batch (GPU
    threads submit to the other primitive, a request queue). ``synchronous``: ``submit``
    blocks while it moves each request in turn (pread), timing each itself (``times``): a
    loop hands it a whole batch and overlaps its own work (a write's fill) on a thread.
    ``namespaces``: its files must be NVMe namespaces (passthrough commands, or a controller
    driven from user space), so the workloads' own files (feature tables, checkpoints) are
    not for it unless the engine declares otherwise. ``descriptors``: False for a channel
    that takes the device behind its files from its kernel driver while it is open (the
    files vanish meanwhile, and an open descriptor would pin the device's old instance):
    whoever asks for it passes the files unopened (fd -1) and closes any it opened first."""

    memory: tuple[str, ...] = (HOST,)
    writes: bool = True
    moves_data: bool = True
    page_cache: bool = False
    synchronous: bool = False
    namespaces: bool = False
    descriptors: bool = True


@dataclass(frozen=True)
class ChannelSpec:
    """What a loop asks of a channel: ``depth`` requests in flight at most, buffers in
    ``memory``, ``largest`` bytes the longest request moves (for engines that size their
    bounce buffers or thread pools by it), ``writes`` when it will write. ``region``: the
    (address, bytes) every request's buffer lies in (host or GPU memory, as ``memory``
    says), for a channel that registers it once (io_uring's fixed buffers,
    cuFileBufRegister); None: anywhere. ``stop_fd``: an eventfd
    that becomes readable when the loop must stop, for a channel whose waits it may wake
    (-1: none). ``ram_backed``: every file lives in memory (tmpfs, zram), for a channel
    whose defaults depend on it. ``access``: how the loop walks the files, "sequential" or
    "random" (None: not known), for a path that reads ahead by itself (a mapping's
    madvise)."""

    depth: int
    memory: str = HOST
    largest: int = 4096
    writes: bool = False
    region: tuple[int, int] | None = None
    stop_fd: int = -1
    ram_backed: bool = False
    access: str | None = None


# which primitive moves a job's I/Os (Engine.primitive): a Channel a host thread submits
# to, or a request queue GPU threads submit to (Engine.queue)
CHANNEL, QUEUE = "channel", "queue"


@dataclass(frozen=True)
class QueueSpec:
    """What a loop asks of a request queue GPU threads submit to: ``depth`` request slots
    (per ring) for a worker's block job, ``slot_bytes`` the largest transfer, ``worker`` the
    worker it serves (its own NVMe queue pair). For the GNN rows, ``table`` and ``rows``:
    the queue reads the feature table's files (the engine opens what it needs of them, as
    ``rows.direct`` says), and the depth is the engine's pick for ``rows``
    (core/rows.row_depth) unless the profile gives one."""

    depth: int
    slot_bytes: int
    worker: int = 0
    table: "RowTable | None" = None
    rows: "RowRequest | None" = None


def _nothing() -> None:
    """A queue with nothing of its own to release."""


@dataclass
class DeviceQueue:
    """A request queue GPU threads submit to (``Engine.queue``), with what a loop over it
    must know of the engine's path, so the loop names no engine: ``queue`` (an
    io/gio/queue.RequestQueue of any backend), ``stall_ns`` (no completion for this long
    ends the loop), ``threads`` (requester threads), ``land_gpu`` (reads are copied into
    GPU memory, else left in the queue's host slots), ``nop`` (no data: NOPs), ``facts``
    and ``mode`` (how it moved the requests, for the result), ``begin()`` when the
    measurement starts and ``notes()`` the path's measurements while it stops,
    ``final_notes()`` once the kernels stopped, ``drive_reads()`` the commands each of
    its drives has taken so far (a modelled drive's own count; None: the path has none),
    ``sync()`` to make the written bytes
    durable from the GPU (an NVMe Flush from a GPU thread, for an engine that
    ``flushes_itself``), ``close()`` to release the queue and whatever it was made on (a
    controller, its registration)."""

    queue: Any
    stall_ns: int
    threads: int = 0
    land_gpu: bool = True
    nop: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None
    begin: Callable[[], None] | None = None
    notes: Callable[[], dict[str, Any]] | None = None
    final_notes: Callable[[], dict[str, Any]] | None = None
    drive_reads: Callable[[], list[int]] | None = None
    sync: Callable[[], None] = _nothing
    close: Callable[[], None] = _nothing


class Channel(ABC):
    """Requests in flight on one engine's data path: at most ``spec.depth``.

    ``submit`` takes requests in order until the channel is full; ``reap`` returns the tags
    and results (bytes moved, or -errno) of requests that completed. A synchronous path
    (pread, a mapping) moves each request inside ``submit`` and hands it back at the next
    ``reap``. Buffers must stay valid until their request is reaped; ``close`` waits for
    what is still in flight (with a limit) so none lands in freed memory."""

    # facts for a result: how the path moved the requests (e.g. iodepth, api, mode)
    facts: dict[str, Any]

    def __init__(self, spec: ChannelSpec) -> None:
        self.spec = spec
        self.facts = {}

    @property
    @abstractmethod
    def inflight(self) -> int:
        """Requests submitted and not yet reaped."""

    def room(self) -> int:
        """How many more requests ``submit`` takes now."""
        return self.spec.depth - self.inflight

    @abstractmethod
    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        """Queue requests from the first on, as many as there is room for; how many."""

    @abstractmethod
    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(tags, results) of completed requests, int64. With ``wait_ns`` (and something
        in flight), wait up to that long for at least one; None: take what is there."""

    def state(self) -> str:
        """Where the path stands, for the report of a stall."""
        return f"{self.inflight} in flight"

    @property
    def wakeable(self) -> bool:
        """True while a readable ``spec.stop_fd`` (or the device itself, polled) ends every
        wait of ``reap``: a loop may then wait long without missing a stop."""
        return False

    def times(self) -> np.ndarray | None:
        """How long each request of the last ``reap`` took (ns), for a channel that timed
        each itself (a synchronous one); None: from its submission to its reaping."""
        return None

    def native(self, job: Any, ctx: Any, batch: int, wait_ns: int) -> Any:
        """The compiled loop (io/loops.NativeLoop) that moves this channel's requests for the
        block workload's ``job`` and worker context ``ctx``, over ``spec.depth`` slots of
        ``spec.largest`` bytes at ``spec.region``, ``batch`` requests a call and waits of
        ``wait_ns``; None where this path has none (a loop then submits through Python)."""
        return None

    def measured(self) -> None:
        """The measured phase began: start what the path measures of itself."""

    def notes(self) -> dict[str, list[Any]]:
        """The path's own measurements of the run (e.g. its kernel threads' shares), for
        the worker's result (core/context.WorkerContext.note), once at the end."""
        return {}

    def expect(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray,
               write: bool) -> None:
        """Requests the loop will submit soon (its next batch), for a path that can start
        on them early (a mapping asks for the pages a store would fault in); by default
        nothing."""

    def finish(self) -> None:
        """The loop's last write completed: hand the files what the path still holds of
        them (a mapping's dirty pages: msync), inside the job's time; by default nothing,
        a completed write is in the file already."""

    def sync(self, fds: Sequence[int]) -> None:
        """Make the written bytes durable (fsync of every file; a mapping flushes first)."""
        sync_files(fds)

    def close(self) -> None:
        """Release the channel; what is in flight lands first."""


def sync_files(fds: Sequence[int]) -> None:
    """fsync every file: the saved bytes (and the files' sizes) are on stable storage."""
    for fd in fds:
        os.fsync(fd)


class RequestFailed(RuntimeError):
    """Request ``index`` of a batch came back with ``res`` (-errno, or fewer bytes)."""

    def __init__(self, index: int, res: int) -> None:
        super().__init__(f"request {index}: {res}")
        self.index, self.res = index, res


def drain(ch: Channel, stall_ns: int = STALL_NS) -> None:
    """Wait for what is in flight on ``ch`` (up to ``stall_ns`` without a completion), so
    none lands in memory the caller frees."""
    while ch.inflight:
        if not len(ch.reap(stall_ns)[0]):
            return
