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


def test_a_job_over_several_gpus_reports_a_row_per_gpu():
    """Workers are given GPUs round-robin; each GPU's row holds exactly its workers' I/Os
    and latencies, the job's row all of them."""
    from types import SimpleNamespace

    from gpufio.profile import from_dict
    from gpufio.workloads.block.document import summary_rows
    from gpufio.run.jobrun import per_gpu

    job = from_dict({"global": {"gpus": [0, 1], "numjobs": 4}}, "p.toml", {}).jobs[0]

    def record(lats):
        lat = LatencyStats()
        lat.add(np.array(lats))
        return SimpleNamespace(dirs=[SimpleNamespace(lat=lat, ios=len(lats), bytes=4096 * len(lats)),
                                     SimpleNamespace(lat=LatencyStats(), ios=0, bytes=0)])

    recs = [(w, record([1000 * (w + 1)] * (w + 1))) for w in range(4)]
    gpus = per_gpu(job, recs)
    assert [(g["gpu"], g["workers"], g["dirs"][0].ios) for g in gpus] == [(0, [0, 2], 4), (1, [1, 3], 6)]
    assert gpus[1]["dirs"][0].lat.max == 4000 and gpus[0]["dirs"][0].lat.min == 1000
    one = from_dict({"global": {"gpu": 1, "numjobs": 4}}, "p.toml", {}).jobs[0]
    assert per_gpu(one, recs) == []
    block = {"iops": 1.0, "bw_bytes": 1.0, "total_ios": 4,
             "lat_ns": {"mean": 1.0, "percentile": {"50.000000": 1, "99.000000": 1,
                                                     "99.900000": 1}}}
    doc = {"jobs": [{"jobname": "j", "engine": "cpu-gpu", "read": block, "write": {"total_ios": 0},
                     "usr_cpu": 1.0, "sys_cpu": 1.0, "cpu_us_per_io": 1.0, "errors": [],
                     "verify": {"failures": 0},
                     "per_gpu": [{"gpu": 0, "read": block}, {"gpu": 1, "read": block}]}]}
    assert [r["job"] for r in summary_rows(doc)] == ["j", "j · gpu 0", "j · gpu 1"]


def test_compiled_binning_matches_numpys_bucket_for_bucket(monkeypatch):
    from gpufio.native import build as native
    if native.lat_function() is None:
        pytest.skip("no C compiler here: the NumPy path is the only one")
    rng = np.random.default_rng(7)
    v = np.concatenate([np.arange(0, 300), rng.integers(0, 1 << 50, 50_000),
                        [127, 128, 129, 255, 256, 2 ** 62, 2 ** 63 - 1]]).astype(np.int64)
    compiled = LatencyStats()
    compiled.add(v[::2])  # a strided view is binned as its values, not its memory
    compiled.add(v[1::2])
    monkeypatch.setattr(native, "lat_function", lambda: None)
    reference = LatencyStats()
    reference.add(v[::2])
    reference.add(v[1::2])
    assert np.array_equal(compiled.hist, reference.hist)
    assert (compiled.n, compiled.min, compiled.max) == (reference.n, reference.min, reference.max)
    assert compiled.mean == pytest.approx(reference.mean, rel=1e-12)
    assert compiled.m2 == pytest.approx(reference.m2, rel=1e-9)
