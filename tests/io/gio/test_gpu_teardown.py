"""gpu-uring's teardown on a GPU: abort with reads in flight, restart after an abort, errors
after the queue started, requests the queue must refuse, workers sharing one GPU, and the
switches that would serialise its kernels (the review's findings, KERNEL-REVIEW.md)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpufio.core import targets
from gpufio.core.errors import BadInput
from gpufio.io import uring
from gpufio.io.gio import queue as gioqueue
from gpufio.io.gio.backends import uring as gpuqueue
from gpufio.io.gio.backends.rings import GpuRings, ring_sizes
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

pytestmark = pytest.mark.gpu

# each thread i reads offs[i] through slot slot0 + i % 32 (a slot per lane of a warp) and
# keeps the landed block's word 1 (its own offset, in the pattern's header)
READER = r'''
#include "gio_queue.cuh"
extern "C" __global__ void reader(const GioQueue* q, int fd, const u64* offs, int n, u64 slot0,
                                  unsigned len, u64* word1, int* res)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const u64 s = slot0 + i % 32;
        res[i] = gio_read(q, s, fd, offs[i], len);
        if (res[i] > 0) word1[i] = ((volatile const u64*)gio_landing(q, s))[1];
        if (res[i] != (int)0x80000000) gio_release(q, s);
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
'''


def _queue(fd, depth=16, nrings=2, registered=False):
    sq, cq = ring_sizes(depth, None)
    return gpuqueue.UringQueue(nrings=nrings, depth=depth, slot_bytes=4096, sq_entries=sq,
                                cq_entries=cq, idle_ms=1000, cpus=(), sqe_async=True, fds=[fd],
                                registered=registered)


def _launch(q, fn, fd, offs, slot0=0, length=4096):
    import cupy as cp

    n = len(offs)
    d_offs, word1, res = cp.asarray(offs), cp.zeros(n, cp.uint64), cp.zeros(n, cp.int32)
    blocks = (n + 127) // 128
    q.start(requesters=blocks * 128)
    stream = cp.cuda.Stream(non_blocking=True)
    fn((blocks,), (128,), (q.descriptor, np.int32(q.file_refs[0]), d_offs, np.int32(n),
                           np.uint64(slot0), np.uint32(length), word1, res), stream=stream)
    return stream, word1, res


@pytest.fixture
def reader():

    from gpufio.io import cuda

    mod = cuda.raw_module(READER)
    return mod.get_function("reader")  # loaded before any agent spins


def test_abort_with_reads_in_flight_drains_then_restarts_without_stale_completions(
        tmp_path, reader):
    path = tmp_path / "big.dat"
    targets.create_file(str(path), 64 << 20, 21)
    fd = targets.open_target(str(path), direct=False)  # buffered: io-wq copies into the slots
    q = _queue(fd.fd)
    try:
        rng = np.random.default_rng(1)
        offs = rng.integers(0, (64 << 20) // 4096, 200_000).astype(np.uint64) * 4096
        stream, _, _ = _launch(q, reader, fd.fd, offs)
        time.sleep(0.05)  # reads are flowing
        with pytest.raises(gpuqueue.QueueStalled, match="stop"):
            q.abort("stop", (stream,))
        assert q.kernels_done
        # the same queue again: start drains what the abort left in flight, and the new
        # generation never takes an old completion for its own
        offs2 = rng.integers(0, (64 << 20) // 4096, 4000).astype(np.uint64) * 4096
        stream, word1, res = _launch(q, reader, fd.fd, offs2)
        q.wait((stream,), stall_ns=30_000_000_000)
        assert (res.get() == 4096).all() and (word1.get() == offs2).all()
    finally:
        q.close()
        fd.close()
    assert q not in gioqueue.WEDGED


def test_out_of_range_slots_abort_and_long_reads_fail_with_einval(pattern_file, pattern_fd,
                                                                  reader):
    q = _queue(pattern_fd)
    try:
        stream, _, res = _launch(q, reader, pattern_fd, np.zeros(32, np.uint64), length=8192)
        q.wait((stream,), stall_ns=30_000_000_000)
        assert (res.get() == -22).all() and q.bad_slot() is None  # longer than a slot
        slots = q.nrings * q.depth
        stream, _, res = _launch(q, reader, pattern_fd, np.zeros(32, np.uint64), slot0=slots)
        q.wait((stream,), stall_ns=10_000_000_000)  # the kernel's own abort ends them
        assert stream.done and q.agent_stream.done and q.bad_slot() == slots
    finally:
        q.close()


def run(paths, **opts):
    glob = {"engine": "gpu-uring", "targets": [str(p) for p in paths], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_workers_sharing_one_gpu_run_together(pattern_file):
    r = run([pattern_file], numjobs=2, rings=2, iodepth=16, runtime="1500ms", time_based=True,
            verify=True)
    assert r.ok, r.failure
    ios = [w["ios"] for w in r.per_worker]
    # one after another, the second worker would find the run over and read (almost) nothing
    assert len(ios) == 2 and min(ios) > 0.25 * max(ios), ios


def test_an_error_after_the_queue_started_stops_its_kernels(pattern_file, monkeypatch):
    calls = {"n": 0}
    real = GpuRings.wake

    def failing(self, check=True):
        calls["n"] += 1
        if calls["n"] == 50:
            raise uring.UringError("io_uring_enter failed: EBADF (planted)")
        return real(self, check)

    monkeypatch.setattr(GpuRings, "wake", failing)
    started = time.monotonic()
    r = run([pattern_file], rings=1, iodepth=8, runtime="30s", time_based=True)
    assert time.monotonic() - started < 20
    assert not r.ok and "planted" in r.failure
    monkeypatch.setattr(GpuRings, "wake", real)
    again = run([pattern_file], rings=1, iodepth=8, io_size="4m", verify=True)
    assert again.ok and again.ios == 1024  # the agents stopped: the GPU is free for the next


def test_launch_blocking_is_refused_with_a_reason(pattern_file, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    with pytest.raises(BadInput, match="CUDA_LAUNCH_BLOCKING=1 runs kernels one at a time"):
        run([pattern_file], rings=1, iodepth=4, io_size="1m")
