"""The GPU side of BaM's mechanism (io/gio/backends/nvme.py, kernels/bam_*.cu) against the software
NVMe controller (io/nvme/model.py in its own process), on a GPU: GPU-built commands equal
the CPU builder's byte for byte; reads land verified in GPU memory with relay and direct
doorbells over odd geometry (queue depths not powers of two, 4096-byte LBAs, transfers that
need PRP lists, two queue pairs); writes and Flush; an injected status is one failed I/O;
a dropped completion stops the queue with the watchdog's diagnostic, and after a controller
reset the queues run again. Every test is a few hundred I/Os.

    python3 -m pytest -q -p no:cacheprovider tests/io/nvme/test_bam_gpu.py
"""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest

from gpufio.core import pattern, targets
from gpufio.io import cuda, kernels, verify
from gpufio.io.kernels import Kernel
from gpufio.io.nvme import spec as nq
from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel
from gpufio.io.gio.queue import QueueStalled
from gpufio.io.nvme.model import Fault, ModelProcess

SEED = 1234
SIZE = 8 << 20
READ, WRITE, FLUSH = 0, 1, 2
UNSET = -(1 << 31)

BUILDER = r'''
#include "nvme_cmd.cuh"
extern "C" __global__ void build(const unsigned* kind, const unsigned* cid, const unsigned* nsid,
                                 const unsigned* shift, const u64* off, const unsigned* len,
                                 const u64* prp1, const u64* prp2, const unsigned* status,
                                 int n, u64* out, int* res)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {  // entry i built straight into its 64 bytes of out
        res[i] = nvme_cqe_result(status[i], len[i]);
        nvme_cmd(out + 8 * i, kind[i] == 2, kind[i] == 1, cid[i], nsid[i], shift[i], off[i],
                 len[i], prp1[i], prp2[i]);
    }
}
'''


@pytest.mark.gpu
def test_gpu_threads_build_the_cpu_builders_commands_byte_for_byte():
    import cupy as cp

    rng = np.random.default_rng(3)
    n = 256
    kind = rng.integers(0, 3, n).astype(np.uint32)
    shift = rng.choice([9, 12], n).astype(np.uint32)
    blocks = rng.integers(1, 64, n).astype(np.uint64)
    length = (blocks << shift.astype(np.uint64)).astype(np.uint32)
    off = (rng.integers(0, 1 << 40, n).astype(np.uint64) >> shift) << shift
    cid = rng.integers(0, 1 << 16, n).astype(np.uint32)
    nsid = rng.integers(1, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    prp1 = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    prp2 = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    status = rng.choice([0, 1, 0x281 << 1, 0x4002 << 1 | 1], n).astype(np.uint32)
    expect = nq.io_commands(write=kind == 1, nsid=nsid, lba_shift=shift, off=off, length=length,
                            cid=cid, prp1=prp1, prp2=prp2)
    for i in np.flatnonzero(kind == 2):
        expect[i] = nq.flush_command(int(nsid[i]), int(cid[i]))[0]
    out, res = cp.zeros(8 * n, cp.uint64), cp.zeros(n, cp.int32)
    fn = cuda.raw_module(BUILDER).get_function("build")
    fn((1,), (n,), (*(cp.asarray(a) for a in (kind, cid, nsid, shift, off, length, prp1, prp2,
                                              status)), np.int32(n), out, res))
    assert out.get().view(np.uint8).tobytes() == expect.tobytes()
    assert list(res.get()) == list(nq.result(status, length.astype(np.int64)))


@pytest.fixture
def controller():
    """A factory: controller(lba_shift, faults) -> (ModelProcess, Host, RegisteredModel),
    its shared memory on /dev/shm (pinnable), all stopped and removed afterwards."""
    made, regs, where = [], [], tempfile.mkdtemp(prefix="gpufio-bam-", dir="/dev/shm")

    def make(lba_shift: int = 9, faults: list[Fault] = ()):
        backing = f"{where}/ns{len(made)}.dat"
        targets.create_file(backing, SIZE, SEED)
        m = ModelProcess(where, backing, lba_shift, 64 << 20, list(faults))
        made.append(m)
        regs.append(RegisteredModel(m.mem))
        return m, m.host(), regs[-1]

    yield make
    for m in made:
        m.stop()
    for reg in regs:
        reg.close()
    shutil.rmtree(where, ignore_errors=True)


def run(q: NvmeQueues, offs, lens, kinds, rows=None, stall_ns: int = 10**10):
    """The requests through q (one thread per slot, each serving its share in order):
    (results, the rows of GPU memory the reads landed in)."""
    import cupy as cp

    fn = kernels.function(Kernel.NVME_REQUESTS)  # loaded before the agents run
    n, width = len(offs), max(lens)
    slots = q.nrings * q.depth
    tpb = min(32, slots, n)
    threads = tpb * max(1, min(n, slots) // tpb)
    rows = cp.zeros((n, width), cp.uint8) if rows is None else rows
    res = cp.full(n, UNSET, cp.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    q.start(threads)
    fn((threads // tpb,), (tpb,), (q.descriptor, np.uint64(n), cp.asarray(offs, cp.uint64),
                                   cp.asarray(lens, cp.uint32), cp.asarray(kinds, cp.uint8),
                                   rows, np.uint64(width // 16), np.int32(1), res),
       stream=stream)
    q.wait((stream,), stall_ns)
    return res.get(), rows


def queues(host, reg, *, pairs: int, entries: int, depth: int, slot: int, shift: int,
           mode: str) -> NvmeQueues:
    made = [host.create_pair(1 + i, entries) for i in range(pairs)]
    return NvmeQueues(reg, made, depth=depth, slot_bytes=slot, nsid=1, lba_shift=shift,
                      mode=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["relay", "direct"])
@pytest.mark.parametrize("shift,entries,depth,length", [(9, 7, 5, 3 * 4096 + 512),
                                                         (12, 33, 20, 64 << 10)])
def test_reads_land_verified_in_gpu_memory(controller, mode, shift, entries, depth, length):
    _, host, reg = controller(shift)
    q = queues(host, reg, pairs=2, entries=entries, depth=depth,
               slot=-(-length // 4096) * 4096, shift=shift, mode=mode)
    try:
        rng = np.random.default_rng(5)
        n = 300  # wraps each queue's phase several times
        offs = rng.integers(0, (SIZE - length) >> shift, n).astype(np.uint64) << np.uint64(shift)
        res, rows = run(q, offs, [length] * n, [READ] * n)
        assert list(res) == [length] * n
        assert verify.bad_ios_device(rows.ravel(), offs, np.full(n, SEED), length).size == 0
        if mode == "relay":
            assert q.relay.writes > 0
    finally:
        q.close()


@pytest.mark.gpu
def test_agent_warps_packed_to_a_block_serve_every_pair(controller):
    """Five pairs' agents two warps to a block: three blocks, the last one's spare warp gone
    at once; every pair serves its requesters, every read lands its offset's bytes."""
    _, host, reg = controller(9)
    q = queues(host, reg, pairs=5, entries=9, depth=4, slot=4096, shift=9, mode="direct")
    q.warps_per_block = 2
    assert q.agent_grid() == ((3,), (64,))
    try:
        rng = np.random.default_rng(7)
        n = 400
        offs = rng.integers(0, (SIZE - 4096) >> 9, n).astype(np.uint64) << np.uint64(9)
        res, rows = run(q, offs, [4096] * n, [READ] * n)
        assert list(res) == [4096] * n
        assert verify.bad_ios_device(rows.ravel(), offs, np.full(n, SEED), 4096).size == 0
        # 20 requester threads, thread t on slot t of ring t // 4: 80 reads a pair
        assert [int(c) for c in q.progress[:, 1]] == [80] * 5
        assert [int(c) for c in q.progress[:, 0]] == [80] * 5
    finally:
        q.close()


@pytest.mark.gpu
def test_writes_and_flush_reach_the_backing_file(controller):
    import cupy as cp

    m, host, reg = controller(12)
    q = queues(host, reg, pairs=1, entries=10, depth=6, slot=16384, shift=12, mode="relay")
    try:
        n, length = 24, 16384
        offs = np.arange(n, dtype=np.uint64) * np.uint64(2 * length)
        rows = cp.zeros((n, length), cp.uint8)
        verify.fill(rows, cp.arange(n, dtype=cp.uint64), cp.asarray(offs),
                    cp.full(n, 55, cp.uint64), n, length)
        res, _ = run(q, offs, [length] * n, [WRITE] * n, rows)
        assert list(res) == [length] * n
        res, _ = run(q, [0], [4096], [FLUSH])
        assert list(res) == [0]
        res, back = run(q, offs, [length] * n, [READ] * n)
        assert list(res) == [length] * n
        assert verify.bad_ios_device(back.ravel(), offs, np.full(n, 55), length).size == 0
    finally:
        q.close()
    with open(m.mem.path.replace("nvme-model.shm", "ns0.dat"), "rb") as f:
        f.seek(int(offs[3]))
        assert f.read(length) == pattern.fill(55, int(offs[3]), length)


@pytest.mark.gpu
def test_an_injected_status_is_one_failed_io(controller):
    _, host, reg = controller(9, [Fault(slba=8 * 5, status=0x281)])
    q = queues(host, reg, pairs=1, entries=16, depth=8, slot=4096, shift=9, mode="direct")
    try:
        offs = np.arange(16, dtype=np.uint64) * np.uint64(4096)
        res, _ = run(q, offs, [4096] * 16, [READ] * 16)
        assert [i for i, r in enumerate(res) if r != 4096] == [5]
        assert nq.error_name(-int(res[5])) == \
            "NVMe status 0x281: media and data integrity, unrecovered read error"
    finally:
        q.close()


@pytest.mark.gpu
def test_a_stall_names_a_software_controller_that_has_ended(controller):
    m, host, reg = controller(9)
    q = queues(host, reg, pairs=1, entries=9, depth=4, slot=4096, shift=9, mode="relay")
    m._proc.kill()
    m._proc.join()
    try:
        with pytest.raises(QueueStalled, match=r"the software controller's process has "
                                               r"ended \(killed by signal 9\)"):
            run(q, [0, 4096], [4096] * 2, [READ] * 2, stall_ns=500_000_000)
        assert q.kernels_done
    finally:
        q.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["relay", "direct"])
def test_a_dropped_completion_is_named_and_a_reset_restarts(controller, mode):
    _, host, reg = controller(9, [Fault(slba=8 * 3, drop=True)])
    q = queues(host, reg, pairs=1, entries=9, depth=4, slot=4096, shift=9, mode=mode)
    offs = np.arange(12, dtype=np.uint64) * np.uint64(4096)
    try:
        with pytest.raises(QueueStalled, match="held by the controller"):
            run(q, offs, [4096] * 12, [READ] * 12, stall_ns=500_000_000)
        assert q.kernels_done
    finally:
        q.close()
    host.reset()  # the dropped command goes with the queues
    host.enable()
    q = queues(host, reg, pairs=1, entries=9, depth=4, slot=4096, shift=9, mode=mode)
    try:
        res, rows = run(q, offs, [4096] * 12, [READ] * 12)
        assert list(res) == [4096] * 12
        assert verify.bad_ios_device(rows.ravel(), offs, np.full(12, SEED), 4096).size == 0
    finally:
        q.close()
