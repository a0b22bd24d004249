"""A workload's jobs run one after another, Ctrl-C ending the current one at its next step
(an iteration, a round) with what it measured so far kept: shared by the workloads that
time their own steps."""

from __future__ import annotations

import signal
from typing import Any, Callable, ContextManager, Sequence

from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.workloads.block import world

# (job, stop, progress) -> the job's results
RunJob = Callable[[Job, Callable[[], bool], Any], list[dict[str, Any]]]


def run_each(jobs: Sequence[Job], run_job: RunJob,
             progress: ContextManager[Any]) -> tuple[list[dict[str, Any]], bool]:
    """Every job's results in order, and whether Ctrl-C ended the run."""
    if jobs and world.detect() is not None:
        raise BadInput(f"workload '{jobs[0].workload}' runs as one process; start it without "
                       "an MPI launcher (the block workload runs as MPI ranks)")
    interrupted: list[bool] = []

    def on_sigint(*_: Any) -> None:
        interrupted.append(True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    results: list[dict[str, Any]] = []
    try:
        with progress as shown:
            for job in jobs:
                if interrupted:
                    break
                results.extend(run_job(job, lambda: bool(interrupted), shown))
    finally:
        signal.signal(signal.SIGINT, previous)
    return results, bool(interrupted)
