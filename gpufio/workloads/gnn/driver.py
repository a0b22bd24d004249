"""Runs a GNN profile: the workload's registry entry. One job after another through
run.run_job, progress on stderr (a live table on a terminal, plain lines elsewhere), Ctrl-C
ending the current job after its iteration, and the document report.py builds."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, TextIO

from rich.table import Table

from gpufio.core import events
from gpufio.core.errors import BadInput
from gpufio.core.job import Job, Profile
from gpufio.results.live import Interval, LiveTable
from gpufio.results.render import table
from gpufio.workloads.gnn import dataset, timing
from gpufio.workloads.gnn.parallel import run_trainers
from gpufio.workloads.gnn.report import document
from gpufio.workloads.sequence import run_each


class ProgressLines:
    """A line on stderr every ``every_s`` seconds while a job runs: which iteration, and the
    last iteration's stage times (long runs must not look hung)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._interval = Interval(every_s)

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        g = job.workload_options
        if not self._interval.due(force=done == g["iterations"]):
            return
        phase = " (warm-up)" if done <= g["warmup"] else ""
        times = ", ".join(f"{s} {ns / 1e6:.1f} ms" for s, ns in zip(timing.STAGES, stage_ns))
        events.emit("progress", f"gpufio: {job.name}: iteration {done}/{g['iterations']}"
                                f"{phase}: {times}")


class LiveStages:
    """On a terminal, a live table with a row per job: its iteration, warm-up or timed, and
    the last iteration's stage times, updated after every iteration."""

    COLUMNS = ("job", "engine", "iteration", "phase", *(f"{s} ms" for s in timing.STAGES))

    def __init__(self, stream: TextIO | None = None) -> None:
        self._rows: dict[str, dict[str, str]] = {}
        self._live = LiveTable(stream or sys.stderr, self._table())

    def _table(self) -> Table:
        return table(list(self._rows.values()), "gpufio: GNN jobs",
                     left=("job", "engine", "phase"), columns=self.COLUMNS)

    def __enter__(self) -> "LiveStages":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__()

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        g = job.workload_options
        phase = "warm-up" if done <= g["warmup"] else "timed"
        self._rows[job.name] = dict(zip(self.COLUMNS, [
            job.name, job.engine, f"{done}/{g['iterations']}", phase,
            *(f"{ns / 1e6:.1f}" for ns in stage_ns)]))
        self._live.show(self._table())


def _progress(quiet: bool) -> Any:
    """What shows progress: nothing, the live table on a terminal, else plain lines."""
    if quiet:
        return contextlib.nullcontext(None)
    if sys.stderr.isatty():
        return LiveStages()
    return contextlib.nullcontext(ProgressLines())


def run_profile(prof: Profile, quiet: bool = False) -> dict[str, Any]:
    """Run every job of a GNN profile; Ctrl-C ends the current job after its iteration."""
    results, interrupted = run_each(prof.jobs, run_trainers, _progress(quiet))
    return document(results, prof.path, interrupted)


def targets(job: Job, lay_out: bool) -> list[str]:
    """The job's feature files; laid out: the graph and the generated table built (on the
    CPU: the values are the same) as its first run would."""
    return dataset.prepare(job).paths if lay_out else dataset.target_paths(job)


def run_workload(prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """The registry's entry: run the profile once (a GNN job times its own iterations)."""
    if repeat != 1:
        raise BadInput("--repeat: a GNN job runs once and reports its timed iterations; "
                       "raise 'iterations' instead")
    return run_profile(prof, quiet)
