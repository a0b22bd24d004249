"""bench/gnn.py's own logic, without storage or a GPU: the profile it writes and its verdicts."""

import argparse
import json

import pytest

from bench import gnn
from gpufio.api import load


def _args(**kw):
    base = dict(nodes=4000, iterations=6, warmup=2, fanout=[10, 5, 5], memory_limit=None,
                engines=["mmap", "mmap-random", "gpu-uring", "gpu-uring+cache"],
                cache_size="64m", batch=[1024], storage="zram", iops_cap=None,
                baseline_iterations=None, baseline_warmup=None)
    return argparse.Namespace(**{**base, **kw})


def test_profile_has_a_job_per_engine_and_target_count_and_loads():
    prof = gnn.profile_of(_args(), [["/a"], ["/a", "/b"]])
    jobs = {j.name.removesuffix("[batch_size=1024]"): j for j in load(prof).jobs}
    assert sorted(jobs) == sorted([
        "mmap-1t", "mmap-random-1t", "gpu-uring-1t", "gpu-uring+cache-1t", "gpu-uring-2t",
        "gpu-uring+cache-2t"])  # the mmap loaders only on one drive
    assert jobs["mmap-1t"].workload_options["mmap_advice"] == "normal"
    assert jobs["mmap-random-1t"].workload_options["mmap_advice"] == "random"
    assert jobs["gpu-uring+cache-2t"].workload_options["cache_size"] == 64 << 20
    assert list(jobs["gpu-uring-2t"].targets) == ["/a", "/b"]


def test_the_mmap_jobs_may_run_fewer_iterations_than_the_protocol():
    """The experiment's 1100 iterations do not fit the mmap loader out of core: its jobs
    take --baseline-iterations and --baseline-warmup, every other job the protocol's."""
    prof = gnn.profile_of(_args(iterations=1100, warmup=1000, baseline_iterations=30,
                                baseline_warmup=5), [["/a"]])
    runs = {j.name.removesuffix("[batch_size=1024]"): (j.workload_options["iterations"],
                                                      j.workload_options["warmup"])
            for j in load(prof).jobs}
    assert runs == {"mmap-1t": (30, 5), "mmap-random-1t": (30, 5), "gpu-uring-1t": (1100, 1000),
                    "gpu-uring+cache-1t": (1100, 1000)}


def _job(name, engine, agg_ms, targets=1, speedup=None, two=None, cache=None, rows=5e6,
         share=0.5):
    j = {"jobname": name, "engine": engine, "batch_size": 1024, "targets": ["t"] * targets,
         "stages": {"aggregation_ms": agg_ms, "aggregation_share": share},
         "aggregation": {"iops": rows}}
    if speedup is not None:
        j["speedup_vs_mmap"] = {"aggregation": speedup}
    if two is not None:
        j["aggregation_vs_one_target"] = two
    if cache is not None:
        j["cache"] = {"hit_rate": cache}
    return j


@pytest.mark.parametrize("speedup,two,limit,missed", [
    (30.0, 0.5, "1g", 0),     # every goal met, table 4x the cap
    (20.0, 0.5, "1g", 1),     # aggregation speedup below 25x
    (30.0, 0.7, "1g", 1),     # a second target saves too little
    (20.0, 0.5, "2g", 0),     # table under 4x the cap: the speedup goal does not apply
])
def test_goals_are_judged_only_where_they_apply(speedup, two, limit, missed):
    doc = {"jobs": [_job("mmap-1t", "mmap", 100.0, speedup=1.0),
                    _job("gpu-uring-1t", "gpu-uring", 100 / speedup, speedup=speedup),
                    _job("gpu-uring+cache-1t", "gpu-uring", 1.0, speedup=1.0, cache=0.4),
                    _job("gpu-uring-2t", "gpu-uring", 100 / speedup * two, targets=2, two=two)]}
    rows, miss = gnn.judge(doc, _args(nodes=(4 << 30) // 4096, memory_limit=limit))
    assert len(miss) == missed
    verdicts = {r[0]: r[-1] for r in rows}
    assert verdicts["mmap-1t"] == "" and verdicts["gpu-uring+cache-1t"] == ""  # no goal
    assert verdicts["gpu-uring-2t"] == ("ok" if two <= 0.60 else "MISS 2 targets")
    assert rows[2][6] == "40.0%"  # the cache's hit rate


def test_out_of_core_gpu_uring_is_held_to_the_random_loader_its_rate_and_its_share():
    doc = {"jobs": [_job("mmap-1t", "mmap", 4000.0, speedup=1.0),
                    _job("mmap-random-1t", "mmap", 400.0),
                    _job("gpu-uring-1t", "gpu-uring", 42.0, speedup=95.0, rows=2.2e6,
                         share=0.78)]}
    rows, miss = gnn.judge(doc, _args(nodes=(4 << 30) // 4096, memory_limit="1g"))
    assert miss == ["gpu-uring-1t: 9.5x mmap-random", "gpu-uring-1t: 2.20 M rows/s",
                    "gpu-uring-1t: aggregation 78% of the iteration"]
    assert rows[2][-1] == "MISS 9.5x mmap-random, 2.20 M rows/s, aggregation 78% of the iteration"


def test_the_engines_run_as_shipped_with_no_tuning_keys():
    prof = gnn.profile_of(_args(engines=["mmap", "cpu-gpu", "cufile", "gpu-uring"]), [["/a"]])
    text = json.dumps(prof)
    assert not any(key in text for key in ("iodepth", "rings", "sqe_async"))
    assert len(load(prof).jobs) == 4
