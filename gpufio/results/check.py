"""``gpufio check``: fail CI when a path got slower than its baseline, not on noise.

Thresholds say how far each metric may move the wrong way (``--max-drop iops=5%``,
``--max-rise lat_p99=10%``, or the profile's ``[check]`` table, which runs embed in their
results). A metric fails only when its change is past the limit and its interval lies
wholly on the worse side: a change the noise does not explain. Which noise depends on how
the runs were made (``Mode``), and every finding says which:

- **paired**: baseline and result runs alternated on one runner (A B A B, or A B B A;
  seen from the runs' start times, or ``--paired``). Each result run is compared with its
  neighbouring baseline run, so the runner's drift, which hits both alike, cancels; the
  pairs' log ratios are combined by a random-effects mean whose interval (Hartung-Knapp,
  results/spread.py) comes from the pairs' own scatter, with each pair weighted by its
  runs' within-run samples. This is the mode for a shared, drifting runner.
- **unpaired**: a stored baseline (``--repeat``, several files, a ``gpufio baseline`` file)
  against the result's runs, by the rank-based interval of the two sets of runs: the
  baseline's run-to-run spread, which covers drift between sittings only if the baseline
  folds runs of several sittings.
- **one run a side**: there is no noise estimate between runs; the runs' own interval
  samples (or latency histograms) give the interval, which sees noise within a run only,
  and the finding says so. Without samples the limit alone decides.

Latency percentiles compare histograms where the files keep them (merged over the runs
when unpaired, each run's own when paired).
"""

from __future__ import annotations

import difflib
import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.job import directions
from gpufio.core.units import parse_size, parse_time_ns
from gpufio.results import DEFAULT_CONFIDENCE, trend
from gpufio.results.load import (
    METRICS, Metric, jobs_by_name, latency_notes, metrics_of, not_storage, setup_facts,
    target_paths,
)
from gpufio.results.runs import JobRuns, pairs, side
from gpufio.results.spread import (
    Spread,
    detectable,
    hist_bootstrap,
    hist_log_variance,
    hist_percentile,
    histogram,
    interval_bootstrap,
    median_log_variance,
    paired_interval,
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
    mode: str = ""  # paired / unpaired / one run a side, and why
    pair_ratios: tuple[float, ...] = ()  # paired: each pair's result / baseline - 1

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


@dataclass(frozen=True)
class Mode:
    """How one job's runs are compared: in pairs (baseline run index, result run index),
    or not (None), and why."""

    pairs: list[tuple[int, int]] | None
    why: str

    def __str__(self) -> str:
        return f"{'paired' if self.pairs else 'unpaired'}: {self.why}"


def mode_of(base: JobRuns, result: JobRuns, paired: bool | None = None) -> Mode:
    """Pair the runs when they were interleaved in time (or ``paired`` says so: then by
    their order in the files), unless ``paired`` is False; two pairs at least."""
    if base.n == 1 and result.n == 1:
        return Mode(None, "one run a side: no noise estimate between runs")
    found, why = pairs(base, result)
    if paired is False:
        return Mode(None, "told --unpaired")
    if paired and found is None:
        if base.n != result.n:
            raise BadInput(f"--paired: job '{base.name}' has {base.n} baseline and "
                           f"{result.n} result runs; pairing needs as many a side")
        found, why = ([(i, i) for i in range(base.n)],
                      f"told --paired, so the runs pair in file order ({why})")
    if found is None or len(found) < 2:
        return Mode(None, f"{why}: two sets of runs; drift since the baseline was made is "
                    "in its spread only if it folds runs of several sittings")
    return Mode(found, why)


def _no_estimate(b: list[float], r: list[float], confidence: float, positive: bool) -> str:
    """Why the runs give no noise estimate between runs."""
    need = runs_needed(confidence)
    return ("values not all positive" if not positive else
            f"{len(b)} baseline run{'s' * (len(b) != 1)} and {len(r)} result "
            f"run{'s' * (len(r) != 1)}; {100 * confidence:g}% needs {need} a side or "
            "2 interleaved pairs")


def judge(name: str, metric: str, base: JobRuns, result: JobRuns, limit: float,
          better_higher: bool, confidence: float = DEFAULT_CONFIDENCE,
          mode: Mode | None = None) -> Finding:
    """One metric of one job: past the limit, and (with runs enough) beyond the noise;
    paired when ``mode`` pairs the runs."""
    mode = mode or mode_of(base, result)
    if mode.pairs:
        found = _judge_paired(name, metric, base, result, limit, better_higher, confidence,
                              mode)
        if found is not None:
            return found
    got = _values(base, result, metric, confidence)
    b, r, bv, rv = got.base, got.result, got.base_value, got.value
    change = (rv / bv - 1) if bv else 0.0
    worse = -change if better_higher else change
    past = worse > limit
    said = (f"{metric} {'fell' if change < 0 else 'rose'} {abs(100 * change):.1f}% "
            f"(limit {100 * limit:g}%)")
    common = dict(limit_pct=100 * limit, change_pct=100 * change, confidence=confidence,
                  spread=spread(b) if len(b) > 1 else None, runs=(len(b), len(r)),
                  basis=got.basis, mode=str(mode))
    positive = all(v > 0 for v in b + r)
    interval = rank_interval(b, r, confidence) if positive else None
    if interval is None:
        why = _no_estimate(b, r, confidence, positive)
        within = _within_run(got.within, confidence, seed_of(name, metric))
        if within is None or len(b) != 1 or len(r) != 1:
            return Finding(name, metric, bv, rv, passed=not past, why=said if past else "",
                           interval=_pct(within), note=f"no noise estimate ({why}): "
                           "decided by the limit alone", **common)
        # one run a side: the runs' own samples are the only noise there is to go by; they
        # see noise within a run, not drift between runs, so the note says so
        beyond = within[1] < 0 if better_higher else within[0] > 0
        note = (f"no noise estimate between runs ({why}): judged by the runs' own interval "
                "samples, which do not see drift between runs")
        if past and not beyond:
            note = f"past the limit but within the runs' own samples; {note}"
        return Finding(name, metric, bv, rv, passed=not (past and beyond),
                       why=f"{said}, beyond the runs' own samples" if past and beyond else "",
                       interval=_pct(within), note=note, **common)
    beyond = interval[1] < 0 if better_higher else interval[0] > 0
    note = ""
    if past and not beyond:
        note = (f"past the limit but within the noise: the {100 * confidence:g}% interval "
                "includes no change")
    return Finding(name, metric, bv, rv, passed=not (past and beyond),
                   why=f"{said}, beyond the baseline's noise" if past and beyond else "",
                   interval=_pct(interval), noise=True, note=note, **common)


def _run_values(runs: JobRuns, metric: str) -> tuple[list[float], str, str]:
    """Each run's own value of ``metric``, what it comes from (a basis for the finding)
    and which within-run samples back it: "intervals" (an IOPS metric's median interval),
    "hist" (a latency percentile from the run's histogram) or "" (the run's figure)."""
    pct = _percentile_of(metric)
    if pct is not None and runs.bins and all(b.get(pct[0]) for b in runs.bins):
        hists = [histogram(b[pct[0]]) for b in runs.bins]
        if all(h.sum() for h in hists):
            return [hist_percentile(h, pct[1]) / 1e3 for h in hists], "runs' histograms", "hist"
    medians = _interval_medians(runs, metric)
    if medians:
        return medians, "runs' median intervals", "intervals"
    return [m[metric] for m in runs.metrics], "", ""


def _pair_variance(base: JobRuns, result: JobRuns, metric: str, kind: str, i: int, j: int,
                   seed: int) -> float | None:
    """The within-run variance of one pair's log ratio, from its two runs' samples."""
    if kind == "intervals":
        return median_log_variance(base.intervals[i], result.intervals[j], seed)
    if kind == "hist":
        d, p = _percentile_of(metric)  # type: ignore[misc]
        return hist_log_variance(histogram(base.bins[i][d]), histogram(result.bins[j][d]), p,
                                 seed)
    return None


def _judge_paired(name: str, metric: str, base: JobRuns, result: JobRuns, limit: float,
                  better_higher: bool, confidence: float, mode: Mode) -> Finding | None:
    """One metric over interleaved pairs (spread.paired_interval); None where a value is
    not positive (the unpaired test then decides)."""
    bvals, basis, kind = _run_values(base, metric)
    rvals, rbasis, rkind = _run_values(result, metric)
    if kind != rkind:  # one side kept samples the other did not: compare the runs' figures
        bvals, rvals = ([m[metric] for m in base.metrics], [m[metric] for m in result.metrics])
        basis, kind = "", ""
    if not all(v > 0 for v in bvals + rvals):
        return None
    assert mode.pairs is not None
    logs = [math.log(rvals[j] / bvals[i]) for i, j in mode.pairs]
    variances = [_pair_variance(base, result, metric, kind, i, j, seed_of(name, metric, str(n)))
                 for n, (i, j) in enumerate(mode.pairs)]
    got = paired_interval(logs, None if None in variances else variances, confidence)
    if got is None:
        return None
    change = got.change
    worse = -change if better_higher else change
    past = worse > limit
    beyond = got.high < 0 if better_higher else got.low > 0
    note = ""
    if past and not beyond:
        note = (f"past the limit but within the noise: the {100 * confidence:g}% interval "
                "over the pairs includes no change")
    said = (f"{metric} {'fell' if change < 0 else 'rose'} {abs(100 * change):.1f}% "
            f"(limit {100 * limit:g}%), beyond the pairs' noise")
    return Finding(name, metric, statistics.median(bvals), statistics.median(rvals),
                   limit_pct=100 * limit, change_pct=100 * change,
                   passed=not (past and beyond), why=said if past and beyond else "",
                   interval=(100 * got.low, 100 * got.high), noise=True,
                   confidence=confidence, spread=spread(bvals), runs=(base.n, result.n),
                   note=note, basis=basis, mode=str(mode),
                   pair_ratios=tuple(math.expm1(x) for x in logs))


def check(result: dict[str, Any] | list[dict[str, Any]],
          baseline: dict[str, Any] | list[dict[str, Any]], limits: dict[str, float],
          confidence: float = DEFAULT_CONFIDENCE, paired: bool | None = None) -> list[Finding]:
    """Every (job, metric) with a limit, judged against the baseline; each side is one
    result document or several (their runs together). ``paired``: None pairs the runs
    when they interleave in time, True pairs them in file order, False never."""
    results_ = result if isinstance(result, list) else [result]
    baselines = baseline if isinstance(baseline, list) else [baseline]
    base_jobs, jobs = side(baselines), side(results_)
    known = metrics_of(results_[0])
    findings = []
    for name in dict.fromkeys(list(base_jobs) + list(jobs)):
        b, r = base_jobs.get(name), jobs.get(name)
        mode = mode_of(b, r, paired) if b is not None and r is not None else None
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
                                  confidence, mode))
    return findings


def modes(result: list[dict[str, Any]], baseline: list[dict[str, Any]],
          paired: bool | None = None) -> dict[str, Mode]:
    """How each job present on both sides is compared, for the line check prints first."""
    base_jobs, jobs = side(baseline), side(result)
    return {name: mode_of(base_jobs[name], runs, paired)
            for name, runs in jobs.items() if name in base_jobs}


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


def suggest_paired(base: JobRuns, result: JobRuns, mode: Mode,
                   confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float | None]:
    """Each metric's smallest change these interleaved pairs could show at ``confidence``
    (a fraction, a fall for metrics better higher): their interval's half width, the
    tightest limit worth setting for runs made this way."""
    known = metrics_of({"jobs": [base.job]})
    out: dict[str, float | None] = {}
    assert mode.pairs is not None
    for metric, m in known.items():
        if not all(metric in x for x in base.metrics + result.metrics):
            continue
        found = _judge_paired(base.name, metric, base, result, 0.0, m.higher_is_better,
                              confidence, mode)
        if found is None or found.interval is None:
            continue
        low, high = (math.log1p(x / 100) for x in found.interval)
        half = (high - low) / 2
        out[metric] = -math.expm1(-half) if m.higher_is_better else math.expm1(half)
    return out


def warnings(result: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[str]:
    """Why a verdict may mislead: the two sides measured unlike things, a side's reads did
    not reach storage, or a run's IOPS still trended (a drive settling)."""
    out = [f"not like for like: {w}" for w in mismatches(result[0], baseline[0])]
    out += latency_notes([baseline[0], result[0]], ["baseline", "result"])
    for label, docs in (("baseline", baseline), ("result", result)):
        out += [f"{label}: target {path}: {s['kind']}, not storage: {s['reason']}"
                for path, s in not_storage(docs[0]).items()]
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
    fio = "fio version" in result or "fio version" in baseline
    if fio:  # a fio result names no host, kernel, GPU or drive: its files are compared
        rs, bs = ({"targets": ", ".join(target_paths(d))} for d in (result, baseline))
    for key in rs:
        if rs[key] != bs[key]:
            out.append(f"{key} differs: baseline '{bs[key]}', result '{rs[key]}'")
    base_jobs = jobs_by_name(baseline)
    for name, job in jobs_by_name(result).items():
        if name not in base_jobs:
            continue
        a, b = _options(base_jobs[name]), _options(job)
        # a fio result holds the options its job gave, in fio's text: those are compared
        keys = a.keys() & b.keys() if fio else a.keys() | b.keys()
        changed = sorted(k for k in keys if not same_value(a.get(k), b.get(k)))
        if changed:
            out.append(f"job '{name}': options differ: {', '.join(changed)}")
    return out


def _readings(value: Any) -> list[Any]:
    """What an option's value may mean: itself, and for fio's text (``4k``, ``10``, ``1``)
    the bytes, nanoseconds (fio's bare times are seconds, as gpufio's) or flag it stands for."""
    if not isinstance(value, str):
        return [value]
    out: list[Any] = [value]
    for read in (parse_size, parse_time_ns):
        try:
            out.append(read(value, "option"))
        except BadInput:
            pass
    if value in ("0", "1"):
        out.append(value == "1")
    return out


def same_value(a: Any, b: Any) -> bool:
    """Whether two results' values of an option are the same setting: fio's ``bs = "4k"``
    and gpufio's ``bs = 4096``, ``direct = "1"`` and ``true``, ``runtime = "10"`` and 10 s."""
    return any(x == y and isinstance(x, bool) == isinstance(y, bool)
               for x in _readings(a) for y in _readings(b))
