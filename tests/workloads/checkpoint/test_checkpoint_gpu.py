"""The checkpoint workload on the GPU engines: states in GPU memory saved and restored through
cpu-gpu (many rounds of pinned pieces), cufile (labelled gds or compat) and mmap, and the
naive path, every byte compared on the GPU and the files holding the pattern of each shard's
offsets; a byte corrupted between save and restore is caught at its file and offset."""

import os

import pytest

from gpufio.engines import all_engines
from gpufio.profile import from_dict
from gpufio.workloads.checkpoint import driver, layout
from gpufio.workloads.checkpoint import run as ckrun

pytestmark = pytest.mark.gpu


def run(tmp_path, **opts):
    if why := all_engines()[opts.get("engine", "cpu-gpu")].unavailable():
        pytest.skip(f"{opts.get('engine')}: {why}")
    glob = {"workload": "checkpoint", "state_size": "24m", "iterations": 2, "bs": "256k",
            "iodepth": 2, "targets": [str(tmp_path)], "shards": ["5m", "8k", "3m"], **opts}
    prof = from_dict({"global": glob}, "ck.toml", {})
    return prof, driver.run_profile(prof, quiet=True)


@pytest.mark.parametrize("engine", ["cpu-gpu", "cufile", "mmap"])
@pytest.mark.parametrize("where", ["files", "single"])
def test_gpu_state_round_trips_through_each_engine(tmp_path, engine, where, plan_holds_pattern):
    prof, doc = run(tmp_path, engine=engine, layout=where)
    eng, naive = doc["jobs"]
    for j in (eng, naive):
        assert j["error"] == 0, j.get("failure")
        assert j["verify"] == {"bytes": 2 * (24 << 20), "bad_shards": 0, "first_bad": None}
        assert j["device"] == "gpu"
    if engine == "cufile":
        assert eng["path"] in ("cufile (gds)", "cufile (compat)")
    assert eng["vs_naive"]["save"] > 0
    job = prof.jobs[0]
    p = layout.plan(job, ckrun.sizes_of(job))
    plan_holds_pattern(p, 0x89 + 1 + 2 + 1)  # the naive path's last round wrote last


@pytest.mark.parametrize("engine", ["cpu-gpu", "cufile"])
def test_corruption_between_save_and_restore_is_caught_on_the_gpu(tmp_path, monkeypatch, engine):
    real = ckrun.evict
    target = os.path.join(tmp_path, layout.shard_name(2))

    def corrupt_then_evict(paths):
        with open(target, "r+b") as f:
            f.seek(12288)
            f.write(b"\0" * 8)
            os.fsync(f.fileno())
        real(paths)

    monkeypatch.setattr(ckrun, "evict", corrupt_then_evict)
    _, doc = run(tmp_path, engine=engine, naive=False, iterations=1)
    (job,) = doc["jobs"]
    assert job["error"] == 1 and job["verify"]["bad_shards"] == 1
    assert job["verify"]["first_bad"] == f"shard 2: {target} at byte 12288"
