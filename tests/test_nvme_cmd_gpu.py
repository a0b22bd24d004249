"""NVMe passthrough entries built by GPU threads (gpu-uring's passthrough mode), on a GPU:
the CUDA builder's SQE128 entries equal the CPU builder's byte for byte over the sweep of
tests/test_nvme_cmd.py, its completion decoding equals io/nvme_cmd.result, and agents that
post passthrough commands through SQE128/CQE32 rings take the kernel's completion of each
(a file that is no NVMe namespace refuses every command: one failed I/O each, EOPNOTSUPP).
The kernel is compiled (nvcc -cubin) without a GPU by tests/test_kernel_sources.py."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from gpufio.io import cuda, nvme_cmd
from tests.test_nvme_cmd import python_words, sweep

BUILDER = r'''
#include "gio_queue.cuh"
// thread i builds entry i of the sweep into out[16 i ..] and decodes res[i] for len[i]
extern "C" __global__ void build(const unsigned* fd, const unsigned* flags, const unsigned* nsid,
                                 const unsigned* shift, const unsigned* write, const u64* off,
                                 const unsigned* len, const u64* addr, const u64* ud, int n,
                                 u64* out, const int* res, int* decoded)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 w[16];
    pt_sqe(w, fd[i], flags[i], nsid[i], shift[i], write[i] != 0, off[i], len[i], addr[i], ud[i]);
    for (int k = 0; k < 16; ++k) out[16 * i + k] = w[k];
    decoded[i] = pt_result(res[i], len[i]);
}
'''


@pytest.mark.gpu
def test_gpu_threads_build_the_cpus_entries_byte_for_byte():
    import cupy as cp

    cases = sweep()
    cols = list(zip(*cases))
    kinds = (cp.uint32, cp.uint32, cp.uint32, cp.uint32, cp.uint32, cp.uint64, cp.uint32,
             cp.uint64, cp.uint64)
    args = [cp.asarray(np.array(c, dtype=np.uint64).astype(k)) for c, k in zip(cols, kinds)]
    lens = np.array(cols[6])
    res = np.array([0, 0x281, 0x4002, -errno.EIO] * (len(cases) // 4 + 1), np.int32)[:len(cases)]
    out, decoded = cp.zeros(16 * len(cases), cp.uint64), cp.zeros(len(cases), cp.int32)
    fn = cuda.raw_module(BUILDER).get_function("build")
    fn(((len(cases) + 127) // 128,), (128,), (*args, np.int32(len(cases)), out,
                                             cp.asarray(res), decoded))
    gpu_words = out.get().reshape(len(cases), 16)
    assert np.array_equal(gpu_words, python_words(cases))
    assert np.array_equal(decoded.get(), nvme_cmd.result(res, lens))


@pytest.mark.gpu
def test_agents_post_passthrough_commands_and_take_each_completion(tmp_path):
    """A regular file takes no NVMe command: each GPU-built URING_CMD completes (CQE32) with
    -EOPNOTSUPP, one failed I/O per request; an unparsed entry would give -EINVAL instead."""
    import cupy as cp

    from gpufio.core import targets
    from gpufio.io.gio import queue as gpuqueue
    from gpufio.io.gio.rings import ring_sizes
    from tests.test_gpu_teardown import READER

    path = tmp_path / "f.dat"
    targets.create_file(str(path), 1 << 20, 3)
    fd = targets.open_target(str(path), direct=False)
    sq, cq = ring_sizes(16, None)
    fn = cuda.raw_module(READER).get_function("reader")
    q = gpuqueue.DeviceQueue(nrings=2, depth=16, slot_bytes=4096, sq_entries=sq, cq_entries=cq,
                             idle_ms=1000, cpus=(), sqe_async=False, fds=[fd.fd],
                             registered=False, namespaces=np.array([1 | 9 << 32], np.uint64))
    try:
        assert all(r.sqe_bytes == 128 and r.cqe_bytes == 32 for r in q.rings.rings)
        n = 64
        offs = cp.asarray(np.arange(n, dtype=np.uint64) * 4096)
        word1, res = cp.zeros(n, cp.uint64), cp.zeros(n, cp.int32)
        q.start(requesters=128)
        stream = cp.cuda.Stream(non_blocking=True)
        fn((1,), (128,), (q.descriptor, np.int32(q.file_refs[0]), offs, np.int32(n),
                          np.uint64(0), np.uint32(4096), word1, res), stream=stream)
        q.wait((stream,), stall_ns=30_000_000_000)
        assert (res.get() == -errno.EOPNOTSUPP).all()
        assert q.rings.completed() == n
    finally:
        q.close()
        fd.close()
