"""Every run of a job that result files hold: its metrics, latency histograms and samples.

A result file holds one run of each job, or, from ``--repeat`` or ``gpufio baseline``, many
(each run's metrics, histograms and per-interval IOPS under the job's ``repeat``). The gate
and the baseline writer read both the same way, and several files as the runs of them all.
Each run's measured window (its wall-clock start and end) tells the gate when a baseline's
and a result's runs were interleaved on one runner (``pairs``).
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
    # per run its measured window (unix ms, start and end); None where the file kept none
    windows: list[tuple[float, float] | None] = field(default_factory=list)

    @property
    def n(self) -> int:
        """How many runs."""
        return len(self.metrics)

    def extend(self, other: "JobRuns") -> None:
        """Add another file's runs of the same job."""
        self.metrics += other.metrics
        self.bins += other.bins
        self.intervals += other.intervals
        self.windows += other.windows


def job_runs(job: dict[str, Any]) -> JobRuns:
    """The runs one job document holds (one, or a repeated run's every run)."""
    rep = job.get("repeat")
    if rep and rep.get("runs"):
        n = len(rep["runs"])
        return JobRuns(job["jobname"], job, [dict(r) for r in rep["runs"]],
                       list(rep.get("lat_bins") or [{}] * n),
                       list(rep.get("intervals") or [[]] * n),
                       [_window(w) for w in rep.get("windows") or [None] * n])
    bins = ({d: dict(job[d]["lat_ns"].get("bins", {})) for d in directions(job)
             if "lat_ns" in job.get(d, {})} if "read" in job else {})
    return JobRuns(job["jobname"], job, [job_metrics(job)], [bins],
                   [[float(s["iops"]) for s in job.get("samples", [])]],
                   [_window(job.get("window_unix_ms"))])


def _window(raw: Any) -> tuple[float, float] | None:
    """A run's measured window, None where unknown (older files, a zero window)."""
    if not raw or len(raw) != 2 or not raw[0] or raw[1] < raw[0]:
        return None
    return float(raw[0]), float(raw[1])


def pairs(base: JobRuns, result: JobRuns) -> tuple[list[tuple[int, int]] | None, str]:
    """(baseline run, result run) index pairs when the two sides' runs were interleaved on
    one runner: taken in order of their start, each two consecutive runs are one of each
    side (A B A B, or A B B A, which also cancels an order effect). Else None, and why not."""
    if base.n != result.n:
        return None, f"{base.n} baseline and {result.n} result runs"
    if None in base.windows or None in result.windows:
        return None, "the files keep no start time for every run"
    order = sorted([(w[0], 0, i) for i, w in enumerate(base.windows)]
                   + [(w[0], 1, i) for i, w in enumerate(result.windows)])
    out = []
    for first, second in zip(order[::2], order[1::2]):
        if first[1] == second[1]:
            return None, "the runs do not alternate in time (not interleaved)"
        b, r = (first, second) if first[1] == 0 else (second, first)
        out.append((b[2], r[2]))
    return out, (f"{len(out)} baseline and result runs alternate in time (interleaved), "
                 "so drift common to a pair cancels")


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
