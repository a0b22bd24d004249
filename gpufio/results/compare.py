"""``gpufio compare``: results side by side, each against the first file (the baseline).

Built for the drive questions (Gen4 vs Gen5, one SSD vs two) and for reading a CI gate's
verdict: per job and metric, every file's value, its ratio to the baseline and its change.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from gpufio.core.errors import BadInput
from gpufio.results.load import (
    describe, job_heading, job_metrics, jobs_by_name, metrics_of, setup_facts,
)
from gpufio.results.render import render as render_rows

FORMATS = ("table", "markdown", "csv", "json")


def compare_rows(docs: list[dict[str, Any]], labels: list[str]) -> list[dict[str, Any]]:
    """One row per (job, metric): each file's value, ratio and change against the first."""
    if len(docs) < 2:
        raise BadInput("compare: give at least two result files (the first is the baseline)")
    base_jobs = jobs_by_name(docs[0])
    metrics = {name: m for d in docs for name, m in metrics_of(d).items()}
    rows = []
    names = list(base_jobs) + [n for d in docs[1:] for n in jobs_by_name(d) if n not in base_jobs]
    for name in dict.fromkeys(names):
        base_job = base_jobs.get(name)
        base = job_metrics(base_job) if base_job else None
        per_file = [jobs_by_name(d).get(name) for d in docs]
        values = [job_metrics(job) if job else None for job in per_file]
        for metric in metrics:
            if not any(v and metric in v for v in values):
                continue  # a direction no file's job has (a write metric of a read job)
            row: dict[str, Any] = {"job": name, "metric": metric, "unit": metrics[metric].unit}
            for label, v in zip(labels, values):
                row[label] = v.get(metric) if v else None
            for label in labels[1:]:
                value = row[label]
                ok = base is not None and value is not None and base.get(metric)
                row[f"{label} ratio"] = value / base[metric] if ok else None
                row[f"{label} change %"] = 100 * (value / base[metric] - 1) if ok else None
            rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "missing"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def _kind(docs: list[dict[str, Any]], labels: list[str], row: dict[str, Any], key: str) -> str:
    """' (clat)' after a latency that a fio result gives of clat, not of lat: its
    percentiles unless fio ran with lat_percentiles=1, its mean where it has no lat."""
    metric = row["metric"].removeprefix("write_")
    if key not in labels or row[key] is None or not metric.startswith("lat_"):
        return ""
    job = jobs_by_name(docs[labels.index(key)]).get(row["job"], {})
    which = "mean" if metric == "lat_mean" else "percentiles"
    return " (clat)" if job.get("latency", {}).get(which) == "clat" else ""


def render(docs: list[dict[str, Any]], labels: list[str], fmt: str, console: Console) -> str:
    """The comparison in ``fmt``; 'table' prints to ``console`` and returns ''."""
    rows = compare_rows(docs, labels)
    setups = {label: setup_facts(d) for label, d in zip(labels, docs)}
    if fmt == "json":
        return json.dumps({"baseline": labels[0], "setups": setups, "rows": rows}, indent=2) + "\n"
    if fmt == "csv":
        return render_rows(rows, "csv")
    header = [line for label, d in zip(labels, docs)
              for line in (f"{label}: {describe(setups[label])}",
                           *(f"  {job_heading(j)}" for j in d["jobs"]))]
    text_rows = [{k: _cell(v) + _kind(docs, labels, r, k) for k, v in r.items()} for r in rows]
    if fmt == "markdown":
        return "\n".join(f"- {h}" for h in header) + "\n\n" + render_rows(text_rows, "markdown")
    for h in header:
        console.print(h, markup=False, highlight=False)
    return render_rows(text_rows, "table", title=f"baseline: {labels[0]}",
                       left=("job", "metric", "unit"), console=console)
