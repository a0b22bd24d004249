"""The host's side of GPU-driven io_uring rings: setup, flow-control sizing, wake-ups, watchdog.

A GPU producer needs rings whose memory the GPU can reach and a kernel thread that submits
for it: SQPOLL + NO_MMAP (ring memory gpufio allocates, page-aligned and zero-filled, then
registered with CUDA as mapped memory) + NO_SQARRAY (the SQ index array would be one more
host-memory write per I/O). The host never touches an SQE or CQE; it only wakes SQPOLL
threads that fell asleep, and watches for progress so a stuck path ends with a diagnostic
instead of a hang. Everything here but ``GpuRings`` runs without a GPU, so CI tests it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.io import uring
from gpufio.io.gio import contract

CQ_FACTOR = 2


def ring_sizes(iodepth: int, ring_entries: int | None, where: str = "") -> tuple[int, int]:
    """(SQ entries, CQ entries) for a ring with ``iodepth`` request slots.

    The GPU never calls io_uring_enter, so a CQE that overflows stays in the kernel and the
    run hangs: the CQ must hold every I/O that can be in flight. A ring has at most
    ``iodepth`` slots, hence at most that many reads in flight, so iodepth <= SQ entries <=
    CQ entries is enough; the kernel rounds both up to powers of two, and so does this.
    """
    sq = 1 << (uring.sq_entries(iodepth, ring_entries or 0, where) - 1).bit_length()
    return sq, CQ_FACTOR * sq


def default_rings(ntargets: int, cpus: int) -> int:
    """Half the cores, at most 8, at least one per target: each ring's SQPOLL thread spins
    on a core, and on RAM-backed targets hands its reads to an io-wq worker that needs
    another; more rings than that spun cores without adding IOPS."""
    return max(ntargets, min(8, cpus // 2), 1)


class RingOverflow(RuntimeError):
    """A GPU-driven ring's CQ overflowed: the flow-control invariant was broken."""


@dataclass(frozen=True)
class RingState:
    """What a stall diagnostic prints for one ring."""

    sq_head: int
    sq_tail: int
    cq_head: int
    cq_tail: int
    sq_flags: int

    @property
    def inflight(self) -> int:
        """Submitted reads whose completions have not been posted yet."""
        return (self.sq_tail - self.cq_tail) & 0xFFFFFFFF

    def describe(self) -> str:
        flags = [n for bit, n in ((uring.SQ_NEED_WAKEUP, "NEED_WAKEUP"),
                                  (uring.SQ_CQ_OVERFLOW, "CQ_OVERFLOW")) if self.sq_flags & bit]
        return (f"sq head {self.sq_head} tail {self.sq_tail}, cq head {self.cq_head} tail "
                f"{self.cq_tail}, in flight {self.inflight}, flags {'|'.join(flags) or 0}")


def stall_report(timeout_ns: int, rings: list[RingState], slots: dict[str, int]) -> str:
    """The one-paragraph diagnostic for a stuck GPU path."""
    per_ring = "; ".join(f"ring {i}: {r.describe()}" for i, r in enumerate(rings))
    states = ", ".join(f"{k} {v}" for k, v in slots.items() if v)
    return (f"no read completed for {timeout_ns / 1e9:g} s; kernels stopped. {per_ring}. "
            f"request slots: {states or 'none busy'}")


class GpuRings:
    """``n`` SQPOLL rings in CUDA-registered memory, with their device descriptors."""

    def __init__(self, n: int, sq_entries: int, cq_entries: int, *, idle_ms: int,
                 cpus: tuple[int, ...], sq_threads: int = 0, big: bool = False) -> None:
        """``sq_threads`` SQPOLL threads serve the ``n`` rings (0: one each): ring i starts
        its own when i < sq_threads, else shares ring i % sq_threads's thread and io-wq.
        ``cpus`` pins the threads, round-robin. ``big``: 128-byte SQEs and 32-byte CQEs,
        for NVMe passthrough commands."""
        from gpufio.io import gpu

        threads = sq_threads or n
        self.rings: list[uring.Ring] = []
        self._registered: list[int] = []
        try:
            for i in range(n):
                own = i < threads
                ring = uring.Ring(sq_entries, cq_entries=cq_entries, sqpoll=True,
                                  sq_thread_idle_ms=idle_ms,
                                  sq_thread_cpu=cpus[i % len(cpus)] if cpus and own else None,
                                  user_memory=True, no_sqarray=True,
                                  attach_to=None if own else self.rings[i % threads].fd,
                                  big=big)
                self.rings.append(ring)
                for region in ring.regions:
                    gpu.register_host(region.addr, region.size, mapped=True)
                    self._registered.append(region.addr)
        except uring.UringError as e:
            self.close()
            raise BadInput(f"GPU-initiated I/O rings: {e}") from None
        except BaseException:
            self.close()
            raise
        # each ring's words (contract.URING_RING), less the agent's own (sqe_head, ns)
        self.descriptors = [{**{k: r.ring_words[k] for k in contract.URING_RING
                                if k not in ("entries", "sqe_head", "ns")},
                             "entries": r.sq_entries | r.cq_entries << 32} for r in self.rings]

    def wake(self, check: bool = True) -> int:
        """Wake every SQPOLL thread that went to sleep (NEED_WAKEUP); how many were woken.
        With ``check``, a CQ that overflowed raises RingOverflow: its completions sit in the
        kernel, which the GPU never asks for them, so the run could only hang."""
        woken = 0
        for i, r in enumerate(self.rings):
            flags = r.sq_flags
            if check and flags & uring.SQ_CQ_OVERFLOW:
                raise RingOverflow(f"ring {i}: its completion queue overflowed (more reads in "
                                   f"flight than its {r.cq_entries} CQ entries): a sizing bug")
            if flags & uring.SQ_NEED_WAKEUP:
                r.enter(0, 0, uring.ENTER_SQ_WAKEUP)
                woken += 1
        return woken

    def completed(self) -> int:
        """Completions posted on all rings so far (the CQ tails, read from host memory): what
        a watchdog watches without asking the GPU."""
        return sum(r.state()["cq_tail"] for r in self.rings)

    def states(self) -> list[RingState]:
        """Heads, tails and flags of every ring, as the kernel and the GPU left them."""
        out = []
        for r in self.rings:
            s = r.state()
            out.append(RingState(s["sq_head"], s["sq_tail"], s["cq_head"], s["cq_tail"],
                                 s["sq_flags"]))
        return out

    def close(self) -> None:
        """Unregister the memory from CUDA, then close the rings (cancelling what is left)."""
        from gpufio.io import gpu

        for addr in self._registered:
            gpu.unregister_host(addr)
        self._registered = []
        for r in self.rings:
            r.close()
        self.rings = []
