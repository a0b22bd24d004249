"""``gpufio run --repeat N``: one result from N runs, so a CI gate compares distributions.

Each job keeps the whole record of the run whose IOPS is the median (a real run, so all its
fields agree with each other) and gains ``repeat``: every run's metrics, latency histogram
buckets and per-interval IOPS, and their median, min and max. ``results.job_metrics`` reads
the medians from there, ``results.runs`` the runs. A document that is itself repeated
contributes all of its runs.
"""

from __future__ import annotations

from typing import Any

from gpufio.results.load import headline_iops, median
from gpufio.results.runs import job_runs


def combine(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold N result documents of the same profile into one."""
    out = dict(docs[-1])
    out["interrupted"] = any(d["interrupted"] for d in docs)
    jobs = []
    for j in range(len(docs[0]["jobs"])):
        runs = [d["jobs"][j] for d in docs if j < len(d["jobs"])]
        by_iops = sorted(runs, key=headline_iops)
        chosen = dict(by_iops[(len(by_iops) - 1) // 2])
        every = job_runs(runs[0])
        for r in runs[1:]:
            every.extend(job_runs(r))
        keys = [k for k in every.metrics[0] if all(k in m for m in every.metrics)]
        metrics = [{k: m[k] for k in keys} for m in every.metrics]
        chosen["repeat"] = {
            "n": len(metrics), "runs": metrics,
            "median": {k: median(m[k] for m in metrics) for k in keys},
            "min": {k: min(m[k] for m in metrics) for k in keys},
            "max": {k: max(m[k] for m in metrics) for k in keys},
            "lat_bins": every.bins, "intervals": every.intervals,
            # each run's measured window, so check can pair runs interleaved with others
            "windows": [list(w) if w else None for w in every.windows],
        }
        chosen["error"] = max(r["error"] for r in runs)
        jobs.append(chosen)
    out["jobs"] = jobs
    return out
