"""An engine that offers only a channel (core/requests) and nothing that runs, registered
for the test (tests/conftest.py's ``pread_engine``), gets block, GNN and checkpoint jobs
from the loops band (gpufio/loops), each with its bytes checked: the loop is chosen from
the engine's primitive and the memory, never from the engine."""

from __future__ import annotations

from gpufio.core import pattern
from gpufio.core.requests import CHANNEL
from gpufio.profile import from_dict
from gpufio.workloads.block import runner
from gpufio.workloads.checkpoint import driver, layout
from gpufio.workloads.checkpoint.state import cycled
from gpufio.workloads.gnn.run import run_job

NAME = "test-pread"  # tests/conftest.py's pread_engine: a channel and nothing else


def _block(tmp_path, path, **opts):
    glob = {"engine": NAME, "targets": [str(path)], "iodepth": 4, **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_its_only_primitive_is_the_channel(pread_engine):
    job = from_dict({"global": {"engine": NAME, "size": "1m"}}, "t.toml", {}).jobs[0]
    assert pread_engine.primitive(job) == CHANNEL


def test_it_runs_block_jobs_that_read_and_write_the_pattern(pread_engine, pattern_file,
                                                            tmp_path):
    r = _block(tmp_path, pattern_file, rw="randread", verify=True, io_size="1m")
    assert r.ok and r.verify_failures == 0 and r.ios == 256 and r.bytes == 256 * 4096
    assert r.lat.n == r.ios  # every I/O stamped and timed
    out = tmp_path / "written.dat"
    w = _block(tmp_path, out, rw="write", size="512k", bs="16k", verify=True)
    assert w.ok and w.verify_failures == 0, (w.failure, w.errors)
    assert w.write.ios == 32 and w.write.lat.n == 32 and w.phases[0]["ios"] == 32
    assert out.read_bytes() == pattern.fill(0x89, 0, 512 << 10)  # the job's randseed


def test_it_runs_gnn_jobs_whose_rows_are_the_features(pread_engine, tmp_path):
    prof = from_dict({"global": {"workload": "gnn", "engine": NAME, "device": "cpu",
                                 "nodes": 3000, "feature_dim": 32, "hidden": 8,
                                 "batch_size": 32, "fanout": [3, 2], "iterations": 3,
                                 "warmup": 1, "directory": str(tmp_path)}}, "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0, r.get("failure")
    assert r["iterations_done"] == 3
    assert r["verify"] == {"rows_checked": 3 * 64, "mismatches": 0}


def test_it_runs_checkpoint_rounds_that_restore_what_they_saved(pread_engine, tmp_path,
                                                                 plan_holds_pattern):
    shards = ["1m", "8k", "600k"]
    glob = {"workload": "checkpoint", "engine": NAME, "device": "cpu", "state_size": "3m",
            "iterations": 2, "bs": "256k", "iodepth": 4, "targets": [str(tmp_path)],
            "shards": shards, "naive": False}
    prof = from_dict({"global": glob}, "ck.toml", {})
    (job,) = driver.run_profile(prof, quiet=True)["jobs"]
    assert job["error"] == 0 and not job["interrupted"], job.get("failure")
    assert job["verify"] == {"bytes": 2 * (3 << 20), "bad_shards": 0, "first_bad": None}
    sizes = cycled([1 << 20, 8192, 600 << 10], 3 << 20)
    plan = layout.plan(prof.jobs[0], sizes)
    o = job["resolved options"]
    # each file holds the last round's pattern (as tests/workloads/checkpoint/test_checkpoint.py)
    plan_holds_pattern(plan, 0x89 + 1 + o["iterations"] - 1)
