"""Latency is fio's ``lat``, held by Little's law: on a target whose I/Os take real time (a
loop device with direct I/O on, over a file in the test's directory), the I/Os a job keeps
in its slots equal IOPS x mean latency, within 5%, for the compiled uring loop at either
iodepth_batch_submit, psync jobs (one read each), mmap's batches and, on a GPU machine,
gpu-uring; cpu-gpu (a read in flight until its bytes land in GPU memory) is held to never
more than its depth. A
latency that missed part of an I/O's life in its slot (a slot free, unstamped, while its I/O
waits for a submit call; a stamp taken after the gather it should time) comes out short of
the depth; one that counted twice, above it. Little's law is about the stamps, not about
speed: it holds on a busy machine as on an idle one.

The Python loop (verifying reads, fsync, no compiler) stamps where the compiled one does,
but between a reap and its slots' next stamps it spends tens of microseconds of Python,
where fio spends about one: its slots are that much less busy, the product that much
below the depth, a few percent on a busy 2-core VM, which a 5% law would hold only on an
idle machine. It is not held here. uring-cmd's compiled loop (the uring loop over a
passthrough ring) is held to the same law in the NVMe rig: tests/engines/test_uring_cmd_rig.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from gpufio.core import targets
from gpufio.io import loops
from gpufio.profile import from_dict
from gpufio.run.records import JobResult
from gpufio.workloads.block import runner

SIZE = 128 << 20
TOLERANCE = 0.05


@pytest.fixture
def slow_device(tmp_path: Path, losetup) -> Iterator[str]:
    """A loop device over a file in the test's directory, its direct I/O on: each read
    goes to the disk under the file, none comes from a cache of the device's own. The
    file goes when the test does (its space once the device is detached)."""
    backing = tmp_path / "backing.img"
    targets.create_file(str(backing), SIZE, 99)
    dev = losetup(backing)
    subprocess.run(["losetup", "--direct-io=on", dev], capture_output=True)
    dio = Path(f"/sys/block/{Path(dev).name}/loop/dio")
    if not dio.exists() or dio.read_text().strip() != "1":
        pytest.skip(f"{dev} cannot do direct I/O on {backing} (its file system refuses "
                    "O_DIRECT): its reads would come from the page cache")
    yield dev
    backing.unlink()


def in_flight(dev: str, **keys: object) -> tuple[float, JobResult]:
    """Run a 4 KiB random-read job on ``dev``; (IOPS x mean latency, its result). No
    ramp_time: the I/Os in flight when a window opens would count whole, a stall's
    worth too much."""
    glob = {"targets": [dev], "rw": "randread", "bs": "4k", "direct": True,
            "runtime": "2s", "time_based": True, **keys}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    assert r.ok and r.read.ios > 500, (r.failure, r.errors, r.read.ios)
    return r.read.ios / (r.runtime_ns / 1e9) * r.lat.mean / 1e9, r


def assert_depth(product: float, depth: int, r: JobResult) -> None:
    assert abs(product - depth) <= TOLERANCE * depth, (
        f"IOPS x mean latency = {product:.2f}, depth {depth}: "
        f"{r.read.ios} I/Os in {r.runtime_ns / 1e9:.2f} s at {r.lat.mean / 1e3:.1f} us")


@pytest.mark.skipif(not loops.available(), reason="no compiled loops here (no C compiler)")
@pytest.mark.parametrize("depth", [8, 32])
@pytest.mark.parametrize("batch_submit", [1, 0])
def test_uring_keeps_its_depth_by_its_own_stamps(slow_device, depth, batch_submit):
    product, r = in_flight(slow_device, iodepth=depth, engine="uring",
                           iodepth_batch_submit=batch_submit)
    assert r.engine_facts["loop"] == "compiled"
    assert_depth(product, depth, r)
    # fio's slat, the wait for the submitting call, is part of each latency, never more
    slat = r.engine_facts["slat_mean_ns"]
    assert len(slat) == 1 and 0 <= slat[0] < r.lat.mean


def test_psync_jobs_keep_one_read_each_in_flight(slow_device):
    product, r = in_flight(slow_device, numjobs=4, engine="psync")
    assert len(r.per_worker) == 4
    assert_depth(product, 4, r)


def test_mmap_keeps_a_batch_in_flight(slow_device, host_mmap):
    # mmap's depth is its batch: iodepth blocks faulted in together, then copied
    product, r = in_flight(slow_device, iodepth=32, engine="test-mmap", drop_cache=True)
    assert_depth(product, 32, r)



@pytest.mark.gpu
@pytest.mark.parametrize("depth", [32, 128])
def test_cpu_gpu_never_counts_more_than_its_depth(slow_device, depth):
    # a read is in flight from its issue until its segment's copy into GPU memory is done:
    # iodepth counts the copying reads too, so the product never passes the depth (it was
    # 1.125 x at qd 128 when copies went uncounted). Below it by the Python loop's passes
    # between a landing and the next issue (0.91 of the depth at qd 32 on the H100, as the
    # compiled loop's absence costs uring-cmd on the VM), which the 5% law does not hold.
    product, r = in_flight(slow_device, iodepth=depth, engine="cpu-gpu")
    assert 0.85 * depth <= product <= (1 + TOLERANCE) * depth, (
        f"IOPS x mean latency = {product:.2f}, depth {depth}")


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [8, 32])
def test_gpu_uring_keeps_rings_times_depth(slow_device, depth):
    # each of the rings keeps iodepth reads in flight; GPU threads stamp submit and reap
    product, r = in_flight(slow_device, iodepth=depth, engine="gpu-uring", rings=2)
    assert_depth(product, 2 * depth, r)
    # every requester thread is either inside an I/O's stamps or idle between two of its
    # own: latency plus the idle spell, times the IOPS, is the threads
    (idle_us,) = r.engine_facts["idle_between_ios_us"]
    whole = r.read.ios / (r.runtime_ns / 1e9) * (r.lat.mean + idle_us * 1e3) / 1e9
    threads = r.engine_facts["requester_threads"]
    assert idle_us >= 0 and abs(whole - threads) <= TOLERANCE * threads, (whole, threads)
