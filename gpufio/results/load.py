"""Reading result files back: validation, the metrics every comparison uses, setup facts.

``compare`` and ``check`` both work on result documents, never on live runs, so that a
baseline stored in CI months ago compares exactly like one made a minute ago.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from gpufio.core.errors import BadInput, reading
from gpufio.fio.json_in import from_fio


@dataclass(frozen=True)
class Metric:
    """One number per job: how to read it from a job document, and which way is better."""

    name: str
    unit: str
    higher_is_better: bool
    read: Callable[[dict[str, Any]], float]


def _pct(p: str) -> Callable[[dict[str, Any]], float]:
    return lambda job: job["read"]["lat_ns"]["percentile"][p] / 1e3


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("iops", "IOPS", True, lambda j: j["read"]["iops"]),
    Metric("bw", "MB/s", True, lambda j: j["read"]["bw_bytes"] / 1e6),
    Metric("lat_mean", "us", False, lambda j: j["read"]["lat_ns"]["mean"] / 1e3),
    Metric("lat_p50", "us", False, _pct("50.000000")),
    Metric("lat_p99", "us", False, _pct("99.000000")),
    Metric("lat_p99.9", "us", False, _pct("99.900000")),
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
    if "workload" in doc:  # a workload's own document (I/O results name none), own tables
        title = doc.get("workload_title", doc["workload"])
        raise BadInput(f"{path}: a {title} workload result; compare, check and plot read I/O "
                       f"results (a {title} result carries its own "
                       f"{doc.get('own_tables', 'tables')})")
    if "fio version" in doc:
        doc = from_fio(doc, path)
    for job in doc["jobs"]:
        if not isinstance(job, dict) or "jobname" not in job or "read" not in job:
            raise BadInput(f"{path}: a job lacks 'jobname' or 'read'")
    return doc


def job_metrics(job: dict[str, Any]) -> dict[str, float]:
    """Every metric of one job; with ``--repeat`` results, the medians over the repeats."""
    repeats = job.get("repeat", {}).get("runs")
    if repeats:
        return {name: statistics.median(run[name] for run in repeats) for name in METRICS}
    return {name: m.read(job) for name, m in METRICS.items()}


def jobs_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Jobs keyed by name, in file order."""
    return {job["jobname"]: job for job in doc["jobs"]}


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
