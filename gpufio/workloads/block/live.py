"""The block workload's live progress while jobs run: a Rich table on a terminal, plain
lines in CI logs (through results/live, which the GNN workload's progress shares).

It only renders the runner's Snapshots; it never touches measurement state. Output goes to
stderr so that ``--format json`` on stdout stays machine-readable.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING, TextIO

from gpufio.core import space
from gpufio.results.live import Interval, LiveTable
from gpufio.results.render import table
from gpufio.run.records import DONE, DONE_BOTH, Snapshot

if TYPE_CHECKING:  # Rich loads with the first live table: a quiet run starts without it
    from rich.table import Table

PLAIN_EVERY_S = 2.0
LIVE_COLUMNS = ("job", "engine", "state", "IOPS", "MB/s", "p50 us", "p99 us", "progress", "ETA")


def _done(s: Snapshot) -> bool:
    return s.state in (DONE, DONE_BOTH)


def _eta(s: Snapshot) -> str:
    return f"{s.eta_s:.0f}s" if s.eta_s is not None and not _done(s) else "-"


def _number(value: float | None, scale: float, spec: str) -> str:
    """``value / scale`` as ``spec`` formats it, or "-" where there is none yet."""
    return "-" if value is None else format(value / scale, spec)


def _numbers(s: Snapshot) -> dict[str, str]:
    """The rate and latency cells of a job's row or line."""
    return {"IOPS": _number(s.iops, 1, ",.0f"), "MB/s": _number(s.bw_bytes, 1e6, ",.1f"),
            "p50 us": _number(s.p50_ns, 1e3, ",.1f"), "p99 us": _number(s.p99_ns, 1e3, ",.1f"),
            "progress": "-" if s.progress is None else f"{100 * s.progress:.0f}%"}


def _table(snaps: list[Snapshot], note: str = "") -> Table:
    """The live table; a finished job's row carries its result's numbers (run/jobrun.JobRun),
    and ``note`` says what the screen's result below is beside them."""
    finished = bool(snaps) and all(_done(s) for s in snaps)
    rows = [{"job": s.name, "engine": s.engine, "state": s.state, **_numbers(s),
             "ETA": _eta(s)} for s in snaps]
    title = "gpufio: finished" if finished else "gpufio: running"
    return table(rows, f"{title} ({note})" if note else title,
                 left=("job", "engine", "state"), columns=LIVE_COLUMNS)


class LiveDisplay:
    """Context manager; pass ``update`` to the runner as its on_tick callback. ``note``
    goes into the table's title: what this run is where the result is not its numbers alone
    (one of --repeat's runs, one MPI rank's share)."""

    def __init__(self, stream: TextIO | None = None, note: str = "") -> None:
        self._stream = stream or sys.stderr
        self._note = note
        self._tty = self._stream.isatty()
        self._live: LiveTable | None = None
        self._plain = Interval(PLAIN_EVERY_S)
        self._stack = ExitStack()

    def __enter__(self) -> "LiveDisplay":
        if self._tty:
            self._live = self._stack.enter_context(LiveTable(self._stream,
                                                             _table([], self._note)))
            # a layout's question (core/space) is asked with the table standing still
            self._stack.enter_context(space.aside(self._live.paused))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def update(self, snaps: list[Snapshot]) -> None:
        """Show the latest snapshots (throttled to one plain line set per 2 s off a TTY)."""
        if self._live is not None:
            self._live.show(_table(snaps, self._note))
            return
        running = [s for s in snaps if s.state in ("ramp", "run")]
        if not running or not self._plain.due():
            return
        for s in running:
            n = _numbers(s)
            p50, p99 = (n[k] + "us" * (n[k] != "-") for k in ("p50 us", "p99 us"))
            print(f"gpufio: {s.name} [{s.engine}] {s.state} {n['progress']} iops={n['IOPS']} "
                  f"MB/s={n['MB/s']} p50={p50} p99={p99} eta={_eta(s)}",
                  file=self._stream, flush=True)
