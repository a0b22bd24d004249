"""Runs a GNN profile: the workload's registry entry. One job after another through
run.run_job, progress on stderr (a live table on a terminal, plain lines elsewhere), Ctrl-C
ending the current job after its iteration, and the document report.py builds."""

from __future__ import annotations

import contextlib
import sys
import time
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
        g = job.workload_settings
        if not self._interval.due(force=done == g.iterations):
            return
        phase = " (warm-up)" if done <= g.warmup else ""
        times = ", ".join(f"{s} {ns / 1e6:.1f} ms" for s, ns in zip(timing.STAGES, stage_ns))
        events.emit("progress", f"gpufio: {job.name}: iteration {done}/{g.iterations}"
                                f"{phase}: {times}")


class LiveStages:
    """On a terminal, a live table with a row per job: its iteration, warm-up or timed, and
    the last iteration's stage times, updated after every iteration."""

    COLUMNS = ("job", "engine", "iteration", "phase", *(f"{s} ms" for s in timing.STAGES))

    def __init__(self, stream: TextIO | None = None) -> None:
        self._rows: dict[str, dict[str, str]] = {}
        self._live = LiveTable(stream or sys.stderr, self._table())

    def _table(self) -> Table:
        # the result's table shows the timed iterations' means: these are one iteration's
        return table(list(self._rows.values()), "gpufio: GNN jobs (stage times of the last "
                     "iteration; the result has the timed iterations' means)",
                     left=("job", "engine", "phase"), columns=self.COLUMNS)

    def __enter__(self) -> "LiveStages":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__()

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        g = job.workload_settings
        phase = "warm-up" if done <= g.warmup else "timed"
        self._rows[job.name] = dict(zip(self.COLUMNS, [
            job.name, job.engine, f"{done}/{g.iterations}", phase,
            *(f"{ns / 1e6:.1f}" for ns in stage_ns)]))
        self._live.show(self._table())


# the iterations, or the seconds, after which a job's rate is taken for its ETA: enough for
# the first iteration's one-off costs not to dominate, soon enough on a slow drive
ETA_AFTER_ITERATIONS = 10
ETA_AFTER_S = 30.0


def _duration(seconds: float) -> str:
    """``seconds`` as the ETA line says it: 45 s, 12 min, 3 h 05 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


class Eta:
    """With the first iteration of all, the size of the run; once per job, after its first
    iterations (ETA_AFTER_ITERATIONS or ETA_AFTER_S, whichever comes first): how long an
    iteration takes and when the job will end at that rate, as events, so a run of hours
    says so early; it then hands every call on to ``show`` (the live table or the plain
    lines)."""

    def __init__(self, jobs: list[Any], show: Any = None,
                 clock: Any = time.monotonic) -> None:
        self._later = {job.name: len(jobs) - 1 - i for i, job in enumerate(jobs)}
        self._total = sum(job.workload_settings.iterations for job in jobs)
        self._jobs = len(jobs)
        self._show, self._clock = show, clock
        self._first: dict[str, float] = {}
        self._said: set[str] = set()
        self._announced = False

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        total = job.workload_settings.iterations
        now = self._clock()
        if not self._announced:  # the first job's data is ready: the run is under way
            self._announced = True
            events.emit("eta", f"gpufio: {self._jobs} GNN job(s), {self._total} iterations in "
                               "all; each job's ETA follows its first iterations")
        start = self._first.setdefault(job.name, now) if done == 1 else self._first.get(job.name)
        if (start is not None and job.name not in self._said and 1 < done < total
                and (done - 1 >= ETA_AFTER_ITERATIONS or now - start >= ETA_AFTER_S)):
            self._said.add(job.name)
            each = (now - start) / (done - 1)
            left = each * (total - done)
            end = time.strftime("%H:%M", time.gmtime(time.time() + left))
            later = self._later.get(job.name, 0)
            events.emit("eta", f"gpufio: {job.name}: {each:.2f} s an iteration over its first "
                               f"{done}: about {_duration(left)} more for its {total} "
                               f"iterations (ends near {end} UTC)"
                               + (f"; {later} more job(s) after it" if later else ""))
        if self._show is not None:
            self._show(job, done, stage_ns)


def _progress(prof: Profile, quiet: bool) -> Any:
    """What shows progress: nothing, the live table on a terminal, else plain lines; each
    with the jobs' ETAs."""
    if quiet:
        return contextlib.nullcontext(None)
    if sys.stderr.isatty():
        return _EtaLive(prof.jobs)
    return contextlib.nullcontext(Eta(prof.jobs, ProgressLines()))


class _EtaLive(LiveStages):
    """The live table, with the ETA events."""

    def __init__(self, jobs: list[Any]) -> None:
        super().__init__()
        self._eta = Eta(jobs)

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        self._eta(job, done, stage_ns)
        super().__call__(job, done, stage_ns)


def run_profile(prof: Profile, quiet: bool = False) -> dict[str, Any]:
    """Run every job of a GNN profile; Ctrl-C ends the current job after its iteration.
    With the first iteration, the size of the protocol; an ETA follows each job's first
    iterations."""
    results, interrupted = run_each(prof.jobs, run_trainers, _progress(prof, quiet))
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
