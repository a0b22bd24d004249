"""The io_uring backend of the GPU request queue: agent warps that turn requests into SQEs.

``UringQueue`` is the request queue (io/gio/queue.RequestQueue) served through GPU-driven
io_uring rings (rings.GpuRings): one agent warp per ring (kernels/gio_agent.cu) writes each
posted request as an SQE into its ring in CUDA-registered host memory, the kernel's SQPOLL
threads run them, and the agents hand the completions back. The requests land in pinned
landing slots mapped into the GPU (registered with io_uring as fixed buffers where asked).
The host wakes SQPOLL threads that fell asleep and watches the rings' CQ tails. Also here:
how a GPU-initiated engine's settings become such a queue (``make_queue``), and the
defaults that depend on this host and the targets (``default_sq_threads``, rings.py's
``default_rings``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.facts.storage import ram_backing
from gpufio.io import gpu, kernels, uring
from gpufio.io.kernels import Kernel
from gpufio.io.gio import contract
from gpufio.io.gio.backends.rings import GpuRings, ring_sizes, stall_report
from gpufio.io.gio.queue import (
    POLL_S,
    QueueStalled,
    RequestQueue,
    keep_for_good,
    refuse_serialised,
)

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.core.targets import Target

DRAIN_S = 10.0


class UringQueue(RequestQueue):
    """``nrings`` x ``depth`` request slots of ``slot_bytes`` each, served by agent warps
    through ``nrings`` SQPOLL rings."""

    def __init__(self, *, nrings: int, depth: int, slot_bytes: int, sq_entries: int,
                 cq_entries: int, idle_ms: int, cpus: tuple[int, ...], sqe_async: bool,
                 fds: list[int], registered: bool, sq_threads: int = 0,
                 nop: bool = False, namespaces: np.ndarray | None = None) -> None:
        """``fds``: the files kernels will read; with ``registered`` every ring registers them
        (IOSQE_FIXED_FILE) and its own landing slots (READ_FIXED), as fio's registerfiles and
        fixedbufs: no per-read file reference count, shared by all SQPOLL threads, and no
        per-read buffer mapping. Kernels name a file by its ``file_refs`` entry.
        ``namespaces``: NVMe passthrough: ``fds`` are NVMe generic char devices and entry i
        is file i's nsid | lba_shift << 32; the agents write each request as the NVMe command
        (IORING_OP_URING_CMD in 128-byte SQEs), the files registered, the slots not (the
        kernel maps a command's buffer itself)."""
        refuse_serialised("GPU-initiated I/O")
        super().__init__(nrings, depth)
        self._agent = kernels.function(Kernel.GIO_AGENT)
        self._slots: gpu.PinnedBuffer | None = None
        passthrough = namespaces is not None
        registered = registered or passthrough  # the agents look a file's namespace up by index
        self.rings = GpuRings(nrings, sq_entries, cq_entries, idle_ms=idle_ms, cpus=cpus,
                              sq_threads=sq_threads, big=passthrough)
        slots = nrings * depth
        with gpu.undone_on_failure(self.close, f"out of GPU memory for a queue of {slots} slots"):
            for ring in self.rings.rings:  # what the kernel made of the sizes asked for
                if not depth <= ring.sq_entries <= ring.cq_entries:
                    raise BadInput(f"a queue of depth {depth} needs depth <= SQ entries <= CQ "
                                   f"entries, got SQ {ring.sq_entries}, CQ {ring.cq_entries}: "
                                   "a CQ that overflows can never be drained by the GPU")
            self._slots = gpu.PinnedBuffer(slots * slot_bytes, mapped=True)
            self.landing = self._slots.addr
            self.file_refs = np.array(range(len(fds)) if registered else fds, np.int32)
            if registered:
                self._register(fds, None if passthrough else depth * slot_bytes)
            flags = ((uring.SQE_ASYNC if sqe_async else 0)
                     | (uring.SQE_FIXED_FILE if registered else 0))
            # the agents make a write's opcode from a read's by adding one
            assert uring.OP_WRITE == uring.OP_READ + 1
            assert uring.OP_WRITE_FIXED == uring.OP_READ_FIXED + 1
            op = (uring.OP_NOP if nop or passthrough else  # passthrough: the command's own
                  uring.OP_READ_FIXED if registered else uring.OP_READ)
            if passthrough:
                self._dev["ns"] = self._cp.asarray(np.asarray(namespaces, np.uint64))
            words = {"sqe_head": op | flags << 8, "ns": self.ptr("ns") if passthrough else 0}
            self._arrays(np.array([contract.build(contract.URING_RING, {**d, **words})
                                   for d in self.rings.descriptors], np.uint64), slot_bytes)

    def _register(self, fds: list[int], ring_bytes: int | None) -> None:
        """Every ring registers the files and (unless ``ring_bytes`` is None) its own slots,
        as buffer 0."""
        try:
            for r, ring in enumerate(self.rings.rings):
                ring.register_files(fds)
                if ring_bytes is not None:
                    ring.register_buffers([uring.Region(self.landing + r * ring_bytes,
                                                        ring_bytes)])
        except uring.UringError as e:
            raise BadInput(f"GPU-initiated I/O: {e} (buffers of {ring_bytes} bytes per ring; "
                           "io_uring takes at most 1 GiB each, and charges them to "
                           "RLIMIT_MEMLOCK without CAP_IPC_LOCK): set registered = false") from None

    def _launch(self) -> None:
        self._agent(*self.agent_grid(), (self.descriptor, self._dev["rings"]),
                    stream=self.agent_stream)

    def _before_start(self) -> None:
        """Reads an abort abandoned must land before the slots are handed out again."""
        if self._aborted and not self.drain():
            raise QueueStalled("reads abandoned by the last abort are still in flight")

    def wake(self, check: bool = True) -> int:
        """Wake the SQPOLL threads that fell asleep (rings.GpuRings.wake)."""
        return self.rings.wake(check)

    def completed(self) -> int:
        return self.rings.completed()

    def report(self, stall_ns: int) -> str:
        """Every ring's heads, tails and flags, and the slots' states."""
        return stall_report(stall_ns, self.rings.states(), self.slot_counts())

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no read is in flight on any ring (the CQ tail has caught up with the
        SQ tail), waking SQPOLL threads so published SQEs are taken and completed; True if
        they all landed within ``timeout_s`` (default DRAIN_S)."""
        deadline = time.monotonic() + (DRAIN_S if timeout_s is None else timeout_s)
        while any(r.inflight for r in self.rings.states()):
            if time.monotonic() > deadline:
                return False
            self.rings.wake(check=False)
            time.sleep(POLL_S)
        return True

    def close(self) -> None:
        """Release rings and memory. Reads still in flight land first (drain); a read that
        never lands keeps its landing slots mapped for good, and a kernel that never stopped
        keeps everything it may touch (WEDGED) and marks the GPU unusable."""
        if self.wedged("a GPU-initiated I/O kernel never stopped"):
            return
        landed = not self.rings.rings or self.drain()
        self.rings.close()  # before the slots: a ring's late completion writes into them
        self._dev, self._kept, self._launch_kept = {}, [], ()
        if self._slots is not None:
            if landed:
                self._slots.close()
            else:
                keep_for_good(self._slots)
            self._slots = None


def make_queue(opts: Any, *, depth: int, slot_bytes: int, fds: list[int],
               nop: bool = False, namespaces: np.ndarray | None = None) -> UringQueue:
    """The request queue an engine's resolved settings describe (``opts``: rings,
    ring_entries, sq_threads, sq_thread_cpu, sq_thread_idle, sqe_async, registered), with
    ``depth`` slots per ring: the block benchmark's and the row gather's; ``nop``: its agents
    post IORING_OP_NOP for every request; ``namespaces``: they post NVMe commands
    (``namespace_table``)."""
    sq, cq = ring_sizes(depth, opts.ring_entries)
    return UringQueue(nrings=opts.rings, depth=depth, slot_bytes=slot_bytes, sq_entries=sq,
                      cq_entries=cq, idle_ms=opts.sq_thread_idle // 1_000_000,
                      cpus=opts.sq_thread_cpu, sqe_async=opts.sqe_async, fds=fds,
                      registered=opts.registered, sq_threads=opts.sq_threads, nop=nop,
                      namespaces=namespaces)


def namespace_table(targets: list[Target]) -> np.ndarray:
    """Per target (opened for passthrough): nsid | lba_shift << 32, what the agents build
    each NVMe command from (each ring's ns, kernels/gio_agent.cu)."""
    return np.array([t.facts["nsid"] | (t.lba.bit_length() - 1) << 32 for t in targets],
                    np.uint64)


def default_sq_threads(job: Job, rings: int) -> int:
    """SQPOLL threads when the job does not say: one per ring where a target lives in memory
    (each thread copies its reads itself, so the rate grows with threads); one per target
    otherwise: a drive's rate is its own, one thread submits at it, and every further
    thread would only spin on a core of its own. A target file not laid out yet is judged
    by its directory: the job's settings are resolved when the profile is read."""
    ram = any(ram_backing(p if os.path.exists(p) else os.path.dirname(os.path.abspath(p)))
              for p in job.targets)
    return rings if ram else min(max(len(job.targets), 1), rings)
