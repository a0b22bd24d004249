"""One watchdog for every data path: a path whose I/Os stop completing ends its job with a
diagnostic (Stalled), never an endless hang. For an io_uring ring the diagnostic says which
part held the I/Os: gpufio (SQEs it published that the kernel never consumed, or
completions it never reaped), the kernel (it consumed them, and no disk has them in
flight) or the drive (its disk's own in-flight counter is not zero)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from gpufio.facts.device import disk_inflight

if TYPE_CHECKING:
    from gpufio.io.uring import Ring

_U32 = 0xFFFFFFFF
_NEED_WAKEUP = 1 << 0  # io_uring's IORING_SQ_NEED_WAKEUP

# how long a CPU-driven path may go without a completion while I/Os are in flight
STALL_LIMIT_NS = 10_000_000_000


class Stalled(RuntimeError):
    """I/Os were in flight but none completed within the path's limit; the message says
    what was in flight and where it stood."""


class Watchdog:
    """Notices when completions stop: ``update`` is true once the completion count has not
    moved for ``timeout_ns`` while work was outstanding."""

    def __init__(self, timeout_ns: int, now_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self._count = -1
        self._since = now_ns

    def update(self, completed: int, now_ns: int) -> bool:
        """Feed the latest completion count; True when the path is stuck."""
        if completed != self._count:
            self._count, self._since = completed, now_ns
            return False
        return now_ns - self._since > self.timeout_ns


def ring_verdict(state: Mapping[str, int],
                 disks: Mapping[str, tuple[int, int]] | None) -> str:
    """Which part holds a stalled ring's I/Os, from its ``state`` (uring.Ring.state) and
    ``disks``: each target disk's (reads, writes) in flight (None: no disk to ask)."""
    inflight = state["inflight"]
    if not inflight:
        return "nothing is in flight on the ring: what waits is not its I/O"
    unconsumed = (state["sq_tail"] - state["sq_head"]) & _U32
    if unconsumed:
        asleep = "; its SQ thread sleeps (NEED_WAKEUP)" if state["sq_flags"] & _NEED_WAKEUP \
            else ""
        return (f"held by gpufio: {unconsumed} of the {inflight} SQEs in flight were published "
                f"but never consumed by the kernel (sq_tail {state['sq_tail']}, sq_head "
                f"{state['sq_head']}){asleep}")
    unreaped = (state["cq_tail"] - state["cq_head"]) & _U32
    if unreaped:
        return (f"held by gpufio: {unreaped} completions were posted but not reaped (cq_tail "
                f"{state['cq_tail']}, cq_head {state['cq_head']})")
    busy = {d: rw for d, rw in (disks or {}).items() if sum(rw)}
    if busy:
        at = ", ".join(f"{d} {r} reads and {w} writes" for d, (r, w) in busy.items())
        return (f"held by the drive: the kernel consumed all {inflight} SQEs (sq_head = sq_tail) "
                f"and the disk has requests in flight at its driver and device ({at}, every "
                "process's, /sys/block/*/inflight)")
    where = (f"{', '.join(disks)} has none in flight" if disks else
             "no disk holds the targets to ask")
    return (f"held by the kernel: it consumed all {inflight} SQEs (sq_head = sq_tail) and "
            f"completed none, and {where}: io-wq, the block layer's queues or the filesystem "
            "hold them")


def ring_report(ring: "Ring", fds: Iterable[int]) -> str:
    """A stalled ring's verdict (``ring_verdict``), then its state, the kernel's view of it
    (fdinfo) and its target disks' in-flight counters: what a stall message says."""
    disks: dict[str, tuple[int, int]] = {}
    for fd in dict.fromkeys(int(fd) for fd in fds):
        try:
            found = disk_inflight(fd)
        except OSError:
            found = None
        if found is not None:
            disks[found[0]] = found[1:]
    state = ring.state()
    kernel = ring.kernel_view()
    return (f"{ring_verdict(state, disks)}; ring {state}"
            + (f"; kernel's view {kernel}" if kernel else "")
            + (f"; disks in flight {disks}" if disks else ""))
