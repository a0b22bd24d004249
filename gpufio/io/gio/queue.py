"""The GPU request queue's host half, whatever carries the requests (the request API).

Kernels that include kernels/gio_queue.cuh post requests into a ``GioQueue``: ``nrings`` x
``depth`` request slots whose states, results, offsets and files live in GPU memory, the
bytes in landing slots of pinned host memory the GPU reaches, and a few control words a
host may set while kernels run. Agent warps, one per ring and ``warps_per_block`` to a
block, take the posted requests to the transport and hand the completions back.
``RequestQueue`` owns everything of that which does not depend on the transport: the arrays
and the descriptor, the agents' start, the control words, the wait with its watchdog, the
abort and the stall diagnostic's slot counts. A
backend (io/gio/backends/) subclasses it with its agents and their rings: io_uring SQPOLL
rings (backends/uring.UringQueue) or NVMe queue pairs (backends/nvme.NvmeQueues). The block
benchmark (loops/block_device.py) and the row gather (loops/rows_device.py) run on either.

Teardown is the delicate part: a read the kernel still runs writes into its landing slot, and
a kernel that never stopped still writes into every array of the queue. What a stuck kernel
may touch is kept alive for the life of the process (``WEDGED``), with the GPU marked
unusable (gpu.mark_wedged).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.io import gpu
from gpufio.io.gio import contract
from gpufio.io.gio.contract import index
from gpufio.io.watchdog import Stalled, Watchdog

C_STOP, C_ABORT, C_MEASURING = index("C_STOP"), index("C_ABORT"), index("C_MEASURING")
C_REQUESTERS, C_AGENTS = index("C_REQUESTERS"), index("C_AGENTS")
C_GEN, C_BAD_SLOT = index("C_GEN"), index("C_BAD_SLOT")
SLOT_STATES = tuple(s.lower() for s in contract.SLOT_STATES)
POLL_S = 0.001
START_LIMIT_S = 10.0
ABORT_WAIT_S = 5.0
# objects a kernel that never stopped (or a read that never completed) may still write into:
# never freed, so the memory under them is never handed to anything else
WEDGED: list[Any] = []
# the GioQueue arrays every backend has, beside its rings
ARRAYS = ("state", "res", "off", "len_fd", "control", "ring_stats")


def keep_for_good(thing: Any) -> None:
    """Never free ``thing``: a kernel or a read that never ended may still write into it."""
    WEDGED.append(thing)


class QueueStalled(Stalled):
    """The queue was stopped because requests stopped completing (or agents never started)."""


def refuse_serialised(what: str) -> None:
    """BadInput when kernels would run one at a time (a debugger, CUDA_LAUNCH_BLOCKING): the
    agents spin until the requesters end, so a serialised launch would never return."""
    why = gpu.serialising_reason()
    if why:
        raise BadInput(f"{what} cannot run here: {why}")


class RequestQueue:
    """``nrings`` x ``depth`` request slots of ``slot_bytes`` each, served by a backend's agent
    warps. A backend builds its rings, then ``_arrays`` (the slots and the descriptor), and
    defines ``_launch`` (its agents' kernel), ``completed`` (what the watchdog watches),
    ``report`` (where its rings stand, for a stall) and ``close``; ``wake`` and
    ``_before_start`` where its rings need them. ``file_refs``: what kernels pass as each
    file (the GioQueue's fd of a request); ``landing``: the slots' host address."""

    nrings: int
    depth: int
    file_refs: np.ndarray
    landing: int
    # agent warps to a block, as many as fit: each block holds a share of an SM that a
    # kernel needing the whole SM (a matrix product's tile) cannot then use, so the agents
    # hold as few SMs as they can; bench.bam --price --pack measures what that saves
    warps_per_block: int = 32

    def __init__(self, nrings: int, depth: int) -> None:
        import cupy as cp

        self._cp = cp
        self.nrings, self.depth = nrings, depth
        self._gen = 0
        self._aborted = False
        self._kept: list[Any] = []
        self._launch_kept: tuple[Any, ...] = ()
        self._dev: dict[str, Any] = {}
        self.kernels_done = True

    def _arrays(self, ring_table: np.ndarray, slot_bytes: int, /) -> None:
        """The slot and control arrays in GPU memory, ``ring_table`` (the backend's ring
        descriptors, its agents' second argument: ``rings``) beside them, and the GioQueue
        descriptor, which holds no backend word."""
        cp, slots = self._cp, self.nrings * self.depth
        d = self._dev
        d.update(rings=cp.asarray(ring_table), state=cp.zeros(slots, cp.int32),
                 res=cp.zeros(slots, cp.int32), off=cp.zeros(slots, cp.uint64),
                 len_fd=cp.zeros(slots, cp.uint64),
                 control=cp.zeros(contract.CONTROL_WORDS, cp.int32),
                 ring_stats=cp.zeros(2 * self.nrings, cp.uint64))
        d["queue"] = cp.asarray(contract.build(contract.GIO_QUEUE, {
            **{name: self.ptr(name) for name in ARRAYS},
            "nrings": self.nrings, "depth": self.depth, "landing": self.landing,
            "slot_bytes": slot_bytes}))
        self.agent_stream = cp.cuda.Stream(non_blocking=True)
        self.control_stream = cp.cuda.Stream(non_blocking=True)

    @property
    def descriptor(self) -> Any:
        """The GioQueue struct in GPU memory: pass it to kernels as ``const GioQueue*``."""
        return self._dev["queue"]

    def ptr(self, name: str) -> int:
        """Device address of one of the queue's arrays."""
        return self._dev[name].data.ptr

    def agent_grid(self) -> tuple[tuple[int], tuple[int]]:
        """The agents' launch shape: (blocks,), (threads,) for a warp per ring,
        ``warps_per_block`` to a block, as many as the agents' kernel may have (the last
        block's spare warps return at once)."""
        most = getattr(getattr(self, "_agent", None), "max_threads_per_block", 1024) // 32
        w = max(1, min(self.warps_per_block, self.nrings, most))
        return (-(-self.nrings // w),), (32 * w,)

    # what a backend defines
    def _launch(self) -> None:
        """Launch the agent warps (``agent_grid``) on ``agent_stream``."""
        raise NotImplementedError

    def completed(self) -> int:
        """Requests completed on all rings so far, read without asking the GPU."""
        raise NotImplementedError

    def report(self, stall_ns: int) -> str:
        """The one-paragraph diagnostic of a queue where nothing completed for ``stall_ns``."""
        raise NotImplementedError

    def wake(self, check: bool = True) -> int:
        """Wake what serves the rings where it went to sleep; how many were woken. With
        ``check``, a broken ring raises."""
        return 0

    def _before_start(self) -> None:
        """What the backend needs before the agents launch (QueueStalled if it cannot)."""

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
        self._before_start()
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
        self._launch()
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
        """Stop agents and requesters now (requests in flight are abandoned); True when every
        kernel stopped within ABORT_WAIT_S. For error paths: the error that brought us here
        is the one to report."""
        if self.kernels_done:
            return True
        self._aborted = True
        streams = (self.agent_stream, *other_streams)
        try:
            self.set(C_ABORT, 1)
            deadline = time.monotonic() + ABORT_WAIT_S
            while not all(s.done for s in streams) and time.monotonic() < deadline:
                self.wake(check=False)
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

    def keep_alive(self, *objects: Any) -> None:
        """Arrays of a kernel that uses this queue: kept with it if that kernel never stops."""
        self._kept.extend(objects)

    def wait(self, streams: tuple[Any, ...], stall_ns: int, poll_s: float = POLL_S) -> None:
        """Until the agents and ``streams`` are done: wake what serves the rings, and stop
        everything with the diagnostic (QueueStalled) once no request has completed for
        ``stall_ns``. A long batch that keeps completing requests is not a stall."""
        dog = Watchdog(stall_ns, time.monotonic_ns())
        everything = (self.agent_stream, *streams)
        while not all(s.done for s in everything):
            self.wake()
            if dog.update(self.completed(), time.monotonic_ns()):
                self.stall(stall_ns, streams)
            time.sleep(poll_s)
        self.kernels_done = True

    def stall(self, stall_ns: int, other_streams: tuple[Any, ...] = ()) -> None:
        """Abort with the full diagnostic (``report``)."""
        self.abort(self.report(stall_ns), other_streams)

    def wedged(self, why: str) -> bool:
        """True (the queue kept for good, the GPU marked unusable) when a kernel never
        stopped: ``close`` must then free nothing it may still write into."""
        if self.kernels_done:
            return False
        keep_for_good(self)
        gpu.mark_wedged(self._cp.cuda.Device().id, why)
        return True

    def close(self) -> None:
        """Release the rings and the memory (what a kernel may still touch stays: wedged)."""
        raise NotImplementedError
