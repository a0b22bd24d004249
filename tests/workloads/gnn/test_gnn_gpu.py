"""The GNN workload on a GPU (CuPy): sampler, aggregation and training on the device."""

import numpy as np
import pytest

from gpufio.profile import from_dict
from gpufio.workloads.gnn.run import run_job

pytestmark = pytest.mark.gpu


def test_mmap_aggregation_lands_the_generators_rows_on_the_gpu(tmp_path):
    prof = from_dict({"global": {
        "workload": "gnn", "engine": "mmap", "device": "gpu", "nodes": 20_000,
        "feature_dim": 64, "hidden": 32, "batch_size": 128, "fanout": [5, 3],
        "iterations": 8, "warmup": 2, "verify_rows": 100_000, "directory": str(tmp_path)}},
        "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0 and r["verify"]["mismatches"] == 0
    assert r["verify"]["rows_checked"] >= 8 * 128  # every fetched row, not a sample
    assert r["stages"]["timed_iterations"] == 6 and np.isfinite(r["loss_last"])


@pytest.mark.parametrize("engine", [{"engine": "cpu-gpu", "iodepth": 32},
                                    {"engine": "gpu-uring", "iodepth": 32, "rings": 2},
                                    {"engine": "cufile", "iodepth": 32},
                                    {"engine": "mmap"}, {"engine": "uring", "iodepth": 32}])
def test_engines_land_every_row_verified(engine, tmp_path):
    a, b = tmp_path / "ssd0", tmp_path / "ssd1"
    a.mkdir()
    b.mkdir()
    prof = from_dict({"global": {
        "workload": "gnn", "device": "gpu", "nodes": 20_000, "feature_dim": 256,
        "hidden": 32, "batch_size": 128, "fanout": [5, 3], "iterations": 6, "warmup": 2,
        "verify_rows": 100_000, "directory": str(tmp_path), "targets": [str(a), str(b)],
        **engine}}, "g.toml", {})
    from gpufio.engines import all_engines

    if why := all_engines()[engine["engine"]].unavailable():
        pytest.skip(why)
    r = run_job(prof.jobs[0])
    assert r["error"] == 0, r.get("failure")
    assert engine["engine"] != "cufile" or r["engine_mode"] in ("gds", "compat")
    assert r["verify"]["mismatches"] == 0 and r["verify"]["rows_checked"] >= 6 * 128


def _uring_fetcher(tmp_path, cache_bytes, rings=1, iodepth=8, nodes=20_000, dim=256):
    """A gpu-uring fetcher (with a GPU cache of cache_bytes) over a generated table."""
    from gpufio.core.rows import RowRequest
    from gpufio.engines.gpu_uring import GpuUring
    from gpufio.loops.rows import fetcher
    from gpufio.workloads.gnn import dataset

    if why := GpuUring.unavailable():
        pytest.skip(why)
    import cupy as cp

    job = from_dict({"global": {
        "workload": "gnn", "engine": "gpu-uring", "device": "gpu", "nodes": nodes,
        "feature_dim": dim, "batch_size": 16, "rings": rings, "iodepth": iodepth,
        "directory": str(tmp_path)}}, "g.toml", {}).jobs[0]
    ds = dataset.prepare(job)
    request = RowRequest(dim=dim, max_rows=nodes, direct=job.direct, cache_bytes=cache_bytes,
                         iodepth=iodepth)
    return fetcher(GpuUring, job, ds.table, cp, request), job.randseed


def _assert_rows(fetcher, seed, nodes):
    import cupy as cp

    from gpufio.workloads.gnn import features

    got = fetcher.fetch(cp.asarray(nodes))
    want = features.values(seed, cp.asarray(nodes), fetcher.dim, cp)
    bad = cp.flatnonzero((got != want).any(axis=1)).get()
    assert not len(bad), f"{len(bad)} wrong rows, first node {nodes[bad[0]]}"


def test_gpu_cache_serves_a_repeated_batch_from_gpu_memory(tmp_path):
    f, seed = _uring_fetcher(tmp_path, cache_bytes=4096 * 1024)  # room for every row asked
    nodes = np.random.default_rng(3).choice(20_000, 1000, replace=False)
    try:
        _assert_rows(f, seed, nodes)
        assert f.counters() == {"hits": 0, "reads": 1000, "coalesced": 0}
        _assert_rows(f, seed, nodes[::-1].copy())
        assert f.counters() == {"hits": 1000, "reads": 1000, "coalesced": 0}
    finally:
        f.close()


def test_tiny_gpu_cache_evicts_under_churn_and_every_row_stays_right(tmp_path):
    # 8 requester threads, 12 cache rows: nearly every lookup evicts a row another warp
    # may still be copying, which pins must protect
    f, seed = _uring_fetcher(tmp_path, cache_bytes=12 * 1024, dim=256)
    rng = np.random.default_rng(4)
    try:
        for _ in range(3):
            nodes = rng.integers(0, 40, 3000)  # a small hot set: hits, misses, duplicates
            _assert_rows(f, seed, nodes)
        c = f.counters()
        assert c["hits"] + c["reads"] + c["coalesced"] == 9000
        assert c["hits"] > 0 and c["reads"] > 40
    finally:
        f.close()


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_duplicates_within_a_warp_are_fetched_once(tmp_path, cache_bytes):
    f, seed = _uring_fetcher(tmp_path, cache_bytes, iodepth=64)
    nodes = np.array([5] * 32 + [7] * 32)  # rows 0-31 go to one warp, rows 32-63 to the next
    try:
        _assert_rows(f, seed, nodes)
        assert f.counters() == {"hits": 0, "reads": 2, "coalesced": 62}
    finally:
        f.close()


def test_gnn_job_with_gpu_cache_reports_its_hit_rate_over_timed_iterations(tmp_path):
    prof = from_dict({"global": {
        "workload": "gnn", "engine": "gpu-uring", "device": "gpu", "nodes": 20_000,
        "feature_dim": 256, "hidden": 32, "batch_size": 256, "fanout": [5, 3],
        "iterations": 8, "warmup": 3, "verify_rows": 100_000, "rings": 2, "iodepth": 32,
        "cache_size": "8m", "directory": str(tmp_path)}}, "g.toml", {})
    from gpufio.engines.gpu_uring import GpuUring

    if why := GpuUring.unavailable():
        pytest.skip(why)
    r = run_job(prof.jobs[0])
    assert r["error"] == 0 and r["verify"]["mismatches"] == 0, r.get("failure")
    c = r["cache"]
    assert c["rows"] == 8192 and c["bytes"] == 8 << 20
    assert c["hits"] + c["reads"] + c["coalesced"] == r["aggregation"]["rows"]
    assert 0 < c["hit_rate"] < 1  # hub nodes recur across batches; the table has more rows


@pytest.mark.parametrize("engine", ["mmap", "cpu-gpu", "gpu-uring", "cufile"])
def test_each_engine_finishes_first_in_a_fresh_process_under_a_small_limit(engine, tmp_path):
    """A stall memory_limit caused: a job run first in its process under a memory_limit 4x smaller
    than its table must finish, at the speed the limit allows, and say what the group held."""
    import json
    import subprocess
    import sys

    from gpufio.engines import all_engines

    if why := all_engines()[engine].unavailable():
        pytest.skip(why)
    profile = tmp_path / "g.toml"
    profile.write_text(f'[global]\nworkload = "gnn"\nengine = "{engine}"\nnodes = 100_000\n'
                       'feature_dim = 1024\nbatch_size = 256\nfanout = [5, 3]\n'
                       'iterations = 4\nwarmup = 1\nmemory_limit = "96m"\n'
                       f'directory = "{tmp_path}"\n')
    out = subprocess.run([sys.executable, "-m", "gpufio", "run", str(profile), "-f", "json",
                          "-q"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    (j,) = json.loads(out.stdout)["jobs"]
    assert j["iterations_done"] == 4 and j["verify"]["mismatches"] == 0
    m = j["memory_limit"]
    assert m["limit_bytes"] == 96 << 20 and j["feature_bytes"] >= 4 * m["limit_bytes"]
    assert m["usage_at_entry_bytes"] is not None and m["peak_bytes"] is not None
    assert m["peak_bytes"] <= m["limit_bytes"] + m["anon_peak_bytes"] + (1 << 20)
