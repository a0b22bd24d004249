"""End-to-end checks every CPU engine must pass: right bytes, honest counts, errors reported."""

import errno
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from gpufio.core import targets
from gpufio.core.errors import BadInput
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

CPU_ENGINES = [
    {"engine": "psync"},
    {"engine": "uring", "iodepth": 32},
    {"engine": "uring", "iodepth": 16, "sqpoll": True},
    {"engine": "uring", "iodepth": 8, "fixedbufs": True, "registerfiles": True,
     "defer_taskrun": True},
]
IDS = ["psync", "uring", "uring-sqpoll", "uring-fixed-defer"]


def run(engine, path, **opts):
    glob = {**engine, "targets": [str(path)], **opts}
    return runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True)


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
@pytest.mark.parametrize("rw,bs", [("randread", "4k"), ("read", "64k"), ("randread", "16k")])
def test_every_byte_read_matches_the_pattern(engine, rw, bs, pattern_file):
    out = run(engine, pattern_file, rw=rw, bs=bs, verify=True, numjobs=2, io_size="2m")
    (r,) = out.results
    ios_expected = 2 * (2 << 20) // r.job.bs
    assert r.ok and r.verify_failures == 0
    assert r.ios == ios_expected
    assert r.bytes == r.ios * r.job.bs
    assert r.per_target[0]["ios"] == r.ios and r.per_target[0]["bytes"] == r.bytes
    assert r.lat.n == r.ios and r.lat.min > 0
    assert r.runtime_ns > 0


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
def test_corrupted_block_is_caught_at_its_offset(engine, pattern_file):
    bad = 3 * 4096 + 77
    with open(pattern_file, "r+b") as f:
        f.seek(bad)
        byte = f.read(1)
        f.seek(bad)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = run(engine, pattern_file, rw="read", bs="4k", verify=True, size="64k")
    (r,) = out.results
    assert r.verify_failures == 1 and not r.ok
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 3 * 4096}]


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
def test_two_targets_round_robin_with_per_target_counts(engine, tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 1 << 20, 1)
    targets.create_file(str(b), 1 << 20, 2)
    out = runner.run_profile(from_dict({"global": {
        **engine, "targets": [str(a), str(b)], "verify": True, "rw": "randread",
        "io_size": "1m"}}, "t.toml", {}), quiet=True)
    (r,) = out.results
    assert r.ok and r.ios == 256
    assert [p["ios"] for p in r.per_target] == [128, 128]
    assert [t["pattern_seed"] for t in r.targets] == [1, 2]


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
def test_time_based_run_honours_runtime_and_ramp(engine, pattern_file):
    t0 = time.monotonic()
    out = run(engine, pattern_file, runtime="600ms", ramp_time="300ms", time_based=True,
              sample_interval="100ms")
    elapsed = time.monotonic() - t0
    (r,) = out.results
    assert 0.55e9 < r.runtime_ns < 0.9e9
    assert 0.85 < elapsed < 3.0
    assert r.ios > 0 and len(r.samples) >= 4
    assert all(s["iops"] >= 0 for s in r.samples)


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
def test_file_truncated_during_run_reports_short_reads(engine, tmp_path):
    path = tmp_path / "shrinks.dat"
    targets.create_file(str(path), 8 << 20, 1)
    box = {}
    t = threading.Thread(target=lambda: box.update(out=run(
        engine, path, direct=False, runtime="5s", time_based=True, rw="read", bs="64k")))
    t.start()
    time.sleep(0.5)
    os.truncate(path, 4096)
    t.join(timeout=20)
    assert not t.is_alive()
    (r,) = box["out"].results
    assert r.short_ios > 0 and not r.ok, (r.ios, r.runtime_ns, r.samples, r.errors, r.failure)
    assert r.runtime_ns < 4.5e9  # the job stops at the first failure (continue_on_error false)


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=IDS)
def test_errno_from_the_kernel_is_reported(engine, pattern_file, monkeypatch):
    real_open = targets.open_target

    def write_only(path, direct, consent=None, generic=False):
        t = real_open(path, direct, consent, generic)
        os.close(t.fd)
        t.fd = os.open(path, os.O_WRONLY)
        return t

    monkeypatch.setattr(targets, "open_target", write_only)
    out = run(engine, pattern_file, continue_on_error=True, io_size="64k")
    (r,) = out.results
    assert r.errors == [{"target": str(pattern_file), "errno": errno.EBADF, "count": 16}]
    assert r.ios == 0 and not r.ok


def _losetup(path):
    if os.geteuid() != 0 or not shutil.which("losetup"):
        pytest.skip("needs root and losetup")
    res = subprocess.run(["losetup", "-f", "--show", str(path)], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"no loop device: {res.stderr.strip()}")
    return res.stdout.strip()


@pytest.mark.parametrize("engine", CPU_ENGINES[:2], ids=IDS[:2])
def test_loop_device_shrunk_during_run_reports_and_stops(engine, tmp_path):
    backing = tmp_path / "backing.dat"
    targets.create_file(str(backing), 16 << 20, 5)
    dev = _losetup(backing)
    try:
        box = {}
        t = threading.Thread(target=lambda: box.update(out=run(
            engine, dev, runtime="5s", time_based=True, rw="read", bs="64k", verify=True)))
        t.start()
        time.sleep(0.7)
        os.truncate(backing, 1 << 20)
        subprocess.run(["losetup", "-c", dev], check=True)
        t.join(timeout=20)
        assert not t.is_alive()
    finally:
        subprocess.run(["losetup", "-d", dev])
    (r,) = box["out"].results
    assert r.targets[0]["kind"] == "block"
    # past the new end the device gives short reads or EIO, depending on the path: either way
    # counted per target, the job stopped early and its result says it failed
    assert r.short_ios > 0 or [e["errno"] for e in r.errors] == [errno.EIO]
    assert not r.ok and r.runtime_ns < 4.5e9
    assert r.verify_failures == 0  # every full read before the shrink carried the right bytes


def test_a_silently_short_time_based_run_is_a_failure(pattern_file, monkeypatch):
    from gpufio.loops.block_host import BlockLoop

    def quits_early(self):
        tgt, offs = self.ctx.next_batch(8)
        self.ctx.complete(np.full(len(offs), 1000, np.int64), tgt,
                          np.full(len(offs), self.job.bs, np.int32))

    monkeypatch.setattr(BlockLoop, "run", quits_early)  # psync's loop
    (r,) = run({"engine": "psync"}, pattern_file, runtime="2s", time_based=True).results
    assert not r.ok and "without an error" in r.failure and r.ios == 8


@pytest.mark.parametrize("engine", CPU_ENGINES[:1], ids=IDS[:1])
def test_ctrl_c_before_all_workers_started_keeps_what_ran(engine, pattern_file, monkeypatch):
    from gpufio.run.launch import ProcessWorker

    real_start, started = ProcessWorker.start, []

    def start_then_interrupt(self):
        if started:
            raise KeyboardInterrupt
        started.append(self)
        real_start(self)

    monkeypatch.setattr(ProcessWorker, "start", start_then_interrupt)
    out = run(engine, pattern_file, numjobs=3, runtime="5s", time_based=True)
    (r,) = out.results
    assert out.interrupted and r.interrupted and len(started) == 1


def test_a_failing_close_is_a_failure_not_silence(pattern_file, monkeypatch):
    from gpufio.engines.psync import PsyncChannel

    def broken_close(self):
        raise BufferError("cannot close exported pointers exist")

    monkeypatch.setattr(PsyncChannel, "close", broken_close)
    (r,) = run({"engine": "psync"}, pattern_file, io_size="64k").results
    assert not r.ok and "close: BufferError" in r.failure and r.ios == 16


def test_spawned_workers_reopen_targets_and_share_the_job_memory(pattern_file, tmp_path,
                                                                 monkeypatch):
    """The worker kind GPU engines use to scale past the interpreter lock, tried with psync
    (fresh interpreters: nothing is inherited but what is passed)."""
    from gpufio.engines.psync import Psync

    monkeypatch.setattr(Psync, "worker_kind_for", classmethod(lambda cls, job: "spawn"))
    other = tmp_path / "other.dat"
    targets.create_file(str(other), 1 << 20, 9)
    (r,) = run({"engine": "psync"}, pattern_file, numjobs=2, verify=True, io_size="512k",
               targets=[str(pattern_file), str(other)]).results
    assert r.ok, r.failure
    assert r.ios == 2 * 128 and [p["ios"] for p in r.per_target] == [128, 128]
    assert r.cpu.usr + r.cpu.sys > 0
    (r,) = run({"engine": "psync"}, pattern_file, numjobs=2, runtime="600ms",
               time_based=True).results
    assert r.ok and r.ios > 0 and 0.55e9 < r.runtime_ns < 1.5e9


def _job(engine, **opts):
    return from_dict({"global": {"engine": engine, "targets": ["x"], **opts}}, "t.toml", {}).jobs[0]


def test_processes_spawns_the_workers_of_the_engines_that_offer_it():
    from gpufio.engines import all_engines
    from gpufio.engines.cufile import _threads

    offered = {n for n, e in all_engines().items() if any(o.name == "processes" for o in e.options)}
    assert offered == {"cpu-gpu", "mmap", "cufile"}
    for name in offered:
        engine = all_engines()[name]
        assert engine.worker_kind_for(_job(name)) == "thread"
        assert engine.worker_kind_for(_job(name, processes=True)) == "spawn"
    # KvikIO's pool is per process: a thread per read that process keeps queued
    assert _threads(_job("cufile", iodepth=8, numjobs=4)) == 32
    assert _threads(_job("cufile", iodepth=8, numjobs=4, processes=True)) == 8


def test_spawned_workers_say_whether_mps_lets_them_share_the_gpu(tmp_path, monkeypatch):
    from gpufio.engines import all_engines

    mmap = all_engines()["mmap"]
    assert mmap.describe(_job("mmap"))["processes"] is False
    assert "mps" not in mmap.describe(_job("mmap"))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert mmap.describe(_job("mmap", processes=True))["mps"] is False
    (tmp_path / "control").touch()
    facts = mmap.describe(_job("mmap", processes=True))
    assert facts["mps"] is True and facts["page_cache"] is True


def test_gather_rows_faults_in_each_row_from_its_target(tmp_path):
    import mmap as mm

    from gpufio.engines.mmap import gather_rows

    maps, views = [], []
    for t in range(2):  # row r of target t holds bytes 10 * t + r, after a 100-byte header
        path = tmp_path / f"t{t}"
        path.write_bytes(bytes(100) + b"".join(bytes([10 * t + r]) * 8 for r in range(5)))
        fd = os.open(path, os.O_RDONLY)
        m = mm.mmap(fd, os.fstat(fd).st_size, flags=mm.MAP_SHARED, prot=mm.PROT_READ)
        os.close(fd)
        view = np.frombuffer(m, dtype=np.uint8)[100:].reshape(5, 8)
        maps.append(m)
        views.append(view)
    tgt, rows = np.array([1, 0, 1, 0]), np.array([4, 0, 2, 3])
    out = np.zeros((4, 8), np.uint8)
    gather_rows(views, tgt, rows, out)
    assert out[:, 0].tolist() == [14, 0, 12, 3] and (out == out[:, :1]).all()
    one = np.zeros((2, 8), np.uint8)
    gather_rows(views[1:], np.zeros(2, int), np.array([3, 1]), one)
    assert one[:, 0].tolist() == [13, 11]
    del view
    views.clear()  # every view goes before its mapping closes
    for m in maps:
        m.close()


def test_spawned_gpu_workers_without_mps_get_a_hint(tmp_path, monkeypatch):
    from gpufio.engines import all_engines
    from gpufio.run.jobrun import job_advice

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    cpugpu = all_engines()["cpu-gpu"]
    job = _job("cpu-gpu", processes=True, numjobs=8)
    assert job_advice(job, cpugpu.describe(job)) == (
        "gpufio: job 't': 8 spawned workers and no CUDA MPS daemon: the GPU time-slices "
        "their contexts (start one with nvidia-cuda-mps-control -d)")
    one = _job("cpu-gpu", processes=True)
    threads = _job("cpu-gpu", numjobs=8)
    assert job_advice(one, cpugpu.describe(one)) is None
    assert job_advice(threads, cpugpu.describe(threads)) is None
    (tmp_path / "control").touch()
    assert job_advice(job, cpugpu.describe(job)) is None


# segments round up so they hold all of iodepth (10 in 3: 4 each), twice that as slots
@pytest.mark.parametrize("iodepth,segments,facts",
                         [(128, 4, (4, 256)), (2, 3, (2, 4)), (10, 3, (3, 24))])
def test_cpu_gpu_keeps_twice_the_slots_its_reads_in_flight_need(iodepth, segments, facts):
    from gpufio.engines import all_engines

    d = all_engines()["cpu-gpu"].describe(_job("cpu-gpu", iodepth=iodepth, segments=segments))
    assert (d["segments"], d["landing_slots"]) == facts


@pytest.mark.parametrize("engine", ["uring", "cpu-gpu", "gpu-uring"])
def test_an_iodepth_above_io_urings_largest_ring_names_iodepth(engine):
    with pytest.raises(BadInput, match=r"job 'j': key 'iodepth': 40000 is above the largest "
                                       r"io_uring ring \(32768 entries\)"):
        from_dict({"global": {"engine": engine, "size": "1m", "iodepth": 40000},
                   "job": [{"name": "j"}]}, "p.toml", {})
