"""The GNN workload on a GPU (CuPy): sampler, aggregation and training on the device."""

import numpy as np
import pytest

from gpufio.gnn.run import run_job
from gpufio.profile import from_dict

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
                                    {"engine": "cufile", "iodepth": 32}])
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
