"""Live progress on a terminal, shared by the workloads' live views: a Rich table redrawn in
place (on stderr, so ``--format json`` on stdout stays machine-readable) and the interval
that throttles plain lines off a terminal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # Rich loads with the first live table: a quiet run starts without it
    from rich.table import Table


class Interval:
    """Says whether ``every_s`` seconds have passed since it last said yes; the first call
    always says yes. The clock is monotonic (seconds since boot), so "never" must be a
    sentinel, not 0: on a host up for less than ``every_s`` a 0 would hide the first line."""

    def __init__(self, every_s: float) -> None:
        self.every_ns = int(every_s * 1e9)
        self._last: int | None = None

    def due(self, force: bool = False) -> bool:
        """True (and restart the interval) when the interval has passed, or ``force``."""
        now = time.monotonic_ns()
        if not force and self._last is not None and now - self._last < self.every_ns:
            return False
        self._last = now
        return True


class LiveTable:
    """A table redrawn in place on ``stream`` (stderr, so stdout stays the result)."""

    def __init__(self, stream: TextIO, first: Table) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(first, console=Console(file=stream), refresh_per_second=4,
                          transient=False)

    def __enter__(self) -> "LiveTable":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def show(self, t: Table) -> None:
        self._live.update(t)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No redrawing for the block (a question being asked below the table)."""
        self._live.stop()
        try:
            yield
        finally:
            self._live.start()
