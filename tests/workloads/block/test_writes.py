"""Writes on the CPU engines: the bytes written are the pattern at their offsets (a later read
proves it), a torn block is caught by the read-back at its offset, mixed jobs keep reads and
writes apart, fsyncs are counted, preconditioning and steady state behave as fio's."""

import json
import os

import numpy as np
import pytest

from gpufio.core import pattern
from gpufio.core.steady import Criterion, SteadyState
from gpufio.fio.json_out import to_fio
from gpufio.profile import from_dict
from gpufio.results.check import check
from gpufio.results.load import job_metrics
from gpufio.workloads.block import runner
from gpufio.workloads.block.document import build_document, summary_rows

ENGINES = [
    {"engine": "psync"},
    {"engine": "uring", "iodepth": 16},
    {"engine": "uring", "iodepth": 8, "fixedbufs": True, "registerfiles": True},
    {"engine": "uring", "iodepth": 8, "sqpoll": True},
]
IDS = ["psync", "uring", "uring-fixed", "uring-sqpoll"]


def profile(path, **opts):
    targets = [str(p) for p in path] if isinstance(path, list) else [str(path)]
    return from_dict({"global": {"targets": targets, **opts}}, "t.toml", {})


def run(path, quiet=True, **opts):
    return runner.run_profile(profile(path, **opts), quiet=quiet)


@pytest.fixture
def zero_file(tmp_path):
    """A 256 KiB file of zeros: not gpufio's, so writing needs overwrite = true."""
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(256 << 10))
    return path


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_written_bytes_are_the_pattern_and_read_back_verified(engine, zero_file):
    (w,) = run(zero_file, **engine, rw="write", overwrite=True, verify=True).results
    assert w.ok, (w.failure, w.errors)
    assert w.write.ios == 64 and w.read.ios == 0 and w.write.bytes == 256 << 10
    assert w.write.lat.n == 64 and w.verify_failures == 0
    assert [p["phase"] for p in w.phases] == [f"{w.job.name} (verify read-back)"]
    assert w.phases[0]["ios"] == 64 and w.phases[0]["verify_failures"] == 0
    data = zero_file.read_bytes()
    assert data == pattern.fill(0x89, 0, 256 << 10)  # the job's randseed, every byte
    # a second job, reading with verify, proves it on its own (the header makes it gpufio's)
    (r,) = run(zero_file, **engine, rw="randread", verify=True, io_size="256k").results
    assert r.ok and r.read.ios == 64 and r.verify_failures == 0


@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_random_writes_keep_a_pattern_file_valid(engine, pattern_file):
    (w,) = run(pattern_file, **engine, rw="randwrite", verify=True, io_size="512k",
               numjobs=2).results
    assert w.ok and w.write.ios == 2 * 128 and w.verify_failures == 0
    assert w.phases[0]["ios"] == 2 * 128  # each worker reads back what it wrote
    assert [x["completed"] for x in w.per_worker] == [128, 128]


@pytest.mark.parametrize("engine", ENGINES[:2], ids=IDS[:2])
def test_a_torn_block_between_the_phases_is_caught_at_its_offset(engine, zero_file,
                                                                 torn_on_read_back):
    torn = 5 * 4096

    with torn_on_read_back(zero_file, torn + 100, b"torn"):
        (w,) = run(zero_file, quiet=False, **engine, rw="write", overwrite=True,
                   verify=True).results
    assert w.verify_failures == 1 and not w.ok
    assert w.bad_offsets == [{"target": str(zero_file), "offset": torn}]
    doc = build_document(runner.RunOutcome(results=[w]), profile(zero_file))
    assert summary_rows(doc)[0]["status"] == "bad-data"


@pytest.mark.parametrize("engine", ENGINES[:2], ids=IDS[:2])
def test_mixed_jobs_count_each_direction(engine, pattern_file):
    (r,) = run(pattern_file, **engine, rw="randrw", rwmixread=70, verify=True,
               io_size="2m").results
    assert r.ok and r.verify_failures == 0
    assert r.read.ios + r.write.ios == 512
    assert 0.6 < r.read.ios / 512 < 0.8
    assert r.read.lat.n == r.read.ios and r.write.lat.n == r.write.ios
    assert r.per_target[0]["ios"] == r.read.ios and r.per_target[0]["write_ios"] == r.write.ios
    doc = build_document(runner.RunOutcome(results=[r]), profile(pattern_file))
    assert [row["rw"] for row in summary_rows(doc)] == ["randrw (read)", "randrw (write)"]
    job = doc["jobs"][0]
    assert job["read"]["total_ios"] == r.read.ios and job["write"]["total_ios"] == r.write.ios
    metrics = job_metrics(job)
    assert metrics["iops"] > 0 and metrics["write_iops"] > 0
    fio = to_fio(doc)["jobs"][0]
    assert fio["read"]["total_ios"] == r.read.ios and fio["write"]["total_ios"] == r.write.ios


def test_rwmixwrite_is_the_rest_of_rwmixread(pattern_file):
    (job,) = profile(pattern_file, rw="rw", rwmixwrite=20).jobs
    assert job.rw == "readwrite" and job.rwmixread == 80 and job.write_fraction == pytest.approx(0.2)


@pytest.mark.parametrize("engine", ENGINES[:2], ids=IDS[:2])
@pytest.mark.parametrize("key,every,expected", [("fsync", 4, 16), ("fdatasync", 5, 12),
                                                ("fsync", 64, 1)])
def test_fsync_every_n_writes(engine, key, every, expected, pattern_file):
    (r,) = run(pattern_file, **engine, rw="write", io_size="256k", **{key: every}).results
    assert r.ok and r.write.ios == 64
    assert r.syncs == expected and r.sync_ns > 0


def test_end_fsync_syncs_each_target_once(tmp_path):
    paths = [tmp_path / "a.dat", tmp_path / "b.dat"]
    for i, p in enumerate(paths):
        p.write_bytes(pattern.fill(i + 1, 0, 64 << 10))
    (r,) = run(paths, engine="uring", iodepth=4, rw="write", end_fsync=True).results
    assert r.ok and r.write.ios == 32 and r.syncs == 2
    assert [t["write_ios"] for t in r.per_target] == [16, 16]
    assert paths[1].read_bytes() == pattern.fill(2, 0, 64 << 10)  # each target's own seed


def test_null_engine_counts_writes():
    (r,) = runner.run_profile(from_dict({"global": {
        "engine": "null", "rw": "randwrite", "size": "1m", "iodepth": 8}}, "t.toml", {}),
        quiet=True).results
    assert r.write.ios == 256 and r.read.ios == 0


def test_precondition_writes_the_region_first(pattern_file):
    (r,) = run(pattern_file, engine="uring", iodepth=8, rw="randread", verify=True,
               precondition="seq2", io_size="64k", size="512k").results
    assert r.ok and r.read.ios == 16
    assert [(p["phase"].rsplit(" ", 1)[-1], p["ios"]) for p in r.phases] == [
        ("1/2)", 128), ("2/2)", 128)]


def test_precondition_needs_the_write_guard(zero_file):
    with pytest.raises(Exception, match="does not carry gpufio's pattern"):
        run(zero_file, engine="psync", precondition="seq", rw="randread")


def test_steadystate_criteria_on_recorded_series():
    flat = np.array([1000.0, 1010.0, 990.0, 1005.0])
    assert Criterion.parse("iops:2%", "k").steady(flat)[0]
    assert not Criterion.parse("iops:0.5%", "k").steady(flat)[0]
    ramp = np.array([100.0, 200.0, 300.0, 400.0])  # slope 100/s, mean 250: 40% of the mean
    ok, value = Criterion.parse("iops_slope:50%", "k").steady(ramp)
    assert ok and value == pytest.approx(40.0)
    assert not Criterion.parse("iops_slope:30%", "k").steady(ramp)[0]
    assert Criterion.parse("bw_slope:101", "k").steady(ramp)[0]  # absolute: 100 B/s per s
    watch = SteadyState(Criterion.parse("iops:1%", "k"), duration_ns=3_000_000_000,
                        ramp_ns=2_000_000_000)
    rates = [5.0, 500.0, 1000.0, 1000.0, 1001.0, 999.0]
    steady = [watch.add(rate, (i + 1) * 1_000_000_000) for i, rate in enumerate(rates)]
    assert steady == [False, False, False, False, True, True]  # ramp, then a full window
    assert watch.report()["samples"] == [500.0, 1000.0, 1000.0, 1001.0]
    assert watch.report()["attained_at_s"] == 5.0


def test_steadystate_ends_a_settled_job_early(pattern_file):
    (r,) = run(pattern_file, engine="null", rw="randwrite", time_based=True, runtime="20s",
               steadystate="iops:1000%", steadystate_duration="2s").results
    assert r.ok and r.steadystate["attained"]
    assert r.runtime_ns < 10e9
    assert len(r.steadystate["samples"]) == 2


def test_check_and_compare_read_write_metrics(pattern_file, tmp_path):
    (r,) = run(pattern_file, engine="psync", rw="write", io_size="64k").results
    doc = json.loads(json.dumps(build_document(runner.RunOutcome(results=[r]),
                                               profile(pattern_file))))
    metrics = job_metrics(doc["jobs"][0])
    assert "write_iops" in metrics and "iops" not in metrics
    worse = json.loads(json.dumps(doc))
    worse["jobs"][0]["write"]["iops"] /= 2
    findings = check(worse, doc, {"write_iops": 0.1, "iops": 0.1})
    assert [(f.metric, f.passed) for f in findings] == [("write_iops", False)]


def test_write_results_render_as_write_rows(pattern_file):
    (r,) = run(pattern_file, engine="psync", rw="randwrite", io_size="64k").results
    doc = build_document(runner.RunOutcome(results=[r]), profile(pattern_file))
    (row,) = summary_rows(doc)
    assert row["rw"] == "randwrite" and row["IOPS"] > 0 and row["status"] == "ok"
    fio = to_fio(doc)["jobs"][0]
    assert fio["write"]["total_ios"] == 16 and fio["read"]["total_ios"] == 0
    assert os.path.getsize(pattern_file) == 4 << 20
