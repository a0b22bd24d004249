"""The GPU request queue: request slots in GPU memory in front of GPU-driven io_uring rings.

Any kernel that includes kernels/gpu_uring.cu can post reads into this queue through the
device request API (gio_try_post / gio_done / gio_read ...); the queue's agent warps (one per
ring) turn them into SQEs. This class owns everything that lives outside those kernels: the
rings (gpuring.GpuRings), the pinned landing slots mapped into the GPU, the slot and
control arrays in GPU memory, the agents' launch, the control words a host may set while
kernels run, and the stop-with-a-diagnostic path. The block benchmark (engines/gpuuring.py)
is one user; the GNN workload and a GPU cache are meant to be others.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpufio import cuda, gpu, uring
from gpufio.errors import BadInput
from gpufio.gpuring import GpuRings, Watchdog, ring_sizes, stall_report

C_STOP, C_ABORT, C_MEASURING, C_REQUESTERS, C_AGENTS = range(5)
SLOT_STATES = ("free", "claimed", "ready", "submitted", "done")
POLL_S = 0.001
START_LIMIT_S = 10.0
ABORT_WAIT_S = 5.0


class QueueStalled(RuntimeError):
    """The queue was stopped because reads stopped completing (or agents never started)."""


class DeviceQueue:
    """``nrings`` x ``depth`` request slots of ``slot_bytes`` each, served by agent warps."""

    def __init__(self, *, nrings: int, depth: int, slot_bytes: int, sq_entries: int,
                 cq_entries: int, idle_ms: int, cpus: tuple[int, ...], sqe_async: bool,
                 fds: list[int], registered: bool, sq_threads: int = 0) -> None:
        """``fds``: the files kernels will read; with ``registered`` every ring registers them
        (IOSQE_FIXED_FILE) and its own landing slots (READ_FIXED), as fio's registerfiles and
        fixedbufs: no per-read file reference count, shared by all SQPOLL threads, and no
        per-read buffer mapping. Kernels name a file by its ``file_refs`` entry."""
        import cupy as cp

        self._cp = cp
        self.nrings, self.depth = nrings, depth
        self.module = cuda.module("gpu_uring")
        self._agent = self.module.get_function("gio_agent")
        self._slots: gpu.PinnedBuffer | None = None
        self._dev: dict[str, Any] = {}
        self.kernels_done = True
        self.rings = GpuRings(nrings, sq_entries, cq_entries, idle_ms=idle_ms, cpus=cpus,
                              sq_threads=sq_threads)
        try:
            slots = nrings * depth
            self._slots = gpu.PinnedBuffer(slots * slot_bytes, mapped=True)
            self.landing = self._slots.addr
            self.file_refs = np.array(range(len(fds)) if registered else fds, np.int32)
            if registered:
                self._register(fds, depth * slot_bytes)
            flags = ((uring.SQE_ASYNC if sqe_async else 0)
                     | (uring.SQE_FIXED_FILE if registered else 0))
            head = (uring.OP_READ_FIXED if registered else uring.OP_READ) | flags << 8
            d = self._dev = {
                "rings": cp.asarray(self.rings.descriptors), "state": cp.zeros(slots, cp.int32),
                "res": cp.zeros(slots, cp.int32), "off": cp.zeros(slots, cp.uint64),
                "len_fd": cp.zeros(slots, cp.uint64), "control": cp.zeros(8, cp.int32),
                "ring_stats": cp.zeros(2 * nrings, cp.uint64)}
            d["queue"] = cp.asarray(np.array([
                self.ptr("rings"), nrings, depth, self.ptr("state"), self.ptr("res"),
                self.ptr("off"), self.ptr("len_fd"), self.landing, slot_bytes, head,
                self.ptr("control"), self.ptr("ring_stats")],
                np.uint64))
        except cp.cuda.memory.OutOfMemoryError:
            self.close()
            raise BadInput(f"out of GPU memory for a queue of {slots} slots") from None
        except BaseException:
            self.close()
            raise
        self.agent_stream = cp.cuda.Stream(non_blocking=True)
        self.control_stream = cp.cuda.Stream(non_blocking=True)

    @classmethod
    def for_options(cls, opts: dict[str, Any], *, depth: int, slot_bytes: int,
                    fds: list[int]) -> DeviceQueue:
        """The queue a gpu-uring job's resolved options (engines/gpuuring.engine_options)
        describe, with ``depth`` slots per ring: the block benchmark's and the GNN loader's."""
        sq, cq = ring_sizes(depth, opts["ring_entries"] or None)
        return cls(nrings=opts["rings"], depth=depth, slot_bytes=slot_bytes, sq_entries=sq,
                   cq_entries=cq, idle_ms=opts["sq_thread_idle"] // 1_000_000,
                   cpus=opts["sq_thread_cpu"], sqe_async=opts["sqe_async"], fds=fds,
                   registered=opts["registered"], sq_threads=opts["sq_threads"])

    def _register(self, fds: list[int], ring_bytes: int) -> None:
        """Every ring registers the files and its own slots, as buffer 0."""
        try:
            for r, ring in enumerate(self.rings.rings):
                ring.register_files(fds)
                ring.register_buffers([uring.Region(self.landing + r * ring_bytes, ring_bytes)])
        except uring.UringError as e:
            raise BadInput(f"engine 'gpu-uring': {e} (buffers of {ring_bytes} bytes per ring; "
                           "io_uring takes at most 1 GiB each, and charges them to "
                           "RLIMIT_MEMLOCK without CAP_IPC_LOCK): set registered = false") from None

    @property
    def descriptor(self) -> Any:
        """The GioQueue struct in GPU memory: pass it to kernels as ``const GioQueue*``."""
        return self._dev["queue"]

    def ptr(self, name: str) -> int:
        """Device address of one of the queue's arrays."""
        return self._dev[name].data.ptr

    def start(self, requesters: int) -> None:
        """Launch the agents for ``requesters`` requester threads (each must decrement the
        C_REQUESTERS word when it ends, as gio_bench does); return once all agents run.

        Load every kernel that will post requests (get_function) before this: loading a
        module while the agents spin can wait for them to finish, and they wait for the
        requesters, a deadlock. gpufio also asks CUDA for eager module loading (gpu.py).
        """
        control = self._dev["control"]
        control.fill(0)  # a queue may be started again once its kernels have ended
        control[C_REQUESTERS] = requesters
        self._cp.cuda.Device().synchronize()
        self.kernels_done = False
        self._agent((self.nrings,), (32,), (self.descriptor,), stream=self.agent_stream)
        deadline = time.monotonic() + START_LIMIT_S
        while self.fetch(self._dev["control"])[C_AGENTS] < self.nrings:
            if time.monotonic() > deadline:
                self.abort(f"agent warps did not start within {START_LIMIT_S:g} s")
            time.sleep(POLL_S)

    def set(self, word: int, value: int) -> None:
        """Write a control word (C_STOP, C_MEASURING, ...) while kernels run."""
        s = self.control_stream
        self._dev["control"][word:word + 1].set(np.array([value], np.int32), stream=s)
        s.synchronize()

    def fetch(self, array: Any) -> np.ndarray:
        """Copy a GPU array to the host while kernels run (on the queue's own stream)."""
        s = self.control_stream
        out = array.get(stream=s)
        s.synchronize()
        return out

    def slot_counts(self) -> dict[str, int]:
        """How many request slots are in each state: the stall diagnostic's second half."""
        counts = np.bincount(self.fetch(self._dev["state"]), minlength=len(SLOT_STATES))
        return {name: int(counts[i]) for i, name in enumerate(SLOT_STATES)}

    def abort(self, why: str, other_streams: tuple[Any, ...] = ()) -> None:
        """Stop agents and requesters now (reads in flight are abandoned) and raise
        QueueStalled; ``kernels_done`` says whether they did stop."""
        self.set(C_ABORT, 1)
        streams = (self.agent_stream, *other_streams)
        deadline = time.monotonic() + ABORT_WAIT_S
        while not all(s.done for s in streams) and time.monotonic() < deadline:
            self.rings.wake()
            time.sleep(POLL_S)
        self.kernels_done = all(s.done for s in streams)
        if not self.kernels_done:
            why += f"; the kernels did not stop within {ABORT_WAIT_S:g} s"
        raise QueueStalled(why)

    def wait(self, streams: tuple[Any, ...], stall_ns: int, poll_s: float = POLL_S) -> None:
        """Until the agents and ``streams`` are done: wake SQPOLL threads that fell asleep, and
        stop everything with the diagnostic (QueueStalled) once no read has completed for
        ``stall_ns``. A long batch that keeps completing reads is not a stall."""
        dog = Watchdog(stall_ns, time.monotonic_ns())
        everything = (self.agent_stream, *streams)
        while not all(s.done for s in everything):
            self.rings.wake()
            if dog.update(self.rings.completed(), time.monotonic_ns()):
                self.stall(stall_ns, streams)
            time.sleep(poll_s)
        self.kernels_done = True

    def stall(self, timeout_ns: int, other_streams: tuple[Any, ...] = ()) -> None:
        """Abort with the full diagnostic: every ring's heads, tails, flags, slot states."""
        self.abort(stall_report(timeout_ns, self.rings.states(), self.slot_counts()),
                   other_streams)

    def close(self) -> None:
        """Release rings and memory, unless a kernel that would still touch them runs on
        (freeing memory under a running kernel would crash the process instead)."""
        if not self.kernels_done:
            return
        self._dev = {}
        if self._slots is not None:
            self._slots.close()
            self._slots = None
        self.rings.close()
