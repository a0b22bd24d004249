"""The statistics of the CI gate: how far apart two sets of runs are, and how sure.

Runs of one job differ (a shared runner's load, a drive's state), so ``check`` compares
sets of runs, three ways:

- **Unpaired** (a stored baseline): the exact rank-based interval of Hodges and Lehmann,
  the shift of the log-values (a ratio) whose interval comes from the Mann-Whitney
  distribution, so it holds for any run-to-run distribution and needs no resampling.
- **Paired** (baseline and candidate runs interleaved on one runner, A B A B or A B B A):
  each pair's log ratio, combined over the pairs by a random-effects mean with the
  Hartung-Knapp interval (``paired_interval``): drift common to a pair cancels, and what
  is left is judged against the pairs' own scatter.
- **Within one run** (a side with a single run): the run's intervals or its latency
  histogram resampled, with a generator seeded by what is compared, so the same inputs
  always give the same interval.
"""

from __future__ import annotations

import math
import statistics
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from gpufio.core.stats import PLAT_NR, LatencyStats

# above this many run pairs the rank distribution is taken as normal (exact below)
_EXACT_PAIRS = 20_000
BOOTSTRAP_REPS = 2000


@lru_cache(maxsize=64)
def _rank_cdf(m: int, n: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0..m*n, U the Mann-Whitney count of two samples of m and n: the
    Gaussian binomial coefficient's coefficients over C(m+n, n), in exact integers."""
    poly = [1]
    for i in range(1, n + 1):
        grown = poly + [0] * (m + i)  # times (1 - q^(m+i))
        for k in range(len(poly)):
            grown[k + m + i] -= poly[k]
        for k in range(i, len(grown)):  # divided by (1 - q^i), exactly
            grown[k] += grown[k - i]
        poly = grown[:m * i + 1]
    total = math.comb(m + n, n)
    out, run = [], 0
    for c in poly:
        run += c
        out.append(run / total)
    return tuple(out)


def rank_order(m: int, n: int, confidence: float) -> int | None:
    """k such that the k-th smallest and k-th largest of the m*n pairwise differences bound
    the shift at ``confidence`` (two-sided); None when m and n runs cannot reach it."""
    alpha = (1 - confidence) / 2
    if m * n > _EXACT_PAIRS:
        z = statistics.NormalDist().inv_cdf(1 - alpha)
        k = math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))
        return k if k >= 1 else None
    cdf = _rank_cdf(m, n)
    k = 0
    while k < len(cdf) and cdf[k] <= alpha:
        k += 1
    return k if k >= 1 else None


def runs_needed(confidence: float) -> int:
    """The fewest runs a side (as many on both) that reach ``confidence``."""
    n = 2
    while rank_order(n, n, confidence) is None:
        n += 1
    return n


def rank_interval(base: Sequence[float], cand: Sequence[float],
                  confidence: float) -> tuple[float, float] | None:
    """The interval of cand / base - 1 at ``confidence`` (Hodges-Lehmann on log-values),
    None when there are too few runs to reach it. Values must be positive."""
    k = rank_order(len(base), len(cand), confidence)
    if k is None:
        return None
    diffs = np.sort(np.subtract.outer(np.log(np.asarray(cand, dtype=np.float64)),
                                      np.log(np.asarray(base, dtype=np.float64))).ravel())
    return math.expm1(diffs[k - 1]), math.expm1(diffs[-k])


def detectable(base: Sequence[float], confidence: float) -> float | None:
    """The smallest shift (a fraction, as a rise) that as many candidate runs as the
    baseline has, spread like the baseline, would show at ``confidence``: a candidate
    e^d times the baseline's runs is significant once d exceeds the k-th largest of the
    baseline's own pairwise log differences."""
    k = rank_order(len(base), len(base), confidence)
    if k is None:
        return None
    logs = np.log(np.asarray(base, dtype=np.float64))
    diffs = np.sort(np.subtract.outer(logs, logs).ravel())
    return math.expm1(max(float(diffs[-k]), 0.0))


@dataclass(frozen=True)
class Spread:
    """Runs' spread around their median: robust (MAD) and the extremes, as fractions."""

    n: int
    mad: float
    low: float
    high: float

    def __str__(self) -> str:
        if self.n < 2:
            return "1 run"
        return (f"±{100 * self.mad:.1f}% over {self.n} runs "
                f"(range {100 * self.low:+.1f}%..{100 * self.high:+.1f}%)")


def spread(values: Sequence[float]) -> Spread:
    """How far ``values`` lie from their median (MAD scaled to a normal's sigma)."""
    med = statistics.median(values)
    if not med:
        return Spread(len(values), 0.0, 0.0, 0.0)
    mad = 1.4826 * statistics.median(abs(v - med) for v in values) / abs(med)
    return Spread(len(values), mad, min(values) / med - 1, max(values) / med - 1)


def seed_of(*parts: str) -> int:
    """A seed that depends on what is compared, not on the process (hash() is salted)."""
    return zlib.crc32("/".join(parts).encode())


def _percentile_band(ratios: np.ndarray, confidence: float) -> tuple[float, float]:
    lo, hi = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo) - 1, float(hi) - 1


def _redrawn(base: Sequence[float], cand: Sequence[float],
             seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Each run's per-interval rates redrawn with replacement, BOOTSTRAP_REPS rows a side
    (the baseline's drawn first, from a generator seeded by ``seed``); None without a few
    intervals a side."""
    if len(base) < 4 or len(cand) < 4:
        return None
    rng = np.random.default_rng(seed)
    b, c = np.asarray(base, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    return (b[rng.integers(0, len(b), (BOOTSTRAP_REPS, len(b)))],
            c[rng.integers(0, len(c), (BOOTSTRAP_REPS, len(c)))])


def interval_bootstrap(base: Sequence[float], cand: Sequence[float], confidence: float,
                       seed: int) -> tuple[float, float] | None:
    """Within-run interval of mean(cand) / mean(base) - 1 from the runs' per-interval rates,
    each side resampled with replacement; None without a few intervals a side."""
    redrawn = _redrawn(base, cand, seed)
    if redrawn is None:
        return None
    bm, cm = (x.mean(axis=1) for x in redrawn)
    keep = bm > 0
    return _percentile_band(cm[keep] / bm[keep], confidence) if keep.any() else None


def t_quantile(df: int, confidence: float) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` (>= 1) degrees of
    freedom: P(|T| <= t) = confidence, by bisection on the closed form of P(|T| <= t) for
    integer df (Abramowitz and Stegun 26.7.3-4), so no SciPy is needed."""
    def inside(t: float) -> float:
        theta = math.atan(t / math.sqrt(df))
        s, c2 = math.sin(theta), math.cos(theta) ** 2
        if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 ...))
            term, total = math.cos(theta), 0.0
            for k in range(1, (df - 1) // 2 + 1):
                total += term
                term *= c2 * 2 * k / (2 * k + 1)
            return 2 / math.pi * (theta + s * total)
        term, total = 1.0, 0.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 ...)
        for k in range(1, df // 2 + 1):
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        return s * total
    lo, hi = 0.0, 1.0
    while inside(hi) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inside(mid) < confidence else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Paired:
    """The pairs' combined change: its estimate and interval (fractions), and how the
    pairs scatter beyond what their runs' own samples explain."""

    change: float
    low: float
    high: float
    pairs: int
    tau: float  # the between-pair spread of the log ratio (random effects)


def paired_interval(logs: Sequence[float], variances: Sequence[float] | None,
                    confidence: float) -> Paired | None:
    """The change over ``logs`` (each pair's log(candidate / baseline)) at ``confidence``,
    given each pair's within-run variance of that log ratio (None: unknown); None with
    fewer than two pairs.

    A random-effects mean (DerSimonian-Laird): each pair is weighted by 1 / (its
    within-run variance + tau^2), tau^2 being how much more the pairs scatter than their
    runs' own samples explain (a run's level moves with the machine, which the samples
    within one run cannot see, so that part is estimated from the pairs). The interval is
    Hartung and Knapp's: the weighted scatter of the pairs around the mean, on Student's t
    with pairs - 1 degrees of freedom, so with five pairs it is driven by what the pairs
    did, not by a normal approximation; the scatter is taken at least as large as the
    within-run variances say (Knapp and Hartung's floor), so pairs that agree by chance do
    not make it narrower than the runs' own samples allow. Without within-run variances it
    is the paired t interval of the log ratios.
    """
    d = np.asarray(logs, dtype=np.float64)
    k = len(d)
    if k < 2:
        return None
    t = t_quantile(k - 1, confidence)
    if variances is None or not all(v > 0 for v in variances):
        mean, sd = float(d.mean()), float(d.std(ddof=1))
        half = t * sd / math.sqrt(k)
        return Paired(math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half),
                      k, sd)
    v = np.asarray(variances, dtype=np.float64)
    w = 1 / v
    fixed = float(w @ d / w.sum())
    q = float(w @ (d - fixed) ** 2)
    tau2 = max(0.0, (q - (k - 1)) / (w.sum() - (w @ w) / w.sum()))
    ws = 1 / (v + tau2)
    mean = float(ws @ d / ws.sum())
    scatter = float(ws @ (d - mean) ** 2) / (k - 1)
    half = t * math.sqrt(max(scatter, 1.0) / ws.sum())
    return Paired(math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half), k,
                  math.sqrt(tau2))


def median_log_variance(base: Sequence[float], cand: Sequence[float], seed: int) -> float | None:
    """The within-run variance of log(median(cand) / median(base)) of two runs' interval
    rates, each run's intervals resampled with replacement; None without a few a side."""
    if min(base, default=0) <= 0 or min(cand, default=0) <= 0:
        return None
    redrawn = _redrawn(base, cand, seed)
    if redrawn is None:
        return None
    bm, cm = (np.median(x, axis=1) for x in redrawn)
    return float(np.var(np.log(cm) - np.log(bm)))


def hist_log_variance(base: np.ndarray, cand: np.ndarray, p: float, seed: int) -> float | None:
    """The within-run variance of log(candidate / baseline) of a latency percentile, each
    run's I/Os redrawn from its histogram; None with too few I/Os."""
    ratios = _hist_ratios(base, cand, p, seed)
    return None if ratios is None else float(np.var(np.log(ratios)))


def histogram(bins: dict[str, int]) -> np.ndarray:
    """A document's non-zero buckets as the full histogram."""
    out = np.zeros(PLAT_NR, dtype=np.int64)
    for i, count in bins.items():
        out[int(i)] = count
    return out


def hist_percentile(hist: np.ndarray, p: float) -> float:
    """The ``p`` percentile (ns) of a histogram, as the documents report it."""
    return float(LatencyStats(hist=hist, n=int(hist.sum())).percentiles((p,))[p])


def hist_bootstrap(base: np.ndarray, cand: np.ndarray, p: float, confidence: float,
                   seed: int) -> tuple[float, float] | None:
    """Within-run interval of a latency percentile's ratio: each side's I/Os redrawn from
    its own histogram (multinomially), the percentile taken again."""
    ratios = _hist_ratios(base, cand, p, seed)
    return None if ratios is None else _percentile_band(ratios, confidence)


def _hist_ratios(base: np.ndarray, cand: np.ndarray, p: float,
                 seed: int) -> np.ndarray | None:
    """The ``p`` percentile's ratio over redraws of both histograms (multinomially)."""
    nb, nc = int(base.sum()), int(cand.sum())
    if nb < 100 or nc < 100:
        return None
    rng = np.random.default_rng(seed)
    reps = BOOTSTRAP_REPS // 4  # each redraw is a whole histogram
    bs = rng.multinomial(nb, base / nb, size=reps)
    cs = rng.multinomial(nc, cand / nc, size=reps)
    return np.array([max(hist_percentile(c, p), 1.0) / max(hist_percentile(b, p), 1.0)
                     for b, c in zip(bs, cs)])
