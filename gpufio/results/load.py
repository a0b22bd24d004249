"""Reading result files back: validation, the metrics every comparison uses, setup facts.

``compare`` and ``check`` both work on result documents, never on live runs, so that a
baseline stored in CI months ago compares exactly like one made a minute ago.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from gpufio.core.errors import BadInput, reading
from gpufio.core.job import directions, job_direction
from gpufio.fio.json_in import from_fio


@dataclass(frozen=True)
class Metric:
    """One number per job: how to read it from a job document, which way is better, and
    the direction it belongs to (None: the job as a whole)."""

    name: str
    unit: str
    higher_is_better: bool
    read: Callable[[dict[str, Any]], float]
    direction: str | None = None


def _pct(d: str, p: str) -> Callable[[dict[str, Any]], float]:
    return lambda job: job[d]["lat_ns"]["percentile"][p] / 1e3


def _direction_metrics(d: str) -> tuple[Metric, ...]:
    """The per-direction metrics: read's carry the plain names (iops, lat_p99), write's
    the prefix write_, as fio's read and write blocks."""
    pre = "" if d == "read" else "write_"
    return (Metric(f"{pre}iops", "IOPS", True, lambda j: j[d]["iops"], d),
            Metric(f"{pre}bw", "MB/s", True, lambda j: j[d]["bw_bytes"] / 1e6, d),
            Metric(f"{pre}lat_mean", "us", False, lambda j: j[d]["lat_ns"]["mean"] / 1e3, d),
            Metric(f"{pre}lat_p50", "us", False, _pct(d, "50.000000"), d),
            Metric(f"{pre}lat_p99", "us", False, _pct(d, "99.000000"), d),
            Metric(f"{pre}lat_p99.9", "us", False, _pct(d, "99.900000"), d))


METRICS: dict[str, Metric] = {m.name: m for m in (
    *_direction_metrics("read"), *_direction_metrics("write"),
    Metric("cpu_per_io", "us", False, lambda j: j["cpu_us_per_io"]),
)}


def load(path: str) -> dict[str, Any]:
    """A result document from ``path`` (gpufio's JSON), or BadInput naming the file."""
    with reading(path, "result file"), open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise BadInput(f"{path}: not a gpufio result (no 'jobs' list)")
    if "workload" in doc and "metric_info" not in doc:  # a workload's own tables only
        title = doc.get("workload_title", doc["workload"])
        raise BadInput(f"{path}: a {title} workload result; compare, check and plot read "
                       f"results that carry metrics (a {title} result carries its own "
                       f"{doc.get('own_tables', 'tables')})")
    if "metric_info" in doc:
        if not all(isinstance(j, dict) and "jobname" in j for j in doc["jobs"]):
            raise BadInput(f"{path}: a job lacks 'jobname'")
        return doc
    if "fio version" in doc:
        doc = from_fio(doc, path)
    for job in doc["jobs"]:
        if not isinstance(job, dict) or "jobname" not in job or "read" not in job:
            raise BadInput(f"{path}: a job lacks 'jobname' or 'read'")
    return doc


def metrics_of(doc: dict[str, Any]) -> dict[str, Metric]:
    """The metrics of a document: the I/O metrics, or those a workload's document declares
    in its ``metric_info`` (each job then carries its values in ``metrics``)."""
    info = doc.get("metric_info")
    if info is None:
        return METRICS
    return {name: Metric(name, i["unit"], i["higher_is_better"],
                         lambda job, n=name: job["metrics"][n]) for name, i in info.items()}


def median(values: Iterable[float]) -> float:
    """statistics.median, imported on first use: a run's start, which takes no median,
    does not wait for it (and the fractions and decimal modules it brings)."""
    import statistics

    return statistics.median(values)


def job_metrics(job: dict[str, Any]) -> dict[str, float]:
    """Every metric of one job that its directions have (a workload's job: the ``metrics``
    it carries); with ``--repeat`` results, the medians over the repeats."""
    if "read" not in job:  # a workload's job
        return dict(job.get("metrics", {}))
    repeats = job.get("repeat", {}).get("runs")
    if repeats:
        return {name: median(run[name] for run in repeats) for name in repeats[0]}
    have = directions(job)
    return {name: m.read(job) for name, m in METRICS.items()
            if m.direction is None or m.direction in have}


def headline_iops(job: dict[str, Any]) -> float:
    """The IOPS a job is ranked and plotted by: its main direction's."""
    return job[job_direction(job)]["iops"]


def jobs_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Jobs keyed by name, in file order; a name met again (fio's numjobs clones, which
    share their job's name) as NAME#2, NAME#3 ..., so no job hides another."""
    out: dict[str, dict[str, Any]] = {}
    for job in doc["jobs"]:
        name, n = job["jobname"], 1
        while name in out:
            n += 1
            name = f"{job['jobname']}#{n}"
        out[name] = job
    return out


def setup_facts(doc: dict[str, Any]) -> dict[str, str]:
    """What was measured: host, kernel, GPUs and each target's drive, for headers and warnings."""
    host = doc.get("host", {})
    facts = {"host": f"{host.get('cpu', '?')} x{host.get('cpus', '?')}",
             "kernel": str(host.get("kernel", "?")),
             "gpus": ", ".join(g.get("name", "?") for g in doc.get("gpus", [])) or "none"}
    targets = []
    for job in doc["jobs"]:
        for t in job.get("targets", []):
            desc = t.get("model") or t.get("filesystem") or t.get("kind", "?")
            if "current_pcie_gen" in t:
                desc += f" Gen{t['current_pcie_gen']}x{t.get('current_link_width', '?')}"
            if t.get("ram_backed"):
                desc += f", ram-backed: {t.get('ram_backing', 'RAM')}"
            entry = f"{t.get('path', '?')} ({desc})"
            if entry not in targets:
                targets.append(entry)
    facts["targets"] = "; ".join(targets) or "none"
    return facts
