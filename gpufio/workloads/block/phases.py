"""The passes beside a job: preconditioning before it (its engine writes the whole region)
and, for a verified job that wrote, the read-back after it (fio's do_verify)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from gpufio.core import events
from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.core.rate import unpaced
from gpufio.core.targets import Target, invalidate
from gpufio.engines.base import Engine
from gpufio.run.jobrun import JobRun, drive
from gpufio.run.records import JobResult


def _phase_job(job: Job, name: str, **changes: Any) -> Job:
    """A phase of ``job`` run beside it (preconditioning, read-back): a plain budgeted pass
    with none of the job's own phases, steady-state watch, syncs or rate cap, plus ``changes``."""
    options = unpaced(asdict(job.workload_settings))
    return replace(job, name=f"{job.name} ({name})", time_based=False, runtime=None,
                   workload_options=options,
                   workload_settings=type(job.workload_settings)(**options),
                   ramp_time=0, steadystate=None, steadystate_duration=0,
                   steadystate_ramp_time=0, precondition="none", fsync=0, fdatasync=0,
                   **changes)


def precondition_job(job: Job, index: int) -> Job:
    """Pass ``index`` of a job's preconditioning: its engine writes the whole region once,
    sequentially, one worker, synced at the end (fio's usual precondition job)."""
    passes = 2 if job.precondition == "seq2" else 1
    return _phase_job(job, f"precondition {index + 1}/{passes}", rw="write", verify=False,
                      numjobs=1, io_size=None, end_fsync=True, read_iolog=None)


def readback_job(job: Job) -> Job:
    """The read-back of a verified job that wrote (fio's do_verify): the same engine, seeds
    and offset streams reading, with verify, so each worker reads every offset it touched."""
    return _phase_job(job, "verify read-back", rw="randread" if job.random else "read",
                      verify=True, end_fsync=False)


def _phase_summary(phase: str, r: JobResult) -> dict[str, Any]:
    return {"phase": phase, "ios": r.ios, "bytes": r.bytes, "seconds": r.runtime_ns / 1e9,
            "verify_failures": r.verify_failures, "ok": r.ok, "failure": r.failure}


def preconditions(batch: list[tuple], quiet: bool) -> dict[str, list[dict[str, Any]]]:
    """Run each job's preconditioning passes; their summaries by job name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for job, engine, tgts, regions in batch:
        passes = {"none": 0, "seq": 1, "seq2": 2}[job.precondition]
        for i in range(passes):
            pre = precondition_job(job, i)
            if not quiet:
                events.emit("progress", f"gpufio: job '{job.name}': precondition pass "
                                        f"{i + 1}/{passes}, writing the whole region")
            run = JobRun(pre, engine, tgts, regions)
            drive([run], [], None, 1.0)
            r = run.result()
            out.setdefault(job.name, []).append(_phase_summary(pre.name, r))
            if not r.ok:
                raise BadInput(f"job '{job.name}': preconditioning failed: "
                               f"{r.failure or 'I/O errors'}")
    return out


def invalidate_before(job: Job, engine: type[Engine], targets: list[Target]) -> None:
    """fio's invalidate: a buffered job's targets leave the page cache before it (or its
    read-back) starts, so its reads reach storage; buffered as the storage judgement has
    it (run/opening.py): direct off, or an engine that reads through the page cache (mmap)."""
    if job.invalidate and engine.buffered(job):
        invalidate(targets)


def read_back(run: JobRun, result: JobResult, quiet: bool) -> JobResult:
    """Verify what a write job wrote: read it back, and put the failures in its result."""
    job = run.job
    budgets = [w["completed"] for w in result.per_worker]
    if not budgets or not any(budgets):
        return result
    if not quiet:
        events.emit("progress", f"gpufio: job '{job.name}': reading back what it wrote, "
                                "to verify it")
    back = readback_job(job)
    invalidate_before(back, run.engine, run.targets)
    rb_run = JobRun(back, run.engine, run.targets,
                    [(t0, n) for t0, n in run.stream_regions], budgets=budgets)
    drive([rb_run], [], None, 1.0)
    rb = rb_run.result()
    result.phases.append(_phase_summary(back.name, rb))
    result.verify_failures += rb.verify_failures
    result.bad_offsets = (result.bad_offsets + rb.bad_offsets)[:8]
    for mine, theirs in zip(result.per_target, rb.per_target):
        mine["verify_failures"] += theirs["verify_failures"]
    if rb.failure or rb.errors or rb.short_ios:
        why = rb.failure or f"{sum(e['count'] for e in rb.errors)} I/O errors, " \
                            f"{rb.short_ios} short reads"
        result.failure = "; ".join(filter(None, [result.failure, f"verify read-back: {why}"]))
    return result
