"""``gpufio check``: fail CI when a path got slower than its stored baseline, not on noise.

Thresholds say how far each metric may move the wrong way (``--max-drop iops=5%``,
``--max-rise lat_p99=10%``, or the profile's ``[check]`` table, which runs embed in their
results). With several runs a side (``--repeat``, several files, a ``gpufio baseline``
file) a metric fails only when its change is past the limit and its rank-based interval
(results/spread.py) lies wholly on the worse side: a change the baseline's own
run-to-run spread does not explain. With fewer runs the limit alone decides, and the
finding says there was no noise estimate. Latency percentiles compare the runs' merged
histograms where the files keep them.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.job import directions
from gpufio.results import DEFAULT_CONFIDENCE, trend
from gpufio.results.load import METRICS, Metric, jobs_by_name, metrics_of, setup_facts
from gpufio.results.runs import JobRuns, side
from gpufio.results.spread import (
    Spread,
    detectable,
    hist_bootstrap,
    hist_percentile,
    histogram,
    interval_bootstrap,
    rank_interval,
    runs_needed,
    seed_of,
    spread,
)


@dataclass(frozen=True)
class Finding:
    """One (job, metric) checked: the values, the change and its interval, the baseline's
    spread, the allowed change and the verdict."""

    job: str
    metric: str
    baseline: float | None
    value: float | None
    limit_pct: float
    change_pct: float | None
    passed: bool
    why: str
    # the change's interval at ``confidence``, in percent; from the runs when ``noise``,
    # else from within one run (resampled intervals or histogram), shown but not decisive
    interval: tuple[float, float] | None = None
    noise: bool = False
    confidence: float = DEFAULT_CONFIDENCE
    spread: Spread | None = None  # the baseline's run-to-run spread of the metric
    runs: tuple[int, int] = (0, 0)  # baseline runs, result runs
    note: str = ""
    basis: str = ""  # where the values come from when not the runs' own figures

    @property
    def verdict(self) -> str:
        """FAIL, ok, or ok but past the limit within the noise."""
        if not self.passed:
            return "FAIL"
        return "ok (noise)" if self.note.startswith("past the limit") else "ok"


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
            flag = "--max-drop/max_drop" if rising else "--max-rise/max_rise"
            raise BadInput(f"{what}: '{metric}' is {'better higher' if rising else 'better lower'}; "
                           f"limit it with {flag}")
        text = str(raw).strip().rstrip("%")
        try:
            value = float(text)
        except ValueError:
            raise BadInput(f"{what}: '{metric}={raw}' is not a percentage such as 5%") from None
        if value < 0:
            raise BadInput(f"{what}: '{metric}={raw}' must not be negative")
        limits[metric] = value / 100
    return limits


def _percentile_of(metric: str) -> tuple[str, float] | None:
    """(direction, percentile) of a latency percentile metric (lat_p99, write_lat_p99.9)."""
    d, name = ("write", metric[6:]) if metric.startswith("write_") else ("read", metric)
    return (d, float(name[5:])) if name.startswith("lat_p") else None


def _merged(runs: JobRuns, d: str) -> np.ndarray | None:
    """The histogram of every run of ``runs`` in direction ``d`` merged; None when a run
    kept none."""
    if not runs.bins or not all(b.get(d) for b in runs.bins):
        return None
    return sum(histogram(b[d]) for b in runs.bins)


# the fewest sample intervals a run needs for its median interval to stand for it
_MIN_INTERVALS = 5


def _interval_medians(runs: JobRuns, metric: str) -> list[float] | None:
    """Each run's median per-interval IOPS, for an IOPS metric of a one-direction job whose
    runs all kept enough intervals: a blip that slows part of one run moves its mean IOPS,
    not its median interval, so the spread between runs is the runs' own."""
    m = METRICS.get(metric)
    if m is None or m.name not in ("iops", "write_iops") or directions(runs.job) != [m.direction]:
        return None
    if not runs.intervals or any(len(iv) < _MIN_INTERVALS for iv in runs.intervals):
        return None
    return [statistics.median(iv) for iv in runs.intervals]


@dataclass(frozen=True)
class _Compared:
    """What one metric's verdict is drawn from."""

    base: list[float]  # per run
    result: list[float]
    base_value: float  # the two values the change is between
    value: float
    basis: str  # where the values come from, when not the runs' own figures
    within: Any  # what a within-run interval resamples (None: nothing)


def _values(base: JobRuns, result: JobRuns, metric: str, confidence: float) -> _Compared:
    """Each side's per-run values and the two values compared: medians of the runs (or of
    their median intervals), or a latency percentile of the merged histograms."""
    b = [m[metric] for m in base.metrics if metric in m]
    r = [m[metric] for m in result.metrics if metric in m]
    pct = _percentile_of(metric)
    if pct is not None:
        hb, hr = _merged(base, pct[0]), _merged(result, pct[0])
        if hb is not None and hr is not None and hb.sum() and hr.sum():
            return _Compared(b, r, hist_percentile(hb, pct[1]) / 1e3,
                             hist_percentile(hr, pct[1]) / 1e3, "merged histograms",
                             (hb, hr, pct[1]))
    need = runs_needed(confidence)
    ib, ir = _interval_medians(base, metric), _interval_medians(result, metric)
    if ib and ir and len(ib) >= need and len(ir) >= need:
        return _Compared(ib, ir, statistics.median(ib), statistics.median(ir),
                         "runs' median intervals", None)
    within = None
    if metric in ("iops", "write_iops", "bw", "write_bw") and len(base.intervals) == 1 \
            and len(result.intervals) == 1:
        within = (base.intervals[0], result.intervals[0])
    return _Compared(b, r, statistics.median(b), statistics.median(r), "", within)


def _within_run(what: Any, confidence: float, seed: int) -> tuple[float, float] | None:
    """A single run's interval: its intervals' rates, or its histogram, resampled."""
    if what is None:
        return None
    if len(what) == 3:
        return hist_bootstrap(what[0], what[1], what[2], confidence, seed)
    return interval_bootstrap(what[0], what[1], confidence, seed)


def _pct(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    return None if bounds is None else (100 * bounds[0], 100 * bounds[1])


def judge(name: str, metric: str, base: JobRuns, result: JobRuns, limit: float,
          better_higher: bool, confidence: float = DEFAULT_CONFIDENCE) -> Finding:
    """One metric of one job: past the limit, and (with runs enough) beyond the noise."""
    got = _values(base, result, metric, confidence)
    b, r, bv, rv = got.base, got.result, got.base_value, got.value
    change = (rv / bv - 1) if bv else 0.0
    worse = -change if better_higher else change
    past = worse > limit
    said = (f"{metric} {'fell' if change < 0 else 'rose'} {abs(100 * change):.1f}% "
            f"(limit {100 * limit:g}%)")
    common = dict(limit_pct=100 * limit, change_pct=100 * change, confidence=confidence,
                  spread=spread(b) if len(b) > 1 else None, runs=(len(b), len(r)),
                  basis=got.basis)
    positive = all(v > 0 for v in b + r)
    interval = rank_interval(b, r, confidence) if positive else None
    if interval is None:
        need = runs_needed(confidence)
        why = ("values not all positive" if not positive else
               f"{len(b)} baseline run{'s' * (len(b) != 1)} and {len(r)} result "
               f"run{'s' * (len(r) != 1)}; {100 * confidence:g}% needs {need} a side")
        note = f"no noise estimate ({why}): decided by the limit alone"
        return Finding(name, metric, bv, rv, passed=not past, why=said if past else "",
                       interval=_pct(_within_run(got.within, confidence, seed_of(name, metric))),
                       note=note, **common)
    beyond = interval[1] < 0 if better_higher else interval[0] > 0
    note = ""
    if past and not beyond:
        note = (f"past the limit but within the noise: the {100 * confidence:g}% interval "
                "includes no change")
    return Finding(name, metric, bv, rv, passed=not (past and beyond),
                   why=f"{said}, beyond the baseline's noise" if past and beyond else "",
                   interval=_pct(interval), noise=True, note=note, **common)


def check(result: dict[str, Any] | list[dict[str, Any]],
          baseline: dict[str, Any] | list[dict[str, Any]], limits: dict[str, float],
          confidence: float = DEFAULT_CONFIDENCE) -> list[Finding]:
    """Every (job, metric) with a limit, judged against the baseline; each side is one
    result document or several (their runs together)."""
    results_ = result if isinstance(result, list) else [result]
    baselines = baseline if isinstance(baseline, list) else [baseline]
    base_jobs, jobs = side(baselines), side(results_)
    known = metrics_of(results_[0])
    findings = []
    for name in dict.fromkeys(list(base_jobs) + list(jobs)):
        b, r = base_jobs.get(name), jobs.get(name)
        for metric, limit in limits.items():
            if b is None or r is None:
                where = "baseline" if b is None else "result"
                findings.append(Finding(name, metric, None, None, 100 * limit, None, False,
                                        f"job missing from the {where}"))
                continue
            in_b = all(metric in m for m in b.metrics)
            in_r = all(metric in m for m in r.metrics)
            if not any(metric in m for m in b.metrics + r.metrics):
                continue  # a direction this job does not have (a write limit, a read job)
            if not in_b or not in_r:
                where = "baseline" if not in_b else "result"
                findings.append(Finding(name, metric, None, None, 100 * limit, None, False,
                                        f"{metric} missing from the {where} "
                                        "(the job's rw differs)"))
                continue
            findings.append(judge(name, metric, b, r, limit, known[metric].higher_is_better,
                                  confidence))
    return findings


def suggest_limits(baseline: list[dict[str, Any]],
                   confidence: float = DEFAULT_CONFIDENCE) -> dict[str, dict[str, float | None]]:
    """Per job, each metric's smallest change as many result runs as the baseline has would
    show at ``confidence`` (a fraction; None: too few baseline runs): limits below it only
    ever fail through the noise test, so it is the tightest limit worth setting."""
    out: dict[str, dict[str, float | None]] = {}
    known = metrics_of(baseline[0])
    for name, runs in side(baseline).items():
        mine: dict[str, float | None] = {}
        for metric in known:
            values = [m[metric] for m in runs.metrics if metric in m]
            if len(values) != runs.n or not all(v > 0 for v in values):
                continue
            rise = detectable(values, confidence)
            if rise is not None and known[metric].higher_is_better:
                rise = 1 - 1 / (1 + rise)  # the same shift, as a fall
            mine[metric] = rise
        out[name] = mine
    return out


def warnings(result: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[str]:
    """Why a verdict may mislead: the two sides measured unlike things, or a run's IOPS
    still trended (a drive settling)."""
    out = [f"not like for like: {w}" for w in mismatches(result[0], baseline[0])]
    for label, docs in (("baseline", baseline), ("result", result)):
        for runs in side(docs).values():
            out += trend.warnings(label, runs)
    return out


def _options(job: dict[str, Any]) -> dict[str, Any]:
    """A job's resolved options, its workload's own (rate_iops) among them."""
    opts = dict(job.get("resolved options", {}))
    own = opts.pop("workload_options", None) or {}
    return {**opts, **own}


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
        a, b = _options(base_jobs[name]), _options(job)
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if changed:
            out.append(f"job '{name}': options differ: {', '.join(changed)}")
    return out
