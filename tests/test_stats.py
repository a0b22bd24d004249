import numpy as np
import pytest

from gpufio.core.stats import PERCENTILES, PLAT_NR, LatencyStats, bucket_index, bucket_value


def test_small_values_are_exact_and_buckets_match_fio():
    v = np.arange(0, 128)
    assert np.array_equal(bucket_index(v), v)
    assert np.array_equal(bucket_value(bucket_index(v)), v)
    # fio: 128 and 129 share bucket 128 whose midpoint is 129; 1000 -> bucket 317
    assert bucket_index(np.array([128, 129, 1000])).tolist() == [128, 128, 317]
    assert bucket_value(np.array([128, 317])).tolist() == [129, 1004]
    assert bucket_index(np.array([2 ** 62])).tolist() == [PLAT_NR - 1]


def test_bucket_midpoint_error_is_within_fios_bound():
    rng = np.random.default_rng(0)
    v = rng.integers(128, 10 ** 10, 100_000)
    mid = bucket_value(bucket_index(v))
    assert np.max(np.abs(mid - v) / v) <= 1 / 128 + 1e-12


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "exponential"])
def test_percentiles_agree_with_numpy(dist):
    rng = np.random.default_rng(42)
    x = {"lognormal": lambda: rng.lognormal(10, 1, 200_000),
         "uniform": lambda: rng.uniform(1_000, 2_000_000, 200_000),
         "exponential": lambda: rng.exponential(50_000, 200_000)}[dist]().astype(np.int64)
    s = LatencyStats()
    s.add(x)
    got = s.percentiles()
    for p in PERCENTILES:
        exact = np.percentile(x, p, method="inverted_cdf")
        assert abs(got[p] - exact) <= exact / 128 + 1, p
    assert s.n == len(x) and s.min == x.min() and s.max == x.max()
    assert s.mean == pytest.approx(x.mean(), rel=1e-12)
    assert s.stddev == pytest.approx(x.std(ddof=1), rel=1e-9)


def test_merge_equals_concatenation():
    rng = np.random.default_rng(1)
    parts = [rng.integers(100, 10 ** 7, n) for n in (1, 500, 10_000, 3)]
    merged = LatencyStats()
    for p in parts:
        s = LatencyStats()
        s.add(p)
        merged.merge(s)
    whole = LatencyStats()
    whole.add(np.concatenate(parts))
    assert np.array_equal(merged.hist, whole.hist)
    assert merged.percentiles() == whole.percentiles()
    assert (merged.n, merged.min, merged.max) == (whole.n, whole.min, whole.max)
    assert merged.mean == pytest.approx(whole.mean, rel=1e-12)
    assert merged.stddev == pytest.approx(whole.stddev, rel=1e-9)


def test_empty_stats_report_zeros():
    s = LatencyStats()
    s.add(np.array([], dtype=np.int64))
    assert s.n == 0 and s.stddev == 0.0
    assert set(s.percentiles().values()) == {0}
