"""A stalled ring's report says which part held its I/Os: gpufio (SQEs published and never
consumed by the kernel, or completions never reaped), the kernel (consumed, none completed,
no disk has them in flight) or the drive (its disk's in-flight counter is not zero). The
verdicts from stubbed states, then from real rings: SQEs never submitted, and a read the
kernel holds (a pipe with nothing to read)."""

import os
from types import SimpleNamespace

import numpy as np
import pytest

from gpufio.core.requests import ChannelSpec
from gpufio.io.watchdog import Stalled
from gpufio.loops.steps import move_all
from gpufio.io import uring, watchdog
from gpufio.io.uring_channel import UringChannel
from gpufio.io.watchdog import ring_verdict


def state(**kw):
    base = {"sq_head": 256, "sq_tail": 256, "cq_head": 0, "cq_tail": 0, "sq_flags": 0,
            "sq_dropped": 0, "cq_overflow": 0, "inflight": 256}
    return {**base, **kw}


def test_sqes_the_kernel_never_consumed_are_gpufios():
    verdict = ring_verdict(state(sq_head=200), {"vda": (0, 0)})
    assert verdict.startswith("held by gpufio: 56 of the 256 SQEs in flight were published but "
                              "never consumed by the kernel (sq_tail 256, sq_head 200)")
    asleep = ring_verdict(state(sq_head=0xFFFFFFF0, sq_tail=16, sq_flags=1), None)
    assert "32 of the 256" in asleep and asleep.endswith("its SQ thread sleeps (NEED_WAKEUP)")


def test_completions_never_reaped_are_gpufios():
    assert ring_verdict(state(cq_tail=3), {"vda": (0, 0)}).startswith(
        "held by gpufio: 3 completions were posted but not reaped")


def test_consumed_sqes_with_requests_in_flight_at_the_disk_are_the_drives():
    verdict = ring_verdict(state(), {"vda": (256, 0), "vdb": (0, 0)})
    assert verdict.startswith("held by the drive: the kernel consumed all 256 SQEs")
    assert "vda 256 reads and 0 writes" in verdict and "vdb" not in verdict


def test_consumed_sqes_with_no_request_at_the_disk_are_the_kernels():
    assert ring_verdict(state(), {"vda": (0, 0)}).startswith(
        "held by the kernel: it consumed all 256 SQEs (sq_head = sq_tail) and completed none, "
        "and vda has none in flight")
    assert "no disk holds the targets" in ring_verdict(state(), None)
    assert ring_verdict(state(inflight=0), None).startswith("nothing is in flight")


needs_uring = pytest.mark.skipif(not uring.probe()["available"], reason="io_uring unavailable")


def _read_sqe(fd: int, buf: np.ndarray) -> np.ndarray:
    return uring.sqe_words(opcode=uring.OP_READ, sqe_flags=0, fd=np.array([fd]),
                           off=np.zeros(1, np.uint64), addr=np.array([buf.ctypes.data], np.uint64),
                           length=len(buf), user_data=np.zeros(1, np.uint64))


@needs_uring
def test_a_real_ring_whose_sqes_were_never_submitted_blames_gpufio(pattern_file):
    ring = uring.Ring(8)
    fd = os.open(pattern_file, os.O_RDONLY)
    buf = np.zeros(4096, np.uint8)
    try:
        ring.push(_read_sqe(fd, buf))  # published, never handed over by io_uring_enter
        report = watchdog.ring_report(ring, [fd])
        assert report.startswith("held by gpufio: 1 of the 1 SQEs in flight were published but "
                                 "never consumed by the kernel"), report
        assert "'SqTail': 1" in report and "'SqHead': 0" in report  # the kernel's own view
    finally:
        ring.close()
        os.close(fd)


@needs_uring
def test_a_real_read_the_kernel_holds_blames_the_kernel_and_a_busy_disk_the_drive(
        monkeypatch):
    r, w = os.pipe()
    buf = np.zeros(64, np.uint8)
    ch = UringChannel([SimpleNamespace(path="pipe", fd=r)], ChannelSpec(8))
    ring = ch.ring
    try:
        with pytest.raises(Stalled) as stuck:  # the pipe never has data: no race
            move_all(ch, np.zeros(1), np.zeros(1), np.array([64]),
                     np.array([buf.ctypes.data], np.uint64), False, stall_ns=50_000_000)
        assert str(stuck.value).startswith(
            "1 I/Os in flight and none completed for 0.05 s: held by the kernel: it consumed all 1 SQEs (sq_head = "
            "sq_tail) and completed none, and no disk holds the targets to ask"), stuck.value
        monkeypatch.setattr(watchdog, "disk_inflight", lambda fd: ("nvme9n1", 1, 0))
        report = watchdog.ring_report(ring, [r])
        assert report.startswith("held by the drive: the kernel consumed all 1 SQEs")
        assert "nvme9n1 1 reads and 0 writes" in report
    finally:
        os.write(w, b"x" * 64)  # let the read complete before the ring goes
        ch.close()
        os.close(r)
        os.close(w)


def test_a_targets_disk_and_its_in_flight_counter_are_found(pattern_file):
    from gpufio.facts.device import disk_inflight

    fd = os.open(pattern_file, os.O_RDONLY)
    try:
        found = disk_inflight(fd)
    finally:
        os.close(fd)
    if found is None:
        pytest.skip("the temporary directory is on no disk here (tmpfs)")
    disk, reads, writes = found
    assert os.path.exists(f"/sys/block/{disk}/inflight") and reads >= 0 and writes >= 0
