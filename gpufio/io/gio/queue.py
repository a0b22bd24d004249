"""The GPU request queue: request slots in GPU memory in front of GPU-driven io_uring rings.

Any kernel that includes kernels/gio_queue.cuh can post reads into this queue through the
device request API (gio_try_post / gio_done / gio_read ...); the queue's agent warps (one per
ring) turn them into SQEs. This class owns everything that lives outside those kernels: the
rings (rings.GpuRings), the pinned landing slots mapped into the GPU, the slot and
control arrays in GPU memory, the agents' launch, the control words a host may set while
kernels run, and the stop-with-a-diagnostic path. The block benchmark (engines/gpu_uring.py)
is one user; the GNN gather (kernels/gnn_gather.cu, through a GPU cache) is another.

Teardown is the delicate part: a read the kernel still runs writes into its landing slot, and
a kernel that never stopped still writes into every array of the queue. So the rings are
drained before any memory goes, and what a stuck kernel may touch is kept alive for the
life of the process (``WEDGED``), with the GPU marked unusable (gpu.mark_wedged).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.io import cuda, gpu, uring
from gpufio.io.gio import contract
from gpufio.io.gio.contract import index
from gpufio.io.gio.rings import GpuRings, stall_report
from gpufio.io.watchdog import Stalled, Watchdog

C_STOP, C_ABORT, C_MEASURING = index("C_STOP"), index("C_ABORT"), index("C_MEASURING")
C_REQUESTERS, C_AGENTS = index("C_REQUESTERS"), index("C_AGENTS")
C_GEN, C_BAD_SLOT = index("C_GEN"), index("C_BAD_SLOT")
SLOT_STATES = tuple(s.lower() for s in contract.SLOT_STATES)
POLL_S = 0.001
START_LIMIT_S = 10.0
ABORT_WAIT_S = 5.0
DRAIN_S = 10.0
# objects a kernel that never stopped (or a read that never completed) may still write into:
# never freed, so the memory under them is never handed to anything else
WEDGED: list[Any] = []


class QueueStalled(Stalled):
    """The queue was stopped because reads stopped completing (or agents never started)."""


class DeviceQueue:
    """``nrings`` x ``depth`` request slots of ``slot_bytes`` each, served by agent warps."""

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
        import cupy as cp

        why = gpu.serialising_reason()
        if why:
            raise BadInput(f"GPU-initiated I/O cannot run here: {why}")
        self._cp = cp
        self.nrings, self.depth = nrings, depth
        self._gen = 0
        self._aborted = False
        self._kept: list[Any] = []
        self._launch_kept: tuple[Any, ...] = ()
        self._agent = cuda.module("gio_agent").get_function("gio_agent")
        self._slots: gpu.PinnedBuffer | None = None
        self._dev: dict[str, Any] = {}
        self.kernels_done = True
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
            head = op | flags << 8
            d = self._dev = {
                "rings": cp.asarray(self.rings.descriptors), "state": cp.zeros(slots, cp.int32),
                "res": cp.zeros(slots, cp.int32), "off": cp.zeros(slots, cp.uint64),
                "len_fd": cp.zeros(slots, cp.uint64),
                "control": cp.zeros(contract.CONTROL_WORDS, cp.int32),
                "ring_stats": cp.zeros(2 * nrings, cp.uint64)}
            arrays = ("rings", "state", "res", "off", "len_fd", "control", "ring_stats")
            if passthrough:
                d["pt"] = cp.asarray(np.asarray(namespaces, np.uint64))
            d["queue"] = cp.asarray(contract.build(contract.GIO_QUEUE, {
                **{name: self.ptr(name) for name in arrays}, "nrings": nrings, "depth": depth,
                "landing": self.landing, "slot_bytes": slot_bytes, "sqe_head": head,
                "pt": self.ptr("pt") if passthrough else 0}))
        self.agent_stream = cp.cuda.Stream(non_blocking=True)
        self.control_stream = cp.cuda.Stream(non_blocking=True)

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

    @property
    def descriptor(self) -> Any:
        """The GioQueue struct in GPU memory: pass it to kernels as ``const GioQueue*``."""
        return self._dev["queue"]

    def ptr(self, name: str) -> int:
        """Device address of one of the queue's arrays."""
        return self._dev[name].data.ptr

    def start(self, requesters: int, keep: tuple[Any, ...] = ()) -> None:
        """Launch the agents for ``requesters`` requester threads (each must decrement the
        C_REQUESTERS word when it ends, as gio_bench does); return once all agents run.
        ``keep``: the arrays this launch's kernels write (kept alive if they never stop).

        Load every kernel that will post requests (get_function) before this: loading a
        module while the agents spin can wait for them to finish, and they wait for the
        requesters, a deadlock. gpufio also asks CUDA for eager module loading (gpu.py).
        """
        if not self.kernels_done:
            raise RuntimeError("the queue's kernels still run: it cannot start again")
        if self._aborted and not self.drain():
            raise QueueStalled("reads abandoned by the last abort are still in flight")
        self._gen += 1
        control = self._dev["control"]
        control.fill(0)  # a queue may be started again once its kernels have ended
        control[C_REQUESTERS] = requesters
        control[C_GEN] = self._gen  # completions of an earlier start are never taken for ours
        self._dev["state"].fill(0)
        # the descriptor and control copies (null stream) before the launch; only the null
        # stream: a device-wide sync would wait for other workers' agents on this GPU
        self._cp.cuda.Stream.null.synchronize()
        self._aborted = False
        self._launch_kept = keep
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

    def abort_quietly(self, other_streams: tuple[Any, ...] = ()) -> bool:
        """Stop agents and requesters now (reads in flight are abandoned, for ``drain`` to
        collect); True when every kernel stopped within ABORT_WAIT_S. For error paths: the
        error that brought us here is the one to report."""
        if self.kernels_done:
            return True
        self._aborted = True
        streams = (self.agent_stream, *other_streams)
        try:
            self.set(C_ABORT, 1)
            deadline = time.monotonic() + ABORT_WAIT_S
            while not all(s.done for s in streams) and time.monotonic() < deadline:
                self.rings.wake(check=False)
                time.sleep(POLL_S)
            self.kernels_done = all(s.done for s in streams)
        except Exception:  # a broken context: the kernels' state cannot be known
            self.kernels_done = False
        return self.kernels_done

    def abort(self, why: str, other_streams: tuple[Any, ...] = ()) -> None:
        """Stop agents and requesters now and raise QueueStalled; ``kernels_done`` says
        whether they did stop."""
        if not self.abort_quietly(other_streams):
            why += f"; the kernels did not stop within {ABORT_WAIT_S:g} s"
        raise QueueStalled(why)

    def bad_slot(self) -> int | None:
        """The first out-of-range slot a kernel posted to (which aborted the queue), if any."""
        word = int(self.fetch(self._dev["control"])[C_BAD_SLOT])
        return word - 1 if word else None

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

    def keep_alive(self, *objects: Any) -> None:
        """Arrays of a kernel that uses this queue: kept with it if that kernel never stops."""
        self._kept.extend(objects)

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
        """Release rings and memory. Reads still in flight land first (drain); a read that
        never lands keeps its landing slots mapped for good, and a kernel that never stopped
        keeps everything it may touch (WEDGED) and marks the GPU unusable."""
        if not self.kernels_done:
            WEDGED.append(self)
            gpu.mark_wedged(self._cp.cuda.Device().id, "a GPU-initiated I/O kernel never "
                            "stopped")
            return
        landed = not self.rings.rings or self.drain()
        self.rings.close()  # before the slots: a ring's late completion writes into them
        self._dev, self._kept, self._launch_kept = {}, [], ()
        if self._slots is not None:
            if landed:
                self._slots.close()
            else:
                WEDGED.append(self._slots)
            self._slots = None
