"""``gpufio check``: fail CI when a path got slower than its stored baseline.

Thresholds say how far each metric may move the wrong way (``--max-drop iops=5%``,
``--max-rise lat_p99=10%``, or the profile's ``[check]`` table, which runs embed in their
results). Every (job, metric) checked becomes a JUnit test case, so CI systems show them.
"""

from __future__ import annotations

import difflib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.results.load import METRICS, Metric, job_metrics, jobs_by_name, metrics_of, setup_facts


@dataclass(frozen=True)
class Finding:
    """One (job, metric) checked: the values, the allowed change and the verdict."""

    job: str
    metric: str
    baseline: float | None
    value: float | None
    limit_pct: float
    change_pct: float | None
    passed: bool
    why: str


def parse_limits(items: dict[str, Any] | list[str], what: str, rising: bool,
                 known: dict[str, Metric] = METRICS) -> dict[str, float]:
    """``metric=5%`` pairs (or a [check] table) as metric -> allowed fraction, validated
    against the ``known`` metrics (the I/O metrics unless the results are a workload's)."""
    pairs = items.items() if isinstance(items, dict) else [i.partition("=")[::2] for i in items]
    limits = {}
    for metric, raw in pairs:
        metric = metric.strip()
        if metric not in known:
            close = difflib.get_close_matches(metric, list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise BadInput(f"{what}: unknown metric '{metric}'{hint}; known: "
                           f"{', '.join(known) or 'none'}")
        if known[metric].higher_is_better == rising:
            side = "--max-drop/max_drop" if rising else "--max-rise/max_rise"
            raise BadInput(f"{what}: '{metric}' is {'better higher' if rising else 'better lower'}; "
                           f"limit it with {side}")
        text = str(raw).strip().rstrip("%")
        try:
            value = float(text)
        except ValueError:
            raise BadInput(f"{what}: '{metric}={raw}' is not a percentage such as 5%") from None
        if value < 0:
            raise BadInput(f"{what}: '{metric}={raw}' must not be negative")
        limits[metric] = value / 100
    return limits


def check(result: dict[str, Any], baseline: dict[str, Any], limits: dict[str, float]) -> list[Finding]:
    """Every (job, metric) with a limit, compared against the baseline."""
    base_jobs, jobs = jobs_by_name(baseline), jobs_by_name(result)
    known = metrics_of(result)
    findings = []
    for name in dict.fromkeys(list(base_jobs) + list(jobs)):
        b = job_metrics(base_jobs[name]) if name in base_jobs else None
        r = job_metrics(jobs[name]) if name in jobs else None
        for metric, limit in limits.items():
            if b is None or r is None:
                where = "baseline" if b is None else "result"
                findings.append(Finding(name, metric, b and b.get(metric), r and r.get(metric),
                                        100 * limit, None, False, f"job missing from the {where}"))
                continue
            if metric not in b and metric not in r:
                continue  # a direction this job does not have (a write limit, a read job)
            if metric not in b or metric not in r:
                where = "baseline" if metric not in b else "result"
                findings.append(Finding(name, metric, b.get(metric), r.get(metric), 100 * limit,
                                        None, False, f"{metric} missing from the {where} "
                                        "(the job's rw differs)"))
                continue
            change = (r[metric] / b[metric] - 1) if b[metric] else 0.0
            worse = -change if known[metric].higher_is_better else change
            passed = worse <= limit
            why = "" if passed else (f"{metric} {'fell' if change < 0 else 'rose'} "
                                     f"{abs(100 * change):.1f}% (limit {100 * limit:g}%)")
            findings.append(Finding(name, metric, b[metric], r[metric], 100 * limit,
                                    100 * change, passed, why))
    return findings


def mismatches(result: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Why the two runs may not be comparable: other hardware, or other job options."""
    out = []
    rs, bs = setup_facts(result), setup_facts(baseline)
    for key in rs:
        if rs[key] != bs[key]:
            out.append(f"{key} differs: baseline '{bs[key]}', result '{rs[key]}'")
    base_jobs = jobs_by_name(baseline)
    for name, job in jobs_by_name(result).items():
        if name not in base_jobs:
            continue
        a = {k: v for k, v in base_jobs[name].get("resolved options", {}).items()}
        b = {k: v for k, v in job.get("resolved options", {}).items()}
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if changed:
            out.append(f"job '{name}': options differ: {', '.join(changed)}")
    return out


def junit_xml(findings: list[Finding], suite: str = "gpufio check") -> str:
    """JUnit XML: one test case per (job, metric); a failure element for each regression."""
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(findings)),
                       failures=str(sum(not f.passed for f in findings)))
    for f in findings:
        case = ET.SubElement(ts, "testcase", classname=f.job, name=f.metric)
        props = ET.SubElement(case, "system-out")
        props.text = (f"baseline={f.baseline} value={f.value} change_pct={f.change_pct} "
                      f"limit_pct={f.limit_pct}")
        if not f.passed:
            ET.SubElement(case, "failure", message=f.why, type="regression")
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
