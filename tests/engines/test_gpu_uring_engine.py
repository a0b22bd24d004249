"""gpu-uring on a GPU: verified data for the shapes that stress the request path, errors
part-way, and a planted stall caught by the watchdog (needs a GPU and Linux 6.6+)."""

import os
import threading
import time

import pytest

from gpufio.core import targets
from gpufio.facts.host import kernel_version
from gpufio.io.gio.backends.rings import GpuRings
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

pytestmark = pytest.mark.gpu


def run(paths, **opts):
    glob = {"engine": "gpu-uring", "targets": [str(p) for p in paths], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "rings": 2, "iodepth": 32},
    {"rw": "read", "rings": 1, "iodepth": 8, "bs": "64k"},
    {"rw": "randread", "rings": 2, "iodepth": 8, "land": "host"},
    {"rw": "randread", "rings": 2, "iodepth": 8, "sqe_async": True},
    {"rw": "randread", "rings": 2, "iodepth": 8, "registered": False},
    {"rw": "randread", "rings": 4, "iodepth": 8, "sq_threads": 1},
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


@pytest.mark.parametrize("registered", [True, False])
def test_nop_requests_complete_through_the_rings_without_storage(pattern_file, registered):
    r = run([pattern_file], op="nop", rings=2, iodepth=16, io_size="16m", registered=registered)
    assert r.ok, (r.failure, r.errors)
    assert r.ios == (16 << 20) // 4096 and r.lat.n == r.ios
    assert r.engine_facts["op"] == "nop" and r.engine_facts["lands_in"] == "nothing: NOPs"
    (price,) = r.engine_facts["gpu_price"]
    assert price["agent_warps"] == 2 and price["requester_threads"] == 128
    assert 0 < price["sms_occupied"] <= price["sms"]


def test_tiny_rings_wrap_over_100k_ios(pattern_file):
    r = run([pattern_file], rings=1, ring_entries=2, iodepth=2, io_size=f"{100_000 * 4}k",
            verify=True)
    assert r.ok and r.ios == 100_000 and r.verify_failures == 0


def test_more_requester_threads_than_ring_slots(pattern_file):
    r = run([pattern_file], rings=2, iodepth=4, threads=1000, io_size="16m", verify=True)
    assert r.ok and r.ios == 4096 and r.verify_failures == 0
    assert r.engine_facts["requester_threads"] == 1000


def test_a_timed_run_reports_each_sqpoll_threads_working_share(pattern_file):
    r = run([pattern_file], rings=3, sq_threads=2, iodepth=8, runtime="1s", time_based=True,
            verify=True)
    assert r.ok and r.verify_failures == 0 and r.engine_facts["sq_threads"] == 2
    if kernel_version() >= (6, 13):  # SqWorkTime in the ring's fdinfo
        # a thread whose CPU time the kernel has not moved on between the readings is left out
        shares = r.engine_facts["sq_thread_busy"]
        assert 1 <= len(shares) <= 2 and all(0 < s <= 1 for s in shares)


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
    monkeypatch.setattr(GpuRings, "wake", lambda self, check=True: 0)  # it stays asleep
    started = time.monotonic()
    r = run([pattern_file], rings=1, iodepth=4, sq_thread_idle="1ms", stall_timeout="1s",
            runtime="30s", time_based=True)
    assert time.monotonic() - started < 15
    assert not r.ok and "no read completed for 1 s; kernels stopped" in r.failure
    assert "NEED_WAKEUP" in r.failure and "in flight" in r.failure


READ_EACH = r'''
#include "gio_queue.cuh"
extern "C" __global__ void read_each(const GioQueue* q, int fd, const u64* offs, int n,
                                     u64* word1, int* res)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        // a slot per lane of a warp (2 rings x 16 = 32 slots): lanes of one warp never wait
        // for each other in lock step; other warps share slots, and gio_read waits its turn
        const u64 s = i % (q->nrings * q->depth);
        res[i] = gio_read(q, s, fd, offs[i], 4096);
        word1[i] = ((volatile const u64*)gio_landing(q, s))[1];
        gio_release(q, s);
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
'''


@pytest.mark.parametrize("registered", [True, False])
def test_any_kernel_can_read_through_the_request_api(pattern_file, pattern_fd, registered):
    """A kernel of its own (not the benchmark) uses the blocking gio_read on a UringQueue,
    naming the file by its queue reference (registered index, or the descriptor)."""
    import cupy as cp
    import numpy as np

    from gpufio import gpu  # as a kernel author does (docs/design/GPU-REQUEST-API.md)

    sq, cq = gpu.ring_sizes(16, None)
    q = gpu.UringQueue(nrings=2, depth=16, slot_bytes=4096, sq_entries=sq, cq_entries=cq,
                       idle_ms=1000, cpus=(), sqe_async=True, fds=[pattern_fd],
                       registered=registered)
    assert q.file_refs.tolist() == [0 if registered else pattern_fd]
    try:
        mod = gpu.compile_kernel(READ_EACH)
        read_each = mod.get_function("read_each")  # load before the agents spin (see start)
        n = 2000
        offs = np.random.default_rng(3).integers(0, 1024, n).astype(np.uint64) * 4096
        d_offs, word1, res = cp.asarray(offs), cp.zeros(n, cp.uint64), cp.zeros(n, cp.int32)
        cp.cuda.Device().synchronize()
        blocks = (n + 127) // 128
        q.start(requesters=blocks * 128)
        stream = cp.cuda.Stream(non_blocking=True)
        read_each((blocks,), (128,), (q.descriptor, np.int32(q.file_refs[0]), d_offs, np.int32(n),
                                      word1, res), stream=stream)
        q.wait((stream,), stall_ns=30_000_000_000)
        assert stream.done and q.agent_stream.done and q.kernels_done
        assert (res.get() == 4096).all()
        assert (word1.get() == offs).all()  # header word 1 of each block is its own offset
    finally:
        q.close()


def test_a_drive_gets_one_sqpoll_thread_and_the_result_says_what_it_cost(pattern_file):
    """rings on a file on a disk: one SQPOLL thread serves them all by default, and the
    result gives each thread's CPU seconds over the measured phase (Linux 6.13+)."""
    from gpufio.facts.storage import ram_backing

    if ram_backing(str(pattern_file)):
        pytest.skip("the temporary directory is RAM-backed here: one thread per ring")
    r = run([pattern_file], rings=4, iodepth=8, runtime="1s", time_based=True, verify=True)
    assert r.ok and r.verify_failures == 0 and r.engine_facts["sq_threads"] == 1
    if kernel_version() >= (6, 13):
        cpu = r.engine_facts["sq_thread_cpu_s"]
        assert len(cpu) == 1 and 0 < cpu[0] < 10
