"""NVMe passthrough entries (io/nvme/passthru.py) on the CPU: the one layout against the kernel's
headers (struct io_uring_sqe, struct nvme_uring_cmd: spec's 64-byte command at byte 48, the
ioctl number), and the Python builder against a C builder written as fio's io_uring_cmd
engine builds its commands, byte for byte over a sweep of namespaces, LBA sizes, offsets,
lengths and ops (the CUDA builder, kernels/nvme_cmd.cuh, is held to the Python one in
test_encoders.py). On a GPU (the ``gpu`` tests): the GPU's own run of the CUDA builder, and
agents posting passthrough commands through SQE128/CQE32 rings (a file that is no NVMe
namespace refuses every command: one failed I/O each, EOPNOTSUPP; an entry the kernel could
not parse would give EINVAL)."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import subprocess

import numpy as np
import pytest

from gpufio.io import cuda, uring
from gpufio.io.nvme import passthru, spec
from gpufio.io.gio import contract

HEADERS = "/usr/include/linux/nvme_ioctl.h"
HAVE_CC = shutil.which("gcc") is not None and os.path.exists(HEADERS) and \
    "nvme_uring_cmd" in open(HEADERS).read()


def sweep() -> list[tuple[int, int, int, int, bool, int, int, int, int]]:
    """(fd, sqe flags, nsid, lba shift, write, offset, length, addr, user_data) cases."""
    cases = []
    for nsid, shift, write in itertools.product((1, 2, 0xFFFFFFFE), (9, 12), (False, True)):
        lba = 1 << shift
        for off, length in ((0, lba), (lba, 8 * lba), (3 * lba, 128 << 10),
                            ((1 << 32) * lba, lba), (((1 << 40) + 7) * lba, 64 * lba)):
            cases.append((3 + nsid % 5, write, nsid, shift, write, off, length,
                          0x7F0000001000 + len(cases) * 4096,
                          len(cases) | 5 << 32))
    return cases


def python_words(cases) -> np.ndarray:
    fd, flags, nsid, shift, write, off, length, addr, ud = (np.array(c) for c in zip(*cases))
    return passthru.build(write=write.astype(bool), fd=fd, nsid=nsid, lba_shift=shift,
                          off=off.astype(np.uint64), length=length, addr=addr.astype(np.uint64),
                          user_data=ud.astype(np.uint64), sqe_flags=flags)


def _run(tmp_path, name: str, source: str, compiler: list[str], cases) -> np.ndarray:
    src = tmp_path / name
    src.write_text(source)
    exe = tmp_path / "builder"
    res = subprocess.run([*compiler, str(src), "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    stdin = "".join(" ".join(str(int(v)) for v in c) + "\n" for c in cases)
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    return np.array([[int(w) for w in line.split()] for line in out.stdout.splitlines()],
                    np.uint64)


LAYOUT_C = r"""
#include <linux/io_uring.h>
#include <linux/nvme_ioctl.h>
#include <stddef.h>
#include <stdio.h>
#define F(s, f) printf(#f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s*)0)->f))
#define C(s, f) printf("cmd_" #f " %zu %zu\n", 48 + offsetof(struct s, f), \
                         sizeof(((struct s*)0)->f))
int main(void) {
    F(io_uring_sqe, opcode); F(io_uring_sqe, flags); F(io_uring_sqe, ioprio);
    F(io_uring_sqe, fd); F(io_uring_sqe, cmd_op); F(io_uring_sqe, uring_cmd_flags);
    F(io_uring_sqe, user_data); F(io_uring_sqe, buf_index);
    C(nvme_uring_cmd, opcode); C(nvme_uring_cmd, flags); C(nvme_uring_cmd, nsid);
    C(nvme_uring_cmd, cdw2); C(nvme_uring_cmd, cdw3); C(nvme_uring_cmd, metadata);
    C(nvme_uring_cmd, addr); C(nvme_uring_cmd, metadata_len); C(nvme_uring_cmd, data_len);
    C(nvme_uring_cmd, cdw10); C(nvme_uring_cmd, cdw11); C(nvme_uring_cmd, cdw12);
    C(nvme_uring_cmd, cdw13); C(nvme_uring_cmd, cdw14); C(nvme_uring_cmd, cdw15);
    C(nvme_uring_cmd, timeout_ms);
    printf("cmd %zu\nsize %zu\nioctl %lu\nop %d\nsqe128 %u\ncqe32 %u\niopoll %u\nfixed %u\n",
           offsetof(struct io_uring_sqe, cmd), sizeof(struct nvme_uring_cmd),
           (unsigned long)NVME_URING_CMD_IO, IORING_OP_URING_CMD, IORING_SETUP_SQE128,
           IORING_SETUP_CQE32, IORING_SETUP_IOPOLL, IORING_URING_CMD_FIXED);
}
"""

# fio's way (engines/nvme.c fio_nvme_uring_cmd_prep, engines/io_uring.c prep): the SQE and
# the NVMe command written through the kernel's structs
FIO_STYLE_C = r"""
#include <linux/io_uring.h>
#include <linux/nvme_ioctl.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    unsigned fd, flags, nsid, shift, write, len; unsigned long long off, addr, ud;
    unsigned long long e[16];
    while (scanf("%u %u %u %u %u %llu %u %llu %llu", &fd, &flags, &nsid, &shift, &write, &off,
                 &len, &addr, &ud) == 9) {
        struct io_uring_sqe *sqe = (struct io_uring_sqe *)e;
        struct nvme_uring_cmd *cmd = (struct nvme_uring_cmd *)sqe->cmd;
        unsigned long long slba = off >> shift;
        memset(e, 0, sizeof e);
        sqe->opcode = IORING_OP_URING_CMD; sqe->flags = flags; sqe->fd = fd;
        sqe->cmd_op = NVME_URING_CMD_IO; sqe->user_data = ud;
        cmd->opcode = write ? 0x01 : 0x02; cmd->nsid = nsid;
        cmd->cdw10 = slba & 0xffffffff; cmd->cdw11 = slba >> 32;
        cmd->cdw12 = (len >> shift) - 1; cmd->addr = addr; cmd->data_len = len;
        for (int i = 0; i < 16; ++i) printf("%llu ", e[i]);
        printf("\n");
    }
}
"""

@pytest.mark.skipif(not HAVE_CC, reason="gcc or linux/nvme_ioctl.h with nvme_uring_cmd missing")
def test_the_layout_is_the_kernels_structs(tmp_path):
    src = tmp_path / "layout.c"
    src.write_text(LAYOUT_C)
    subprocess.run(["gcc", str(src), "-o", str(tmp_path / "layout")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True)
    got = {line.split()[0]: tuple(int(v) for v in line.split()[1:])
           for line in out.stdout.splitlines()}
    for name, off, size in passthru.SQE128_FIELDS:
        key = f"cmd_{name.removeprefix('nvme_')}" if off >= passthru.CMD_OFFSET else name
        assert got[key] == (off, size), name
    assert got["cmd"] == (passthru.CMD_OFFSET,) and got["size"] == (passthru.CMD_BYTES,)
    assert got["ioctl"] == (passthru.NVME_URING_CMD_IO,)
    assert got["op"] == (passthru.OP_URING_CMD,)
    assert got["fixed"] == (passthru.URING_CMD_FIXED,)
    assert (got["sqe128"], got["cqe32"], got["iopoll"]) == (
        (uring.SETUP_SQE128,), (uring.SETUP_CQE32,), (uring.SETUP_IOPOLL,))


def test_no_field_crosses_a_word_and_none_overlap():
    """What the CUDA builder's one-shift-per-field stores rely on."""
    taken = set()
    for name, off, size in passthru.SQE128_FIELDS:
        assert off // 8 == (off + size - 1) // 8 and off % size == 0, name
        assert not taken & set(range(off, off + size)), name
        taken |= set(range(off, off + size))
    assert max(taken) < passthru.SQE_BYTES


@pytest.mark.skipif(not HAVE_CC, reason="gcc or linux/nvme_ioctl.h with nvme_uring_cmd missing")
def test_the_python_builder_builds_what_fios_way_builds(tmp_path):
    cases = sweep()
    c_words = _run(tmp_path, "fio_style.c", FIO_STYLE_C, ["gcc"], cases)
    assert np.array_equal(python_words(cases), c_words)


def test_a_command_names_its_blocks():
    (w,) = passthru.build(write=True, fd=7, nsid=2, lba_shift=12, off=np.array([5 << 12]),
                          length=3 << 12, addr=np.array([0xABC000], np.uint64),
                          user_data=np.array([9], np.uint64), fixed_buffer=0)
    e = passthru.entries(w[None, :].copy())[0]
    assert (e["opcode"], e["fd"], e["cmd_op"]) == (46, 7, 0xC0484E80)
    assert (e["nvme_opcode"], e["nsid"], e["cdw10"], e["cdw11"], e["cdw12"]) == (1, 2, 5, 0, 2)
    assert (e["addr"], e["data_len"], e["user_data"]) == (0xABC000, 3 << 12, 9)
    assert (e["uring_cmd_flags"], e["buf_index"]) == (passthru.URING_CMD_FIXED, 0)


def test_completions_become_bytes_or_named_codes():
    res = passthru.result(np.array([0, 0x281, 0x4281, -5]), 4096)  # More/DNR: no cause
    assert res.tolist() == [4096, -(4096 + 0x281), -(4096 + 0x281), -5]
    assert spec.error_name(4096 + 0x281) == ("NVMe status 0x281: media and data "
                                                 "integrity, unrecovered read error")
    assert spec.error_name(4096 + 0x80) == "NVMe status 0x080: generic, LBA out of range"
    assert spec.error_name(5) == "EIO"
    assert contract.CONSTANTS["ERRNO_SLOTS"] > 4096 + 0x7FF


def test_a_ring_of_128_byte_entries_runs_a_nop():
    """SQE128/CQE32 rings on this kernel: a NOP in a 16-word row completes in a 4-word CQE."""
    if not uring.probe().get("big"):
        pytest.skip(uring.probe().get("big_reason", "no SQE128"))
    with uring.Ring(4, big=True) as ring:
        assert ring.sqes.shape == (4, 16) and ring.cqes.shape[1] == 4
        assert ring.flags & uring.SETUP_SQE128 and ring.flags & uring.SETUP_CQE32
        row = np.zeros((1, 16), np.uint64)
        row[0, 4] = 77  # user_data
        ring.push(row)
        ring.submit(wait=1, timeout_ns=5_000_000_000)
        ud, res = ring.reap()
        assert ud.tolist() == [77] and res.tolist() == [0]


BUILDER = r'''
#include "gio_queue.cuh"
#include "nvme_cmd.cuh"
// thread i builds entry i of the sweep into out[16 i ..] and decodes res[i] for len[i]
extern "C" __global__ void build(const unsigned* fd, const unsigned* flags, const unsigned* nsid,
                                 const unsigned* shift, const unsigned* write, const u64* off,
                                 const unsigned* len, const u64* addr, const u64* ud, int n,
                                 u64* out, const int* res, int* decoded)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 w[16];
    nvme_uring_sqe(w, fd[i], flags[i], nsid[i], shift[i], write[i] != 0, off[i], len[i], addr[i],
                   ud[i]);
    for (int k = 0; k < 16; ++k) out[16 * i + k] = w[k];
    decoded[i] = nvme_uring_result(res[i], len[i]);
}

// thread i sends one 4 KiB read at offs[i] through slot i % 32 and keeps its result
extern "C" __global__ void post(const GioQueue* q, int fd, const u64* offs, int n, int* res)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        res[i] = gio_read(q, i % 32, fd, offs[i], 4096);
        if (res[i] != (int)0x80000000) gio_release(q, i % 32);
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
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
    assert np.array_equal(decoded.get(), passthru.result(res, lens))


@pytest.mark.gpu
def test_agents_post_passthrough_commands_and_take_each_completion(tmp_path):
    """A regular file takes no NVMe command: each GPU-built URING_CMD completes (CQE32) with
    -EOPNOTSUPP, one failed I/O per request; an unparsed entry would give -EINVAL instead."""
    import cupy as cp

    from gpufio.core import targets
    from gpufio.io.gio.backends import uring as gpuqueue
    from gpufio.io.gio.backends.rings import ring_sizes

    path = tmp_path / "f.dat"
    targets.create_file(str(path), 1 << 20, 3)
    fd = targets.open_target(str(path), direct=False)
    sq, cq = ring_sizes(16, None)
    fn = cuda.raw_module(BUILDER).get_function("post")
    q = gpuqueue.UringQueue(nrings=2, depth=16, slot_bytes=4096, sq_entries=sq, cq_entries=cq,
                             idle_ms=1000, cpus=(), sqe_async=False, fds=[fd.fd],
                             registered=False, namespaces=np.array([1 | 9 << 32], np.uint64))
    try:
        assert all(r.sqe_bytes == 128 and r.cqe_bytes == 32 for r in q.rings.rings)
        n = 64
        offs = cp.asarray(np.arange(n, dtype=np.uint64) * 4096)
        res = cp.zeros(n, cp.int32)
        q.start(requesters=128)
        stream = cp.cuda.Stream(non_blocking=True)
        fn((1,), (128,), (q.descriptor, np.int32(q.file_refs[0]), offs, np.int32(n), res),
           stream=stream)
        q.wait((stream,), stall_ns=30_000_000_000)
        assert (res.get() == -errno.EOPNOTSUPP).all()
        assert q.rings.completed() == n
    finally:
        q.close()
        fd.close()
