"""The seed experiment's path on a GPU: the GNN aggregation on engine 'bam' through the
software controller with drive models, over one and two drives (the table striped in 4 KiB
pages, a namespace each), every row verified and each drive's rows counted."""

import pytest

from gpufio.profile import from_dict
from gpufio.workloads.gnn.run import run_job

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("controller", ["model", "compiled"])
@pytest.mark.parametrize("drives,model", [(1, "dapustor-h5100"), (2, "micron-9550")])
def test_bam_on_emulated_drives_lands_every_row_and_says_emulated(tmp_path, drives, model,
                                                                 controller):
    from gpufio.engines import all_engines

    if why := all_engines()["bam"].unavailable():
        pytest.skip(why)
    dirs = [tmp_path / f"ssd{i}" for i in range(drives)]
    for d in dirs:
        d.mkdir()
    prof = from_dict({"global": {
        "workload": "gnn", "engine": "bam", "controller": controller, "drive_model": model,
        "device": "gpu", "nodes": 20_000, "feature_dim": 256, "hidden": 32,
        "batch_size": 128, "fanout": [5, 3], "iterations": 6, "warmup": 2,
        "verify_rows": 100_000, "directory": str(tmp_path), "iodepth": 32,
        "targets": [str(d) for d in dirs]}}, "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0, r.get("failure")
    assert r["verify"]["mismatches"] == 0 and r["verify"]["rows_checked"] >= 6 * 128
    assert f"emulated: {model}, rates from https://" in r["engine_mode"]
    assert r["fetch"]["drive"]["model"] == model
    # the compiled controller's measure of itself, for the report's bound; the model has none
    assert ("controller_busy_ns" in r["fetch"]) is (controller == "compiled")
    assert r["fetch"].get("controller_busy_ns", 1) > 0 and r["aggregation_all_ms"] > 0
    per = r["aggregation"]["per_target"]
    assert len(per) == drives and all(p["rows"] > 0 for p in per)
    # each drive's own count of the reads that reached it: one a row without a cache (the
    # compiled controller counts; the Python model does not)
    assert all(("reads" in p) is (controller == "compiled") for p in per)
    assert all(p.get("reads", p["rows"]) == p["rows"] for p in per)


def test_a_cache_s_hits_never_count_as_a_drive_s_reads(tmp_path):
    """With the GPU cache in front, each drive's IOPS in the article's table are the reads
    its model admitted over the timed iterations: together the cache's reads, fewer than
    the rows asked once hits come."""
    dirs = [tmp_path / f"ssd{i}" for i in range(2)]
    for d in dirs:
        d.mkdir()
    prof = from_dict({"global": {
        "workload": "gnn", "engine": "bam", "controller": "compiled", "controller_threads": 2,
        "drive_model": "dapustor-r5101", "cache_size": "4m", "device": "gpu",
        "nodes": 20_000, "feature_dim": 256, "hidden": 32, "batch_size": 128,
        "fanout": [5, 3], "iterations": 8, "warmup": 3, "directory": str(tmp_path),
        "iodepth": 32, "targets": [str(d) for d in dirs]}}, "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0, r.get("failure")
    per, cache = r["aggregation"]["per_target"], r["cache"]
    assert cache["hits"] > 0
    assert sum(p["reads"] for p in per) == cache["reads"]
    assert sum(p["rows"] for p in per) == r["aggregation"]["rows"] > cache["reads"]
    agg_s = r["stages"]["aggregation_ms"] * r["stages"]["timed_iterations"] / 1e3
    assert all(abs(p["iops"] - p["reads"] / agg_s) < 1e-6 * p["iops"] for p in per)
