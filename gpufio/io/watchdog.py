"""One watchdog for every data path: a path whose I/Os stop completing ends its job with a
diagnostic (Stalled), never an endless hang."""

from __future__ import annotations

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
