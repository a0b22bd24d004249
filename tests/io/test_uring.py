"""The io_uring layer, driven from the CPU the way the GPU producer will drive it."""

import ctypes
import errno
import os
import re
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from gpufio.core import pattern, targets
from gpufio.io import uring
from gpufio.native import uring as sys_uring

pytestmark = pytest.mark.skipif(not uring.probe()["available"],
                                reason=f"io_uring unavailable: {uring.probe().get('reason')}")

# offsetof/sizeof from include/uapi/linux/io_uring.h
SQE_FIELDS = {"opcode": 0, "flags": 1, "ioprio": 2, "fd": 4, "off": 8, "addr": 16, "len": 24,
              "rw_flags": 28, "user_data": 32, "buf_index": 40, "personality": 42,
              "splice_fd_in": 44, "addr3": 48}
CQE_FIELDS = {"user_data": 0, "res": 8, "flags": 12}
SQOFF = ["head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array", "resv1"]
CQOFF = ["head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags", "resv1"]
PARAMS = {"sq_entries": 0, "cq_entries": 4, "flags": 8, "sq_thread_cpu": 12,
          "sq_thread_idle": 16, "features": 20, "wq_fd": 24, "resv": 28, "sq_off": 40,
          "cq_off": 80}


def test_abi_matches_the_kernel_header_values():
    assert uring.SQE_DTYPE.itemsize == 64 and uring.CQE_DTYPE.itemsize == 16
    for name, off in SQE_FIELDS.items():
        assert uring.SQE_DTYPE.fields[name][1] == off, name
    for name, off in CQE_FIELDS.items():
        assert uring.CQE_DTYPE.fields[name][1] == off, name
    for struct, names in ((sys_uring.SqOffsets, SQOFF), (sys_uring.CqOffsets, CQOFF)):
        assert ctypes.sizeof(struct) == 40
        for i, name in enumerate(names):
            assert getattr(struct, name).offset == 4 * i
        assert struct.user_addr.offset == 32
    assert ctypes.sizeof(sys_uring.Params) == 120
    for name, off in PARAMS.items():
        assert getattr(sys_uring.Params, name).offset == off, name
    assert ctypes.sizeof(sys_uring.GeteventsArg) == 24


HEADER = "/usr/include/linux/io_uring.h"


@pytest.mark.skipif(not (shutil.which("cc") and os.path.exists(HEADER)),
                    reason="no C compiler or kernel headers")
def test_abi_matches_the_installed_header_compiled(tmp_path):
    lines = [f'P("sqe.{f}", offsetof(struct io_uring_sqe, {f}));' for f in SQE_FIELDS
             if f not in ("splice_fd_in", "addr3")]
    lines += [f'P("cqe.{f}", offsetof(struct io_uring_cqe, {f}));' for f in CQE_FIELDS]
    lines += [f'P("sq.{f}", offsetof(struct io_sqring_offsets, {f}));' for f in SQOFF]
    lines += [f'P("cq.{f}", offsetof(struct io_cqring_offsets, {f}));' for f in CQOFF]
    lines += [f'P("p.{f}", offsetof(struct io_uring_params, {f}));' for f in PARAMS]
    lines += ['P("sizeof.sqe", sizeof(struct io_uring_sqe));',
              'P("sizeof.cqe", sizeof(struct io_uring_cqe));',
              'P("sizeof.params", sizeof(struct io_uring_params));']
    src = tmp_path / "abi.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <linux/io_uring.h>\n"
                   '#define P(n, v) printf("%s %zu\\n", n, (size_t)(v))\n'
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0; }\n")
    subprocess.run(["cc", "-o", str(tmp_path / "abi"), str(src)], check=True)
    out = dict(line.split() for line in subprocess.run(
        [str(tmp_path / "abi")], capture_output=True, text=True, check=True).stdout.splitlines())
    for name in SQE_FIELDS:
        if f"sqe.{name}" in out:
            assert int(out[f"sqe.{name}"]) == uring.SQE_DTYPE.fields[name][1]
    for name in CQE_FIELDS:
        assert int(out[f"cqe.{name}"]) == uring.CQE_DTYPE.fields[name][1]
    for name in SQOFF:
        assert int(out[f"sq.{name}"]) == getattr(sys_uring.SqOffsets, name).offset
    for name in CQOFF:
        assert int(out[f"cq.{name}"]) == getattr(sys_uring.CqOffsets, name).offset
    for name in PARAMS:
        assert int(out[f"p.{name}"]) == getattr(sys_uring.Params, name).offset
    assert (int(out["sizeof.sqe"]), int(out["sizeof.cqe"]), int(out["sizeof.params"])) == \
        (64, 16, 120)


def read_all(ring, fd, offsets, bs=4096, slots=None):
    """Push/submit/reap reads of ``offsets`` through ``ring``; returns the data per offset."""
    slots = slots or ring.sq_entries
    mem = targets.aligned_buffer(slots * bs)
    buf = np.frombuffer(mem, np.uint8).reshape(slots, bs)
    base = np.uint64(buf.ctypes.data)
    got = np.zeros((len(offsets), bs), np.uint8)
    free = list(range(slots))
    owner = {}
    nxt = 0
    results = {}
    while nxt < len(offsets) or ring.inflight:
        k = min(len(free), ring.space(), len(offsets) - nxt)
        if k:
            s = np.array(free[:k], np.uint64)
            del free[:k]
            for j, slot in enumerate(s.tolist()):
                owner[slot] = nxt + j
            ring.push(uring.sqe_words(opcode=uring.OP_READ, sqe_flags=0, fd=np.full(k, fd),
                                      off=np.asarray(offsets[nxt:nxt + k], np.uint64),
                                      addr=base + s * np.uint64(bs), length=bs, user_data=s))
            nxt += k
        ring.submit(wait=1, timeout_ns=2_000_000_000)
        ud, res = ring.reap()
        for slot, r in zip(ud.tolist(), res.tolist()):
            i = owner.pop(slot)
            results[i] = r
            got[i] = buf[slot]
            free.append(slot)
    del buf
    mem.close()
    return got, [results[i] for i in range(len(offsets))]


MODES = [
    {},
    {"sqpoll": True},
    {"user_memory": True},
    {"user_memory": True, "sqpoll": True, "no_sqarray": True},
    {"single_issuer": True},
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "+".join(m) or "kernel-mapped")
def test_round_trip_data_matches_the_pattern(mode, pattern_fd):
    offsets = (np.random.default_rng(0).integers(0, 1024, 500) * 4096).tolist()
    with uring.Ring(8, **mode) as ring:
        got, res = read_all(ring, pattern_fd, offsets)
        assert ring.inflight == 0
        assert ring.state()["cq_overflow"] == 0
    assert res == [4096] * len(offsets)
    for i, off in enumerate(offsets):
        assert np.array_equal(got[i].view("<u8"), pattern.expected_words(1234, off, 4096))


def test_caller_supplied_memory_is_page_aligned_and_exposed(pattern_fd):
    with uring.Ring(4, user_memory=True) as ring:
        assert len(ring.regions) == 2
        for region in ring.regions:
            assert region.addr % 4096 == 0 and region.size % 4096 == 0
        assert ring.ring_words["sqes"] == ring.regions[0].addr


def test_tiny_ring_wraps_over_thousands_of_ios(pattern_fd):
    offsets = [(i * 7 % 1024) * 4096 for i in range(5000)]
    with uring.Ring(2, cq_entries=2) as ring:
        assert (ring.sq_entries, ring.cq_entries) == (2, 2)
        got, res = read_all(ring, pattern_fd, offsets)
        state = ring.state()
    assert res == [4096] * 5000
    assert state["sq_tail"] == state["sq_head"] == 5000 and state["cq_head"] == 5000
    for i in (0, 1, 2, 2047, 4999):
        assert got[i].view("<u8")[1] == offsets[i]  # header word 1 holds the block's offset


def test_cq_capacity_caps_what_may_be_pushed(pattern_fd):
    with uring.Ring(8, cq_entries=8) as ring:
        words = uring.sqe_words(opcode=uring.OP_NOP, sqe_flags=0, fd=np.zeros(8), off=np.zeros(8),
                                addr=np.zeros(8), length=0, user_data=np.arange(8))
        assert ring.space() == 8
        ring.push(words[:6])
        assert ring.space() == 2
        with pytest.raises(uring.UringError, match="more in flight than the CQ holds"):
            ring.push(words)
        ring.submit(wait=6, timeout_ns=1_000_000_000)
        ud, res = ring.reap()
        assert sorted(ud.tolist()) == [0, 1, 2, 3, 4, 5] and res.tolist() == [0] * 6
        assert ring.space() == 8 and ring.inflight == 0


def test_error_completions_carry_the_errno(pattern_file, tmp_path):
    wfd = os.open(pattern_file, os.O_WRONLY)
    small = tmp_path / "small.dat"
    small.write_bytes(b"x" * 4096)
    sfd = os.open(small, os.O_RDONLY)
    try:
        with uring.Ring(4) as ring:
            _, res = read_all(ring, wfd, [0, 4096])
            assert res == [-errno.EBADF] * 2
            _, res = read_all(ring, sfd, [0, 8192])
            assert res == [4096, 0]  # past EOF: a short read of 0 bytes, not an error
    finally:
        os.close(wfd)
        os.close(sfd)


def test_wait_times_out_instead_of_hanging(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # a reader that never gets data: the read never completes
    mem = targets.aligned_buffer(4096)
    try:
        with uring.Ring(2) as ring:
            addr = np.frombuffer(mem, np.uint8).ctypes.data
            ring.push(uring.sqe_words(opcode=uring.OP_READ, sqe_flags=0, fd=np.array([fd]),
                                      off=np.array([0]), addr=np.array([addr]), length=4096,
                                      user_data=np.array([1])))
            ring.submit(wait=1, timeout_ns=50_000_000)
            ud, _ = ring.reap()
            assert len(ud) == 0 and ring.inflight == 1
    finally:
        os.close(fd)


def test_a_completion_held_for_the_submitter_is_flagged_until_it_asks(pattern_fd):
    # what the compiled loop's look before a wait (wait_spin) relies on: a DEFER_TASKRUN
    # ring's completion waits for its submitter's next call, and the SQ ring says so
    mem = targets.aligned_buffer(4096)
    with uring.Ring(2, single_issuer=True) as ring:
        if not ring.flags & uring.SETUP_DEFER_TASKRUN:
            pytest.skip("the kernel has no DEFER_TASKRUN")
        assert ring.flags & uring.SETUP_TASKRUN_FLAG
        addr = np.frombuffer(mem, np.uint8).ctypes.data
        ring.push(uring.sqe_words(opcode=uring.OP_READ, sqe_flags=uring.SQE_ASYNC,
                                  fd=np.array([pattern_fd]), off=np.array([4096]),
                                  addr=np.array([addr]), length=4096, user_data=np.array([7])))
        ring.enter(1, 0, 0)  # submits, and asks for no events
        deadline = time.monotonic() + 30
        while not ring.sq_flags & uring.SQ_TASKRUN:  # an io-wq worker does the read
            assert time.monotonic() < deadline, "the read's completion was never flagged"
            time.sleep(0.001)
        assert len(ring.reap()[0]) == 0  # held: not in the CQ yet
        ring.enter(0, 1, uring.ENTER_GETEVENTS, timeout_ns=10_000_000_000)  # asks for it
        ud, res = ring.reap()
        assert ud.tolist() == [7] and res.tolist() == [4096]
        assert not ring.sq_flags & uring.SQ_TASKRUN
        got = np.frombuffer(mem, np.uint8)[:4096].view("<u8")
        assert np.array_equal(got, pattern.expected_words(1234, 4096, 4096))


def test_sqpoll_wakes_a_sleeping_thread(pattern_fd):
    with uring.Ring(4, sqpoll=True, sq_thread_idle_ms=1) as ring:
        got, res = read_all(ring, pattern_fd, [0])
        threading.Event().wait(0.05)  # the poll thread goes idle and sets NEED_WAKEUP
        assert ring.sq_flags & uring.SQ_NEED_WAKEUP
        got, res = read_all(ring, pattern_fd, [8192, 4096])
        assert res == [4096, 4096] and got[0].view("<u8")[1] == 8192


def test_registered_files_and_buffers(pattern_fd):
    with uring.Ring(4) as ring:
        mem = targets.aligned_buffer(4 * 4096)
        buf = np.frombuffer(mem, np.uint8).reshape(4, 4096)
        ring.register_files([pattern_fd])
        ring.register_buffers([uring.Region(buf.ctypes.data, 4 * 4096)])
        slots = np.arange(4, dtype=np.uint64)
        offs = np.array([0, 4096, 40960, 8192], np.uint64)
        ring.push(uring.sqe_words(opcode=uring.OP_READ_FIXED, sqe_flags=uring.SQE_FIXED_FILE,
                                  fd=np.zeros(4), off=offs,
                                  addr=np.uint64(buf.ctypes.data) + slots * np.uint64(4096),
                                  length=4096, user_data=slots))
        ring.submit(wait=4, timeout_ns=1_000_000_000)
        ud, res = ring.reap()
        assert res.tolist() == [4096] * 4
        assert buf[:, 8:16].copy().view("<u8").ravel().tolist() == offs.tolist()
        with pytest.raises(uring.UringError, match="register files failed: EBUSY"):
            ring.register_files([pattern_fd])  # already registered
    with uring.Ring(4) as ring, pytest.raises(uring.UringError, match="register files failed: EBADF"):
        ring.register_files([10_000])


@pytest.mark.parametrize("err,disabled,kernel,message", [
    (errno.ENOSYS, None, (6, 18), "not available in this kernel"),
    (errno.EPERM, 2, (6, 18), "disabled here \\(kernel.io_uring_disabled = 2\\)"),
    (errno.EINVAL, 0, (6, 1), "NO_MMAP .* needs Linux >= 6.5 \\(this kernel is 6.1\\)"),
])
def test_setup_errors_say_why(monkeypatch, err, disabled, kernel, message):
    monkeypatch.setattr(uring, "io_uring_disabled", lambda: disabled)
    monkeypatch.setattr(uring, "kernel_version", lambda: kernel)
    assert re.search(message, str(uring._setup_error(err, uring.SETUP_NO_MMAP)))


def test_bad_entry_counts():
    with pytest.raises(uring.UringError, match="ring entries must be 1..32768"):
        uring.Ring(0)
    with pytest.raises(uring.UringError, match="ring entries must be 1..32768"):
        uring.Ring(65536)


def test_probe_reports_features():
    facts = uring.probe()
    assert facts["available"] is True and "nodrop" in facts["features"]
    assert {"sqpoll", "no_mmap", "no_sqarray"} <= set(facts)
