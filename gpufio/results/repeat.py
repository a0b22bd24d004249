"""``gpufio run --repeat N``: one result from N runs, so a CI gate compares medians.

Each job keeps the whole record of the run whose IOPS is the median (a real run, so all its
fields agree with each other) and gains ``repeat``: every run's metrics, their median, min
and max. ``results.job_metrics`` reads the medians from there.
"""

from __future__ import annotations

import statistics
from typing import Any

from gpufio.results.load import headline_iops, job_metrics


def combine(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold N result documents of the same profile into one."""
    out = dict(docs[-1])
    out["interrupted"] = any(d["interrupted"] for d in docs)
    jobs = []
    for j in range(len(docs[0]["jobs"])):
        runs = [d["jobs"][j] for d in docs if j < len(d["jobs"])]
        by_iops = sorted(runs, key=headline_iops)
        chosen = dict(by_iops[(len(by_iops) - 1) // 2])
        metrics = [job_metrics(r) for r in runs]
        keys = [k for k in metrics[0] if all(k in m for m in metrics)]
        metrics = [{k: m[k] for k in keys} for m in metrics]
        chosen["repeat"] = {
            "n": len(runs), "runs": metrics,
            "median": {k: statistics.median(m[k] for m in metrics) for k in keys},
            "min": {k: min(m[k] for m in metrics) for k in keys},
            "max": {k: max(m[k] for m in metrics) for k in keys},
        }
        chosen["error"] = max(r["error"] for r in runs)
        jobs.append(chosen)
    out["jobs"] = jobs
    return out
