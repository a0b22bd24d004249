"""The CPU engines' per-I/O loops in compiled code (io/loops.c), for an engine to hand its
batches of offsets to: with no Python between an I/O's submission and its reaping, a latency
at queue depth 1 is the device's and the kernel's, not the interpreter's.

``NativeLoop.run`` issues one batch (target indexes, offsets, and which of them write) and
returns the completions as arrays the engine records as it records its Python loop's; the
loop's state (slots, what is in flight) lives in C between calls. ``available()`` is False
where native/build.py builds nothing (no compiler, GPUFIO_NATIVE=0): engines then run their
Python loop, which gives the same results.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np

from gpufio.io.cuda import KERNELS
from gpufio.io.nvme import passthru, spec
from gpufio.native import loops as native_loops

SOURCES = (Path(__file__).with_name("loops.c"),
           Path(__file__).resolve().parent.parent / "core" / "pattern_fill.c")
# the NVMe command encoder the passthrough ring's SQEs come from, and its layout
HEADERS = (KERNELS / "nvme_cmd.cuh",)
OPTIONS = (f"-I{KERNELS}", *spec.defines(), *passthru.defines())
NULL, PSYNC, URING = "gf_null", "gf_psync", "gf_uring"
TIMED_OUT, STOPPED, RAMP = 1, 2, 4  # struct gf_loop.status bits
# how long one call may run before it hands its completions back: the live counters and
# the latency bins move at least this often
CALL_NS = 50_000_000


def _library() -> Any:
    """The compiled loops, typed (native/loops.py), or None."""
    return native_loops.library(SOURCES, HEADERS, OPTIONS)


def available() -> bool:
    """Whether the compiled loops are there (built and loaded now if they were not)."""
    return _library() is not None


def _addr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class NativeLoop:
    """One worker's compiled loop of kind ``kind`` (NULL, PSYNC or URING) over ``depth``
    slots of ``bs`` bytes at ``bufs`` (an address). ``stop``: the address of the job's
    control words (int64 stop, then measuring: a call begun before measuring returns once
    it is set); ``fds``: each target's descriptor (uring: or registered index); ``seeds``:
    each target's pattern seed, for writes (None: the job does not write); ``batch``: the
    most I/Os one ``run`` is given. ``ring`` (io/uring.Ring) and ``word0`` (each direction's
    first SQE word, without the descriptor) for URING, whose SQE rows hold each slot's
    address, length and user_data (the slot) already; ``stop_ud``: the user_data of the
    ring's stop poll (0: none, and every wait has a limit); ``wait_ns``: a wait's limit;
    ``batch_submit``: the most I/Os one io_uring_enter submits (0: every free slot's);
    ``spin_ns``: how long a wait first looks for a completion before it sleeps. ``nvme``:
    for a passthrough ring (SQE128|CQE32), each target's (namespace id, log2 of its LBA
    size): every SQE is then built whole as an NVMe command with ``sqe_flags`` and
    ``cmd_flags`` (uring_cmd_flags), and ``word0`` is unused."""

    def __init__(self, kind: str, *, depth: int, bs: int, bufs: int, stop: int,
                 fds: np.ndarray, seeds: np.ndarray | None, magic: int, halt_on_error: bool,
                 batch: int, writes: bool, nop: bool = False, ring: Any = None,
                 word0: tuple[int, int] = (0, 0), stop_ud: int = 0, wait_ns: int = 0,
                 batch_submit: int = 0, spin_ns: int = 0,
                 nvme: tuple[np.ndarray, np.ndarray] | None = None, sqe_flags: int = 0,
                 cmd_flags: int = 0) -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError("the compiled loops are not available here")
        self._fn = getattr(lib, kind)
        self._fds = np.ascontiguousarray(fds, dtype=np.int64)
        self._seeds = None if seeds is None else np.ascontiguousarray(seeds, dtype=np.uint64)
        self._free = np.arange(depth - 1, -1, -1, dtype=np.int64)  # slot 0 is handed out first
        self._t_issue = np.zeros(depth, np.int64)
        self._slot_tgt = np.zeros(depth, np.int64)
        self._slot_write = np.full(depth, int(writes), np.int64)
        cap = batch + depth
        self.lat = np.zeros(cap, np.int64)
        self.tgt = np.zeros(cap, np.int32)
        self.res = np.zeros(cap, np.int32)
        self.write = np.zeros(cap, np.uint8)
        self._out = native_loops.Out(_addr(self.lat), _addr(self.tgt), _addr(self.res),
                                     _addr(self.write))
        L = self._loop = native_loops.Loop()
        L.depth, L.bs, L.stop, L.bufs = depth, bs, stop, bufs
        L.fds, L.seeds, L.magic = _addr(self._fds), _addr(self._seeds), magic
        L.halt_on_error, L.nop = int(halt_on_error), int(nop)
        L.free_slots, L.t_issue = _addr(self._free), _addr(self._t_issue)
        L.slot_tgt, L.slot_write, L.nfree = _addr(self._slot_tgt), _addr(self._slot_write), depth
        if ring is not None:
            words = ring.ring_words
            L.ring_fd, L.sqpoll = ring.fd, int(ring.sqpoll)
            for name in ("sq_head", "sq_tail", "sq_flags", "cq_head", "cq_tail", "sqes", "cqes"):
                setattr(L, name, words[name])
            L.sq_array = words["sq_array"]
            L.sq_entries, L.cq_mask = ring.sq_entries, ring.cq_entries - 1
            L.sq_tail_local, L.cq_head_local = ring.local_heads()
            L.word0[0], L.word0[1] = word0
            L.stop_ud, L.wait_ns, L.batch_submit = stop_ud, wait_ns, batch_submit
            L.spin_ns = spin_ns
        if nvme is not None:
            self._nsids, self._shifts = (np.ascontiguousarray(a, dtype=np.uint64) for a in nvme)
            L.nvme, L.nsids, L.lba_shifts = 1, _addr(self._nsids), _addr(self._shifts)
            L.sqe_flags, L.cmd_flags = sqe_flags, cmd_flags
        self._loop_ref, self._out_ref, self._consumed, self._consumed_ref = \
            native_loops.references(L, self._out)

    @property
    def inflight(self) -> int:
        """I/Os taken into slots and not yet reaped (URING: some maybe not yet submitted)."""
        return self._loop.inflight

    @property
    def slat_mean_ns(self) -> float | None:
        """fio's slat of the I/Os the measured window's calls submitted: the mean ns from
        each one's latency stamp (taken into its slot) to the call that submitted it; None
        before any (URING only)."""
        L = self._loop
        return L.slat_sum / L.slat_n if L.slat_n else None

    @property
    def spin_ns(self) -> int:
        """How long each wait first looks for a completion (0: it sleeps at once)."""
        return self._loop.spin_ns

    @property
    def stopped(self) -> bool:
        """True once the loop saw the job's stop (or halted on a failed I/O)."""
        return bool(self._loop.status & STOPPED)

    @property
    def began_in_ramp(self) -> bool:
        """True when the last call began before the measured window (and so ended when it
        began): its completions are the ramp's."""
        return bool(self._loop.status & RAMP)

    @property
    def timed_out(self) -> bool:
        """True when the last call's wait (after the stop) ended without a completion."""
        return bool(self._loop.status & TIMED_OUT)

    def run(self, tgt: np.ndarray, offs: np.ndarray, writes: np.ndarray | None,
            deadline_ns: int, due: np.ndarray | None = None) -> tuple[int, int]:
        """Issue the batch (``writes``: a bool per I/O, None when all go one way; ``due``:
        under a rate cap, each I/O's due time, core/rate.Pacer.schedule's, None: at once);
        returns (I/Os of it issued, completions now in ``lat``, ``tgt``, ``res``, ``write``).
        An empty batch waits for what is in flight (URING). The call returns by
        ``deadline_ns`` (perf_counter_ns; NULL: only when it sleeps for a due time)."""
        n = len(offs)
        tgt = np.ascontiguousarray(tgt, dtype=np.int32)
        offs = np.ascontiguousarray(offs, dtype=np.uint64)
        wr = None if writes is None else np.ascontiguousarray(writes).view(np.uint8)
        at = None if due is None else np.ascontiguousarray(due, dtype=np.int64)
        k = self._fn(self._loop_ref, tgt.ctypes.data, offs.ctypes.data, _addr(wr), _addr(at),
                     n, deadline_ns, self._out_ref, self._consumed_ref)
        if k < 0:
            raise OSError(-k, f"io_uring_enter failed: {errno.errorcode.get(-k, -k)} "
                              f"({os.strerror(-k)})")
        return self._consumed.value, k
