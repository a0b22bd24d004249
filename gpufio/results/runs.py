"""Every run of a job that result files hold: its metrics, latency histograms and samples.

A result file holds one run of each job, or, from ``--repeat`` or ``gpufio baseline``, many
(each run's metrics, histograms and per-interval IOPS under the job's ``repeat``). The gate
and the baseline writer read both the same way, and several files as the runs of them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufio.core.job import directions
from gpufio.results.load import job_metrics


@dataclass
class JobRuns:
    """One job's runs: per run its metrics, its histogram per direction (empty where the
    file kept none) and its IOPS per sample interval."""

    name: str
    job: dict[str, Any]  # the first file's job document: options, targets, directions
    metrics: list[dict[str, float]] = field(default_factory=list)
    bins: list[dict[str, dict[str, int]]] = field(default_factory=list)
    intervals: list[list[float]] = field(default_factory=list)

    @property
    def n(self) -> int:
        """How many runs."""
        return len(self.metrics)

    def extend(self, other: "JobRuns") -> None:
        """Add another file's runs of the same job."""
        self.metrics += other.metrics
        self.bins += other.bins
        self.intervals += other.intervals


def job_runs(job: dict[str, Any]) -> JobRuns:
    """The runs one job document holds (one, or a repeated run's every run)."""
    rep = job.get("repeat")
    if rep and rep.get("runs"):
        n = len(rep["runs"])
        return JobRuns(job["jobname"], job, [dict(r) for r in rep["runs"]],
                       list(rep.get("lat_bins") or [{}] * n),
                       list(rep.get("intervals") or [[]] * n))
    bins = ({d: dict(job[d]["lat_ns"].get("bins", {})) for d in directions(job)
             if "lat_ns" in job.get(d, {})} if "read" in job else {})
    return JobRuns(job["jobname"], job, [job_metrics(job)], [bins],
                   [[float(s["iops"]) for s in job.get("samples", [])]])


def side(docs: list[dict[str, Any]]) -> dict[str, JobRuns]:
    """Each job's runs over ``docs`` (the runs of the same job name together), in order."""
    out: dict[str, JobRuns] = {}
    for doc in docs:
        for job in doc["jobs"]:
            runs = job_runs(job)
            if runs.name in out:
                out[runs.name].extend(runs)
            else:
                out[runs.name] = runs
    return out
