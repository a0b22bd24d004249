"""Runs a checkpoint profile: the workload's registry entry. Jobs one after another, a
progress line on stderr after every round, Ctrl-C ending the current job after its round,
and the naive path timed once per group of jobs on the same state and targets."""

from __future__ import annotations

import contextlib
from typing import Any

from gpufio.core import events
from gpufio.core import targets as tg
from gpufio.core.errors import BadInput
from gpufio.core.job import Job, Profile
from gpufio.engines import all_engines
from gpufio.workloads.checkpoint import layout
from gpufio.workloads.checkpoint.report import document
from gpufio.workloads.checkpoint.run import Round, run_job, sizes_of
from gpufio.workloads.sequence import run_each


def _line(job: Job, path: str, done: int, r: Round) -> None:
    events.emit("progress", f"gpufio: {job.name}: {path}: round {done}/"
                            f"{job.workload_settings.iterations}: save "
                            f"{r.bytes / r.save_ns:.2f} GB/s, restore "
                            f"{r.bytes / r.restore_ns:.2f} GB/s")


def _group(job: Job) -> tuple:
    c = job.workload_settings
    return (c.device, c.layout, c.state_size, tuple(c.shards), job.targets,
            job.directory)


def run_profile(prof: Profile, quiet: bool = False) -> dict[str, Any]:
    """Every job's rounds, with the naive rounds after the first job of each group."""
    firsts: dict[tuple, str] = {}
    for job in prof.jobs:  # before any job runs: a path that cannot run here says so
        all_engines()[job.engine].refuse_if_unavailable(
            job.name, gpu=job.workload_settings.device == "gpu")
    for job in prof.jobs:
        if job.workload_settings.naive:
            firsts.setdefault(_group(job), job.name)

    def one(job: Job, stop: Any, progress: Any) -> list[dict[str, Any]]:
        return run_job(job, stop, progress, naive=firsts.get(_group(job)) == job.name)

    progress = contextlib.nullcontext(None if quiet else _line)
    results, interrupted = run_each(prof.jobs, one, progress)
    return document(results, prof.path, interrupted, prof.limits)


def targets(job: Job, lay_out: bool) -> list[str]:
    """The job's checkpoint files (or devices); laid out: the missing files created at their
    full size, holding gpufio's pattern (which the write guard lets its rounds overwrite)."""
    p = layout.plan(job, sizes_of(job))
    if lay_out:
        for path, need in zip(p.paths, p.sizes):
            tg.ensure_exists(path, need, job.randseed)
    return list(p.paths)


def run_workload(prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """The registry's entry: run the profile once (a job runs its own rounds)."""
    if repeat != 1:
        raise BadInput("--repeat: a checkpoint job runs its own rounds; raise 'iterations' "
                       "instead")
    return run_profile(prof, quiet)
