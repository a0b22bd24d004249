"""The CI gate on distributions: verdicts on synthetic runs with known spreads, the rank
interval, the 1-run case, baseline files, limits from the spread, drive-state warnings, and
what CI reads (lines, exit codes, JUnit, GitHub annotations, Markdown)."""

import itertools
import json
import math
import xml.etree.ElementTree as ET
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.results import baseline as base_file
from gpufio.results import check as gate
from gpufio.results import report, spread, trend
from gpufio.results.runs import side

cli = CliRunner()
LIMITS = {"iops": 0.05, "lat_p99": 0.10}
T0 = 1_796_000_000  # a run's start in unix seconds


def one_run(iops, p99_us=100.0, samples=None, bins=None):
    """A single run's job document, as ``gpufio run`` writes it (the fields check reads)."""
    pct = {"50.000000": p99_us * 500, "99.000000": p99_us * 1e3, "99.900000": p99_us * 2e3}
    lat = {"mean": p99_us * 500, "percentile": pct}
    if bins is not None:
        lat["bins"] = bins
    return {"jobname": "a", "error": 0, "engine": "uring",
            "read": {"iops": iops, "bw_bytes": iops * 4096, "total_ios": int(iops), "lat_ns": lat},
            "cpu_us_per_io": 2.0, "resolved options": {"bs": 4096, "rw": "randread"},
            "samples": [{"t_ms": 100.0 * (i + 1), "iops": v, "bw_bytes": v * 4096}
                        for i, v in enumerate(samples or [])],
            "targets": [{"path": "/dev/nvme0n1", "model": "Drive X"}]}


def doc(*jobs):
    return {"host": {"cpu": "CPU", "cpus": 2, "kernel": "6.18"}, "gpus": [], "interrupted": False,
            "jobs": list(jobs)}


def repeated(values, p99s=None):
    """A --repeat document: one job whose runs have these IOPS (and p99s, in us)."""
    from gpufio.results.repeat import combine

    p99s = p99s or [100.0] * len(values)
    return combine([doc(one_run(v, p)) for v, p in zip(values, p99s)])


def spread_around(median, pct, n=5):
    """n runs spread evenly within ±pct% of median (the middle one the median)."""
    return [median * (1 + pct / 100 * (2 * i / (n - 1) - 1)) for i in range(n)]


# -- the rank interval -------------------------------------------------------------------

def test_rank_distribution_is_exact():
    def brute(m, n):
        counts = Counter()
        for xs in itertools.combinations(range(m + n), n):
            counts[sum(sum(1 for y in range(x) if y not in xs) for x in xs)] += 1
        total, run = math.comb(m + n, n), 0
        return [(run := run + counts[u]) / total for u in range(m * n + 1)]
    for m, n in ((1, 1), (2, 3), (5, 5), (4, 6), (1, 5)):
        assert spread._rank_cdf(m, n) == pytest.approx(brute(m, n))


def test_rank_order_and_runs_needed():
    assert spread.rank_order(5, 5, 0.99) == 1  # complete separation: p = 2/252
    assert spread.rank_order(5, 5, 0.95) == 3
    assert spread.rank_order(4, 4, 0.99) is None and spread.rank_order(1, 1, 0.5) is None
    assert (spread.runs_needed(0.99), spread.runs_needed(0.95)) == (5, 4)
    # large samples take the normal approximation, close to the exact distribution
    cdf = spread._rank_cdf(150, 150)
    exact = next(k for k, p in enumerate(cdf) if p > 0.025)
    assert abs(spread.rank_order(150, 150, 0.95) - exact) <= 2


def test_rank_interval_bounds_the_ratio():
    base = [100, 101, 99, 102, 98]
    lo, hi = spread.rank_interval(base, [90, 91, 89, 90.5, 92], 0.99)
    assert lo == pytest.approx(89 / 102 - 1) and hi == pytest.approx(92 / 98 - 1)
    assert spread.rank_interval(base, [95], 0.99) is None


def test_detectable_is_the_shift_that_separates_the_runs():
    base = [100, 101, 99, 102, 98]
    d = spread.detectable(base, 0.99)
    assert d == pytest.approx(102 / 98 - 1)
    # a candidate just past that shift is significant; just short of it is not
    past = spread.rank_interval(base, [v * (1 + d) * 1.001 for v in base], 0.99)
    short = spread.rank_interval(base, [v * (1 + d) * 0.999 for v in base], 0.99)
    assert past[0] > 0 and short[0] <= 0
    assert spread.detectable([5.0], 0.99) is None


# -- verdicts on synthetic runs ---------------------------------------------------------

def test_a_regression_beyond_a_tight_baseline_fails():
    base = repeated(spread_around(1000, 1))
    slow = repeated(spread_around(900, 1))
    (f,) = gate.check(slow, base, {"iops": 0.05})
    assert not f.passed and f.noise and f.verdict == "FAIL" and f.runs == (5, 5)
    assert f.change_pct == pytest.approx(-10.0)
    assert f.interval[1] < 0 and f.interval[0] == pytest.approx(100 * (891 / 1010 - 1))
    assert f.spread.n == 5 and f.spread.high == pytest.approx(0.01)
    assert "past the limit, beyond the baseline's noise" in report.line(f)


def test_a_change_within_a_noisy_baseline_passes_and_says_so():
    base = repeated(spread_around(1000, 20))
    cand = repeated(spread_around(920, 20))
    (f,) = gate.check(cand, base, {"iops": 0.05})
    assert f.passed and f.noise and f.verdict == "ok (noise)"
    assert f.change_pct == pytest.approx(-8.0) and f.interval[0] < 0 < f.interval[1]
    assert "past the limit but within the noise" in report.line(f)


def test_a_change_inside_the_limit_passes_even_when_significant():
    (f,) = gate.check(repeated(spread_around(970, 0.5)), repeated(spread_around(1000, 0.5)),
                      {"iops": 0.05})
    assert f.passed and f.interval[1] < 0 and f.verdict == "ok" and not f.note


def test_identical_distributions_never_fail():
    rng = np.random.default_rng(7)
    failures = 0
    for _ in range(200):
        b, c = (list(1000 * np.exp(rng.normal(0, 0.1, 5))) for _ in range(2))
        failures += not gate.check(repeated(c), repeated(b), {"iops": 0.05})[0].passed
    # at 99% a false alarm needs every candidate run below every baseline run: p = 1/252
    assert failures <= 3


def test_a_blip_in_one_run_does_not_hide_a_regression():
    """Each run stands for itself by its median interval: a blip that slowed a third of one
    baseline run moves that run's IOPS below the slowed candidates', not its median."""
    from gpufio.results.repeat import combine

    def run(level, blip=0):
        samples = [level * (1 + 0.01 * (i % 3 - 1)) for i in range(10)]
        samples[:blip] = [0.4 * level] * blip
        return doc(one_run(float(np.mean(samples)), samples=samples))
    base = combine([run(1000) for _ in range(4)] + [run(1000, blip=3)])
    slow = combine([run(900) for _ in range(5)])
    (f,) = gate.check(slow, base, {"iops": 0.05})
    assert not f.passed and f.basis == "runs' median intervals"
    assert f.change_pct == pytest.approx(-10.0)
    assert "from the runs' median intervals" in report.line(f)
    # the runs' own IOPS overlap: without the intervals the blip would hide it
    for r in base["jobs"][0]["repeat"]["intervals"] + slow["jobs"][0]["repeat"]["intervals"]:
        del r[4:]  # too few intervals to stand for a run
    again = gate.check(slow, base, {"iops": 0.05})[0]
    assert again.passed and again.basis == ""


def test_latency_percentiles_come_from_the_merged_histograms():
    # every run's p99 field says 100 us, but the merged histograms put it far higher
    def run_with(bucket):
        return one_run(1000, 100.0, bins={str(bucket): 1000})
    from gpufio.core.stats import bucket_index, bucket_value
    lo, hi = int(bucket_index(np.array([100_000]))[0]), int(bucket_index(np.array([150_000]))[0])
    base, cand = doc(run_with(lo)), doc(run_with(hi))
    (f,) = gate.check(cand, base, {"lat_p99": 0.10})
    assert f.baseline == pytest.approx(bucket_value(np.array([lo]))[0] / 1e3)
    assert f.value == pytest.approx(bucket_value(np.array([hi]))[0] / 1e3)
    assert not f.passed and f.change_pct > 40


def test_one_run_each_is_judged_by_the_runs_own_samples_and_says_it_has_no_noise_estimate():
    samples = [1000, 1010, 990, 1005, 995, 1000]
    base = doc(one_run(1000, samples=samples))
    slow = doc(one_run(900, samples=[s * 0.9 for s in samples]))
    (f,) = gate.check(slow, base, {"iops": 0.05})
    assert not f.passed and not f.noise
    assert f.why == "iops fell 10.0% (limit 5%), beyond the runs' own samples"
    assert f.note.startswith("no noise estimate between runs (1 baseline run and 1 result "
                             "run; 99% needs 5 a side or 2 interleaved pairs)")
    assert f.mode == "unpaired: one run a side: no noise estimate between runs"
    # the interval comes from within the runs (their intervals resampled)
    assert f.interval is not None and f.interval[1] < 0
    assert "interval within one run" in report.line(f)
    # a fall past the limit that the runs' own intervals explain passes, and says why
    wide = [1000, 1400, 600, 1300, 700, 1000]
    (noisy,) = gate.check(doc(one_run(930, samples=[s * 0.93 for s in wide])),
                          doc(one_run(1000, samples=wide)), {"iops": 0.05})
    assert noisy.passed and noisy.verdict == "ok (noise)"
    assert noisy.note.startswith("past the limit but within the runs' own samples; "
                                 "no noise estimate between runs")
    # without samples the limit alone decides
    (ok,) = gate.check(doc(one_run(990)), base, {"iops": 0.05})
    assert ok.passed and ok.interval is None and "no noise estimate" in ok.note
    (bad,) = gate.check(doc(one_run(900)), doc(one_run(1000)), {"iops": 0.05})
    assert not bad.passed and "decided by the limit alone" in bad.note


def _p99_runs(n_ios, shift):
    """Two runs' histograms: the same latency spread, the candidate's tail ``shift`` times
    higher; ``n_ios`` I/Os a run."""
    from gpufio.core.stats import bucket_index

    rng = np.random.default_rng(11)
    def bins(scale):
        lat = rng.lognormal(np.log(50_000), 0.4, n_ios) * scale
        idx, counts = np.unique(bucket_index(lat.astype(np.int64)), return_counts=True)
        return {str(i): int(c) for i, c in zip(idx, counts)}
    return (doc(one_run(1000, bins=bins(1.0))), doc(one_run(1000, bins=bins(shift))))


def test_one_run_p99_rise_within_the_runs_histograms_passes():
    """Two back-to-back 1-run results, p99 +12% (limit 10%). A run of few
    I/Os cannot place its p99 that closely, so the rise is within its own noise and passes,
    saying so; the same rise over many I/Os is beyond it and fails, saying there was no
    noise estimate between runs (the runs' histograms do not see drift between runs)."""
    base, cand = _p99_runs(300, 1.12)
    (f,) = gate.check(cand, base, {"lat_p99": 0.10})
    assert f.change_pct > 10 and f.passed and f.verdict == "ok (noise)"
    assert "no noise estimate between runs" in f.note and f.basis == "merged histograms"
    base, cand = _p99_runs(200_000, 1.12)
    (f,) = gate.check(cand, base, {"lat_p99": 0.10})
    assert f.change_pct > 10 and not f.passed and f.interval[0] > 0
    assert "no noise estimate between runs" in report.line(f)


def test_resampling_is_seeded_so_verdicts_repeat():
    rng = np.random.default_rng(1)
    samples = list(rng.normal(1000, 80, 30))
    bins = {str(i): int(c) for i, c in enumerate(rng.integers(0, 50, 600)) if c}
    base = doc(one_run(1000, samples=samples, bins=bins))
    cand = doc(one_run(960, samples=[s * 0.96 for s in samples], bins=bins))
    first = gate.check(cand, base, LIMITS)
    assert all(f.interval is not None for f in first)
    assert gate.check(cand, base, LIMITS) == first


def test_several_files_are_the_runs_of_one_side():
    base = [doc(one_run(v)) for v in spread_around(1000, 1)]
    runs = side(base)["a"]
    assert runs.n == 5
    (f,) = gate.check([doc(one_run(v)) for v in spread_around(800, 1)], base, {"iops": 0.05})
    assert f.runs == (5, 5) and f.noise and not f.passed


# -- interleaved runs: pairs ----------------------------------------------------------------

def timed(iops, start_s, samples=None, p99_us=100.0):
    """A one-run document whose run started at ``start_s`` (unix seconds), 1 s long."""
    job = one_run(iops, p99_us, samples=samples)
    job["window_unix_ms"] = [1000.0 * (T0 + start_s), 1000.0 * (T0 + start_s) + 1000]
    return doc(job)


def interleaved(base_levels, cand_levels, order="ABAB", spread_pct=1.0):
    """Runs alternating on one runner: pair i's baseline and candidate IOPS, each run with
    ten sample intervals ``spread_pct`` around its level; ABAB or ABBA order."""
    base, cand = [], []
    for i, (b, c) in enumerate(zip(base_levels, cand_levels)):
        first, second = 10 * i, 10 * i + 3
        tb, tc = (first, second) if order == "ABAB" or i % 2 == 0 else (second, first)
        for level, t, out in ((b, tb, base), (c, tc, cand)):
            samples = [level * (1 + spread_pct / 100 * ((k % 5) - 2) / 2) for k in range(10)]
            out.append(timed(level, t, samples))
    return base, cand


def test_t_quantile_matches_the_tables():
    assert spread.t_quantile(4, 0.99) == pytest.approx(4.604, abs=1e-3)
    assert spread.t_quantile(1, 0.99) == pytest.approx(63.657, abs=1e-3)
    assert spread.t_quantile(2, 0.95) == pytest.approx(4.303, abs=1e-3)
    assert spread.t_quantile(9, 0.90) == pytest.approx(1.833, abs=1e-3)


def test_paired_interval_is_the_t_interval_without_within_run_variances():
    logs = [-0.10, -0.12, -0.08, -0.11, -0.09]
    got = spread.paired_interval(logs, None, 0.99)
    sd = float(np.std(logs, ddof=1))
    half = 4.604094871349982 * sd / math.sqrt(5)
    assert got.low == pytest.approx(math.expm1(-0.10 - half))
    assert got.high == pytest.approx(math.expm1(-0.10 + half)) and got.pairs == 5
    assert spread.paired_interval([-0.1], None, 0.99) is None
    # pairs that agree better than their runs' own samples allow do not narrow it past them
    same = spread.paired_interval([-0.1] * 5, [0.01 ** 2] * 5, 0.99)
    assert same.high - same.low == pytest.approx(
        math.expm1(-0.1 + 4.604 * 0.01 / math.sqrt(5)) - math.expm1(-0.1 - 4.604 * 0.01
                                                                      / math.sqrt(5)), rel=1e-3)


def test_runs_alternating_in_time_are_paired():
    base, cand = interleaved([1000] * 5, [1000] * 5)
    (mode,) = gate.modes(cand, base).values()
    assert mode.pairs == [(i, i) for i in range(5)]
    assert str(mode).startswith("paired: 5 baseline and result runs alternate in time")
    base, cand = interleaved([1000] * 5, [1000] * 5, order="ABBA")
    assert gate.modes(cand, base)["a"].pairs == [(i, i) for i in range(5)]
    # all baseline runs first: a stored baseline, two sets of runs
    late = [timed(1000, 100 + 10 * i) for i in range(5)]
    mode = gate.modes(late, [timed(1000, 10 * i) for i in range(5)])["a"]
    assert mode.pairs is None and "do not alternate in time" in str(mode)
    # --paired pairs them in file order, --unpaired never pairs
    mode = gate.modes(late, [timed(1000, 10 * i) for i in range(5)], paired=True)["a"]
    assert mode.pairs == [(i, i) for i in range(5)] and "told --paired" in mode.why
    assert gate.modes(cand, base, paired=False)["a"].pairs is None
    # runs whose files keep no start time cannot be seen to alternate
    assert "no start time" in str(gate.modes([repeated([1000] * 5)], [repeated([1000] * 5)])["a"])


def test_drift_common_to_a_pair_cancels():
    """The runner's speed moves 20% between pairs, far more than a 10% regression: as two
    sets of runs the regression hides in that spread; as pairs it is caught, and identical
    candidates pass."""
    drift = [1000, 800, 1200, 900, 1100]
    base, slow = interleaved(drift, [0.9 * d * (1 + 0.004 * (i % 3 - 1))
                                     for i, d in enumerate(drift)])
    (f,) = gate.check(slow, base, {"iops": 0.05})
    assert not f.passed and f.pair_ratios and f.change_pct == pytest.approx(-10, abs=0.5)
    assert f.interval[1] < 0 and f.basis == "runs' median intervals"
    assert "5 interleaved pairs, ratios" in report.line(f)
    assert "beyond the pairs' noise" in report.line(f)
    (unpaired,) = gate.check(slow, base, {"iops": 0.05}, paired=False)
    assert unpaired.passed and unpaired.verdict == "ok (noise)"
    base, same = interleaved(drift, [d * (1 + 0.01 * (i % 3 - 1)) for i, d in enumerate(drift)])
    (f,) = gate.check(same, base, {"iops": 0.05})
    assert f.passed and f.verdict == "ok" and f.interval[0] < 0 < f.interval[1]


def test_paired_pairs_that_disagree_pass_as_noise():
    """A run's level moves with the machine, which its samples cannot see: pairs whose
    ratios scatter far beyond their runs' samples widen the interval (tau)."""
    base, cand = interleaved([1000] * 5, [1000 * r for r in (0.7, 1.1, 0.8, 1.05, 0.75)])
    (f,) = gate.check(cand, base, {"iops": 0.05})
    assert f.change_pct < -5 and f.passed and f.verdict == "ok (noise)"
    assert "over the pairs includes no change" in f.note


def test_paired_identical_runs_rarely_fail_when_runs_move_more_than_their_samples():
    """Calibration without timing: 200 tries of five interleaved pairs of identical runs;
    the runner drifts 20% between pairs, each run's level moves 4% on its own (which its ten
    sample intervals, 3% apart, cannot see), so a test counting intervals as replicates
    would fail often. At 99% with a 5% limit, at most 1% may fail; check's own path
    (median intervals, their resampled variance, the pairs combined) is followed here."""
    rng = np.random.default_rng(2026)
    failures = 0
    for n in range(200):
        logs, variances = [], []
        for i, d in enumerate(1000 * np.exp(rng.normal(0, 0.2, 5))):
            b, c = (list(d * math.exp(rng.normal(0, 0.04)) * np.exp(rng.normal(0, 0.03, 10)))
                    for _ in range(2))
            logs.append(math.log(np.median(c) / np.median(b)))
            variances.append(spread.median_log_variance(b, c, seed=n * 5 + i))
        got = spread.paired_interval(logs, variances, 0.99)
        failures += got.change < -0.05 and got.high < 0
    assert failures <= 2
    # pairs that agree, a steady 5% apart, are a shift all the same
    assert spread.paired_interval([0.05, 0.06, 0.04, 0.05, 0.07], [1e-4] * 5, 0.99).low > 0


def test_paired_limits_are_proposed_from_the_pairs(write_json):
    drift = [1000, 800, 1200, 900, 1100]
    base, cand = interleaved(drift, drift)
    rows = base_file.rows(base, 0.99, cand)
    iops = next(r for r in rows if r["metric"] == "iops")
    assert iops["from"] == "5 interleaved pairs"
    assert next(r for r in base_file.rows(base, 0.99) if r["metric"] == "iops")["from"] \
        == "baseline's runs"
    # a baseline file folded from timed runs keeps each run's start, so it still pairs
    paths = [write_json(f"b{i}.json", d) for i, d in enumerate(base)]
    folded = base_file.make([json.loads(p.read_text()) for p in paths], list(map(str, paths)))
    assert gate.modes(cand, [folded])["a"].pairs == [(i, i) for i in range(5)]


def test_check_cli_says_which_mode_and_pairs(write_json):
    drift = [1000, 800, 1200, 900, 1100]
    base, slow = interleaved(drift, [0.85 * d for d in drift])
    bs = [str(write_json(f"b{i}.json", d)) for i, d in enumerate(base)]
    cs = [str(write_json(f"c{i}.json", d)) for i, d in enumerate(slow)]
    args = ["check", *cs, *[a for b in bs for a in ("-b", b)], "--max-drop", "iops=5%"]
    res = cli.invoke(app, args + ["--suggest-limits"])
    assert res.exit_code == 1, res.output
    assert "job 'a': paired: 5 baseline and result runs alternate in time" in res.stdout
    assert "5 interleaved pairs" in res.stdout and "FAIL a iops: -15.0%" in res.stdout
    res = cli.invoke(app, args + ["--unpaired"])
    assert res.exit_code == 0 and "job 'a': unpaired: told --unpaired" in res.stdout
    res = cli.invoke(app, ["check", *cs[:4], *[a for b in bs for a in ("-b", b)],
                           "--max-drop", "iops=5%", "--paired"])
    assert res.exit_code == 2 and "--paired: job 'a' has 5 baseline and 4 result runs" \
        in res.output


def test_limits_proposed_from_the_spread():
    tight = gate.suggest_limits([repeated(spread_around(1000, 2))])["a"]
    noisy = gate.suggest_limits([repeated(spread_around(1000, 20))])["a"]
    assert tight["iops"] == pytest.approx(1 - 980 / 1020) and noisy["iops"] > tight["iops"]
    assert gate.suggest_limits([doc(one_run(1000))])["a"]["iops"] is None
    assert base_file._ceil_pct(0.04) == "4%" and base_file._ceil_pct(0.0001) == "0.5%"


# -- drive state --------------------------------------------------------------------------

def test_trend_within_a_run_warns():
    rising = [1000 + 40 * i for i in range(20)]
    assert trend.run_trend(rising) == pytest.approx((1000, 1760))
    flat_noisy = list(np.random.default_rng(3).normal(1000, 150, 20))
    assert trend.run_trend(flat_noisy) is None
    assert trend.run_trend([1000, 2000, 3000]) is None  # too short to tell
    (line,) = trend.warnings("baseline", side([doc(one_run(1000, samples=rising))])["a"])
    assert "job 'a' (baseline, its run): IOPS rose from 1,000 to 1,760 (fitted)" in line
    assert "steady state not reached" in line


# -- the command line -----------------------------------------------------------------------

def test_check_cli_output_exit_codes_annotations_markdown(tmp_path, monkeypatch, write_json):
    base = write_json("base.json", repeated(spread_around(1000, 1)))
    same = write_json("same.json", repeated(spread_around(1000, 1)))
    slow = write_json("slow.json", repeated(spread_around(850, 1)))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    res = cli.invoke(app, ["check", str(same), "-b", str(base), "--max-drop", "iops=5%"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("job 'a': unpaired: ")
    assert res.stdout.splitlines()[1].startswith("ok   a iops: +0.0%, 99% interval")
    assert "::" not in res.stdout
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    res = cli.invoke(app, ["check", str(slow), "-b", str(base), "--max-drop", "iops=5%",
                           "--junit", str(junit), "--markdown", str(md)])
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[1].startswith("FAIL a iops: -15.0%, 99% interval -16.7%..-13.3% (limit 5%; "
                               "baseline spread ±0.7% over 5 runs")
    (error,) = [ln for ln in lines if ln.startswith("::")]
    # GitHub reads % as an escape: %25 shows as %
    assert error.startswith("::error title=gpufio check: a iops::a iops: -15.0%25, 99%25 interval")
    message = ET.parse(junit).getroot().find("testsuite/testcase/failure").get("message")
    assert message.startswith("a iops: -15.0%, 99% interval -16.7%..-13.3%")
    text = md.read_text()
    assert text.startswith("### gpufio check: 1 regression\n")
    assert "| FAIL " in text and "-16.7%..-13.3%" in text
    assert "- job `a`: unpaired: " in text


def test_annotations_warn_for_noise_and_warnings():
    base, cand = repeated(spread_around(1000, 20)), repeated(spread_around(920, 20))
    findings = gate.check(cand, base, {"iops": 0.05})
    lines = report.annotations(findings, ["not like for like: kernel differs\nnext"])
    assert lines[0].startswith("::warning title=gpufio check: a iops::ok (noise) a iops:")
    assert lines[1] == "::warning title=gpufio check::not like for like: kernel differs%0Anext"


def test_a_rate_cap_is_named_where_options_differ():
    capped = one_run(1000)
    capped["resolved options"]["workload_options"] = {"rate_iops": 900}
    assert gate.mismatches(doc(capped), doc(one_run(1000))) == [
        "job 'a': options differ: rate_iops"]


def test_one_run_cli_says_no_noise_estimate(write_json):
    base = write_json("b.json", doc(one_run(1000)))
    cand = write_json("c.json", doc(one_run(800)))
    res = cli.invoke(app, ["check", str(cand), "-b", str(base), "--max-drop", "iops=5%"])
    assert res.exit_code == 1 and "no noise estimate" in res.stdout


def test_baseline_command_writes_every_run_and_the_spread(tmp_path, write_json):
    runs = [write_json(f"r{i}.json", doc(one_run(v, samples=[v] * 5)))
            for i, v in enumerate(spread_around(1000, 2))]
    out = tmp_path / "baseline.json"
    res = cli.invoke(app, ["baseline", *map(str, runs), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "--max-drop iops=4%" in res.stdout and "±1.5% over 5 runs" in res.stdout
    written = json.loads(out.read_text())
    rep = written["jobs"][0]["repeat"]
    assert rep["n"] == 5 and len(rep["intervals"]) == 5 and written["baseline"]["runs"] == {"a": 5}
    # a baseline file and a --repeat file read alike; a repeated file folds in all its runs
    again = tmp_path / "again.json"
    assert cli.invoke(app, ["baseline", str(out), str(runs[0]), "-o", str(again)]).exit_code == 0
    assert json.loads(again.read_text())["jobs"][0]["repeat"]["n"] == 6
    res = cli.invoke(app, ["check", str(out), "-b", str(out), "--suggest-limits"])
    assert res.exit_code == 0 and "limits the runs support" in res.stdout


@pytest.mark.parametrize("args,message", [
    (["baseline", "{d}/missing.json"], "no such result file"),
    (["baseline", "{d}/a.json", "{d}/b.json"], "{d}/b.json: its jobs (b) are not"),
    (["check", "{d}/a.json", "-b", "{d}/a.json", "--max-drop", "iops=5%",
      "--confidence", "1.5"], "--confidence"),
    (["check", "{d}/a.json", "-b", "{d}/a.json", "--max-drop", "iops=5%",
      "--markdown", "{d}/no/such/dir/s.md"], "--markdown {d}/no/such/dir/s.md: No such file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message, write_json):
    write_json("a.json", doc(one_run(1000)))
    b = one_run(1000)
    b["jobname"] = "b"
    write_json("b.json", doc(b))
    res = cli.invoke(app, [a.format(d=tmp_path) for a in args])
    assert res.exit_code == 2 and message.format(d=tmp_path) in res.output
    assert "Traceback" not in res.output
