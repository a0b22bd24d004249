"""gpu-uring on a GPU: verified data for the shapes that stress the request path, errors
part-way, and a planted stall caught by the watchdog (needs a GPU and Linux 6.6+)."""

import os
import threading
import time

import pytest

from gpufio import runner, targets
from gpufio.gpuring import GpuRings
from gpufio.profile import from_dict

pytestmark = pytest.mark.gpu


def run(paths, **opts):
    glob = {"engine": "gpu-uring", "targets": [str(p) for p in paths], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "rings": 2, "iodepth": 32},
    {"rw": "read", "rings": 1, "iodepth": 8, "bs": "64k"},
    {"rw": "randread", "rings": 2, "iodepth": 8, "land": "host"},
    {"rw": "randread", "rings": 2, "iodepth": 8, "sqe_async": False},
])
def test_data_verified_in_gpu_memory(opts, tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 4 << 20, 5)
    targets.create_file(str(b), 4 << 20, 6)
    r = run([a, b], verify=True, io_size="8m", **opts)
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    assert r.ios == (8 << 20) // r.job.bs and r.verify_failures == 0
    assert [p["ios"] for p in r.per_target] == [r.ios // 2, r.ios // 2]
    assert r.lat.n == r.ios and 0 < r.lat.min <= r.lat.mean <= r.lat.max
    assert sum(r.lat.hist) == r.ios


def test_tiny_rings_wrap_over_100k_ios(pattern_file):
    r = run([pattern_file], rings=1, ring_entries=2, iodepth=2, io_size=f"{100_000 * 4}k",
            verify=True)
    assert r.ok and r.ios == 100_000 and r.verify_failures == 0


def test_more_requester_threads_than_ring_slots(pattern_file):
    r = run([pattern_file], rings=2, iodepth=4, threads=1000, io_size="16m", verify=True)
    assert r.ok and r.ios == 4096 and r.verify_failures == 0
    assert r.engine_facts["requester_threads"] == 1000


def test_a_target_truncated_part_way_reports_short_reads_and_stops(tmp_path):
    path = tmp_path / "shrinks.dat"
    targets.create_file(str(path), 64 << 20, 3)
    timer = threading.Timer(0.8, lambda: os.truncate(path, 1 << 20))
    timer.start()
    started = time.monotonic()
    r = run([path], rings=2, iodepth=8, runtime="20s", time_based=True, verify=True)
    timer.join()
    assert time.monotonic() - started < 15
    assert not r.ok and r.per_target[0]["short_ios"] > 0 and r.ios > 0


def test_a_planted_stall_is_caught_by_the_watchdog(pattern_file, monkeypatch):
    monkeypatch.setattr(GpuRings, "wake", lambda self: 0)  # a sleeping SQPOLL thread stays asleep
    started = time.monotonic()
    r = run([pattern_file], rings=1, iodepth=4, sq_thread_idle="1ms", stall_timeout="1s",
            runtime="30s", time_based=True)
    assert time.monotonic() - started < 15
    assert not r.ok and "no read completed for 1 s; kernels stopped" in r.failure
    assert "NEED_WAKEUP" in r.failure and "in flight" in r.failure
