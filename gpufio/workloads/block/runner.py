"""Runs a profile: check the machine's limits, open every job's targets, then each run
group's jobs at once (one job, all of them with concurrent, or those between two of fio's
stonewalls) with their preconditioning before and read-back after."""

from __future__ import annotations

from typing import Callable

from gpufio.core import events
from gpufio.core.errors import WorkerHung
from gpufio.core.job import Profile
from gpufio.run.jobrun import JobRun, drive, job_advice, stop_all
from gpufio.workloads.block.limits import check_machine_limits
from gpufio.run.opening import open_job
from gpufio.workloads.block.phases import invalidate_before, preconditions, read_back
from gpufio.run.records import JobResult, RunOutcome, Snapshot


def run_profile(profile: Profile, on_tick: Callable[[list[Snapshot]], None] | None = None,
                quiet: bool = False, tick_every_s: float = 0.25,
                gate: Callable[[str], None] | None = None) -> RunOutcome:
    """Run every job of ``profile`` (one run group after another, a group's jobs at once:
    each job alone, all at once if concurrent, or as fio's stonewalls cut them): each
    job's preconditioning first, then the job, then the read-back of a verified write job;
    ``gate`` holds each job's clock until the other ranks of an MPI run are ready."""
    check_machine_limits(profile)
    prepared = []
    try:
        for job in profile.jobs:
            prepared.append((job, *open_job(job, quiet)))
        batches = profile.batches(prepared)
        outcome = RunOutcome()
        finished: list[JobRun] = []
        results: list[JobResult] = []
        for batch in batches:
            try:
                pre = preconditions(batch, quiet)
            except KeyboardInterrupt:
                outcome.interrupted = True
                break
            for job, engine, tgts, _ in batch:  # after the preconditioning's writes, as fio
                invalidate_before(job, engine, tgts)
            runs = [JobRun(job, engine, tgts, regions, gate=gate)
                    for job, engine, tgts, regions in batch]
            for r in runs:
                line = job_advice(r.job, r.engine_facts)
                if line and not quiet:
                    events.emit("advice", line)
            try:
                drive(runs, finished, on_tick, tick_every_s)
            except KeyboardInterrupt:
                stop_all(runs)
                outcome.interrupted = True
                finished.extend(runs)
                results.extend(r.result() for r in runs)
                break
            except WorkerHung:  # joining would wait for ever
                for r in runs:
                    r.kill()
                raise
            except BaseException:  # another rank failed: no worker outlives the run
                stop_all(runs)
                raise
            finished.extend(runs)
            for r in runs:
                r.raise_bad_input()
            for r in runs:
                result = r.result()
                result.phases[:0] = pre.get(r.job.name, [])
                if r.job.verify and r.job.writes and not result.interrupted:
                    try:
                        result = read_back(r, result, quiet)
                    except KeyboardInterrupt:
                        outcome.interrupted = result.interrupted = True
                results.append(result)
            if outcome.interrupted:
                break
        outcome.results = results
        return outcome
    finally:
        for _, _, tgts, _ in prepared:
            for t in tgts:
                t.close()
