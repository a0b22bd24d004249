"""The host side of gpu-uring, without a GPU: flow-control sizing, the default ring count,
the watchdog and its diagnostic, the engine's profile checks, and a ring in caller memory
driven word by word exactly as the GPU agent drives it (SQEs and tail written to memory,
completions read from memory, no io_uring_enter but wake-ups)."""

import ctypes
import time

import numpy as np
import pytest

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.core.targets import aligned_buffer
from gpufio.io import uring
from gpufio.io.gio.backends.rings import RingState, default_rings, ring_sizes, stall_report
from gpufio.io.uring import busy_shares
from gpufio.io.watchdog import Watchdog
from gpufio.profile import from_dict


@pytest.mark.parametrize("iodepth,entries,expected", [
    (4, None, (4, 8)), (3, None, (4, 8)), (2, 2, (2, 4)), (5, 16, (16, 32)), (1, 1, (1, 2)),
])
def test_ring_sizes_keep_every_inflight_read_in_the_cq(iodepth, entries, expected):
    sq, cq = ring_sizes(iodepth, entries)
    assert (sq, cq) == expected
    assert iodepth <= sq <= cq


@pytest.mark.parametrize("iodepth,entries,message", [
    (8, 4, "key 'iodepth': 8 reads in flight do not fit a ring of ring_entries = 4"),
    (1, 40000, "key 'ring_entries': 40000 is more than io_uring's 32768"),
])
def test_ring_sizes_refuse_what_could_overflow(iodepth, entries, message):
    with pytest.raises(BadInput, match=message):
        ring_sizes(iodepth, entries)


@pytest.mark.parametrize("ntargets,cpus,rings", [(1, 16, 8), (1, 2, 1), (3, 4, 3), (1, 64, 8),
                                                 (1, 1, 1)])
def test_default_rings_follow_cores_and_targets(ntargets, cpus, rings):
    assert default_rings(ntargets, cpus) == rings


def test_busy_shares_are_work_over_cpu_time_per_sqpoll_thread():
    before = {7: (1_000, 100), 9: (500, 500)}
    after = {7: (3_000, 600), 9: (1_500, 1_520), 11: (200, 50), 13: (0, 0)}
    # thread 7: 500 of 2000 us working; 9: the two clocks disagree by a little, capped at 1;
    # 11 started after the first reading; 13 has used no CPU yet and says nothing
    assert busy_shares(before, after) == [0.25, 1.0, 0.25]


def test_watchdog_fires_only_after_completions_stop_for_the_timeout():
    dog = Watchdog(timeout_ns=1_000, now_ns=0)
    counts = [0, 5, 9, 9, 9, 9, 12, 12, 12]
    times = [0, 400, 800, 1200, 1700, 1900, 2000, 2600, 3001]
    fired = [dog.update(c, t) for c, t in zip(counts, times)]
    assert fired == [False, False, False, False, False, True, False, False, True]


def test_stall_report_names_heads_tails_flags_and_slots():
    rings = [RingState(10, 12, 8, 10, uring.SQ_NEED_WAKEUP), RingState(5, 5, 5, 5, 0)]
    text = stall_report(10_000_000_000, rings, {"free": 0, "submitted": 2, "ready": 1})
    assert text.startswith("no read completed for 10 s; kernels stopped.")
    assert "ring 0: sq head 10 tail 12, cq head 8 tail 10, in flight 2, flags NEED_WAKEUP" in text
    assert "ring 1: sq head 5 tail 5, cq head 5 tail 5, in flight 0, flags 0" in text
    assert text.endswith("request slots: submitted 2, ready 1")


@pytest.mark.parametrize("opts,message", [
    ({"random_distribution": "zipf:1.2"}, "random_distribution 'zipf' is not supported"),
    ({"iodepth": 16, "ring_entries": 8}, "do not fit a ring of ring_entries = 8"),
    ({"land": "disk"}, "key 'land': 'disk' is not one of gpu, host"),
    ({"rings": 2, "sq_threads": 3}, r"sq_threads \(3\) exceeds rings \(2\)"),
    ({"iodepth": 40000}, r"key 'iodepth': 40000 is above the largest io_uring ring \(32768"),
])
def test_profile_checks(opts, message):
    with pytest.raises(BadInput, match=message):
        from_dict({"global": {"engine": "gpu-uring", "size": "1m", **opts}}, "t.toml", {})


def _u32(addr: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(addr)


@pytest.mark.skipif(not (uring.probe().get("no_mmap") and uring.probe().get("no_sqarray")),
                    reason="needs IORING_SETUP_NO_MMAP and NO_SQARRAY (Linux 6.6+)")
@pytest.mark.parametrize("registered,attached", [(False, False), (True, False), (False, True)])
def test_a_producer_ring_driven_through_memory_words_only(pattern_fd, registered, attached):
    """Tiny SQPOLL ring in caller memory, 2000 reads, wrap-around, the agent's arithmetic;
    registered: the SQEs UringQueue writes for registered rings (READ_FIXED from buffer 0,
    the file by its index); attached: the ring shares another ring's SQPOLL thread
    (sq_threads below rings), which then runs its reads and reports its work."""
    sq_n, cq_n = ring_sizes(2, 2)
    first = uring.Ring(sq_n, cq_entries=cq_n, sqpoll=True, sq_thread_idle_ms=1,
                       user_memory=True, no_sqarray=True) if attached else None
    ring = uring.Ring(sq_n, cq_entries=cq_n, sqpoll=True, sq_thread_idle_ms=1, user_memory=True,
                      no_sqarray=True, attach_to=first.fd if first else None)
    w = ring.ring_words
    sqes = np.ctypeslib.as_array((ctypes.c_uint64 * (8 * sq_n)).from_address(w["sqes"]))
    cqes = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * cq_n)).from_address(w["cqes"]))
    mem = aligned_buffer(2 * 4096)  # O_DIRECT needs aligned buffers
    buf = np.frombuffer(mem, np.uint8).reshape(2, 4096)
    buf_addr = buf.ctypes.data
    word0 = uring.OP_READ | pattern_fd << 32  # opcode, flags, fd
    if registered:
        ring.register_files([pattern_fd])
        ring.register_buffers([uring.Region(buf_addr, 2 * 4096)])
        word0 = uring.OP_READ_FIXED | uring.SQE_FIXED_FILE << 8  # file index 0
    offsets = [(i * 37 % 1024) * 4096 for i in range(2000)]
    tail = head = cqh = 0
    inflight = 0
    done = {}
    deadline = time.monotonic() + 30
    nxt = 0
    free = [0, 1]
    while len(done) < len(offsets):
        assert time.monotonic() < deadline, ring.state()
        head = _u32(w["sq_head"]).value
        while free and nxt < len(offsets) and tail - head < sq_n and inflight < cq_n:
            slot = free.pop()
            row = (tail & (sq_n - 1)) * 8
            sqes[row:row + 8] = [word0, offsets[nxt],
                                 buf_addr + slot * 4096, 4096, slot | nxt << 8, 0, 0, 0]
            tail += 1
            inflight += 1
            nxt += 1
            _u32(w["sq_tail"]).value = tail
        if _u32(w["sq_flags"]).value & uring.SQ_NEED_WAKEUP:
            ring.enter(0, 0, uring.ENTER_SQ_WAKEUP)
        t = _u32(w["cq_tail"]).value
        while cqh != t:
            ud, res = int(cqes[(cqh & (cq_n - 1)) * 2]), int(cqes[(cqh & (cq_n - 1)) * 2 + 1])
            slot, i = ud & 0xFF, ud >> 8
            assert (res & 0xFFFFFFFF) == 4096, res
            assert np.array_equal(buf[slot].view("<u8"),
                                  pattern.expected_words(1234, offsets[i], 4096)), i
            done[i] = True
            free.append(slot)
            cqh += 1
            inflight -= 1
        _u32(w["cq_head"]).value = cqh
    assert not _u32(w["sq_flags"]).value & uring.SQ_CQ_OVERFLOW
    times = ring.sq_thread_times()
    if times is not None:  # Linux 6.13+ reports SQPOLL work time
        # the thread exists and its work is part of its CPU time; how much of 2000 reads'
        # time the kernel's accounting catches depends on its clock, so no lower bound
        assert times[0] > 0 and 0 <= times[2] <= times[1]
        if first:
            assert first.sq_thread_times()[0] == times[0]
    ring.close()
    if first:
        first.close()
    del buf
    mem.close()


@pytest.mark.skipif(not (uring.probe().get("no_mmap") and uring.probe().get("no_sqarray")),
                    reason="needs IORING_SETUP_NO_MMAP and NO_SQARRAY (Linux 6.6+)")
def test_watchdog_catches_a_producer_ring_whose_sqpoll_thread_sleeps(pattern_fd):
    """A real stall: the SQ thread went to sleep and nobody wakes it, so a posted read never
    completes; the watchdog fires and the report shows the ring as it is."""
    ring = uring.Ring(2, cq_entries=4, sqpoll=True, sq_thread_idle_ms=1, user_memory=True,
                      no_sqarray=True)
    mem = aligned_buffer(4096)
    try:
        w = ring.ring_words
        deadline = time.monotonic() + 5
        while not _u32(w["sq_flags"]).value & uring.SQ_NEED_WAKEUP:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sqe = np.ctypeslib.as_array((ctypes.c_uint64 * 8).from_address(w["sqes"]))
        sqe[:] = [uring.OP_READ | pattern_fd << 32, 0,
                  np.frombuffer(mem, np.uint8).ctypes.data, 4096, 7, 0, 0, 0]
        _u32(w["sq_tail"]).value = 1  # posted, as an agent warp would, and never woken
        dog = Watchdog(timeout_ns=300_000_000, now_ns=time.monotonic_ns())
        fired_after = None
        start = time.monotonic()
        while fired_after is None and time.monotonic() - start < 5:
            if dog.update(_u32(w["cq_tail"]).value, time.monotonic_ns()):
                fired_after = time.monotonic() - start
            time.sleep(0.01)
        assert fired_after is not None and 0.3 <= fired_after < 1.0
        s = ring.state()
        report = stall_report(300_000_000, [RingState(s["sq_head"], s["sq_tail"], s["cq_head"],
                                                      s["cq_tail"], s["sq_flags"])], {"submitted": 1})
        assert "ring 0: sq head 0 tail 1, cq head 0 tail 0, in flight 1, flags NEED_WAKEUP" in report
    finally:
        ring.close()
        mem.close()


def test_gpu_uring_is_unavailable_on_kernels_without_producer_rings(monkeypatch):
    from gpufio.engines import all_engines

    facts = {"available": True, "sqpoll": True, "no_mmap": False, "no_sqarray": False,
             "no_mmap_reason": "IORING_SETUP_NO_MMAP needs Linux 6.5 or later (this is 6.1)"}
    monkeypatch.setattr(uring, "probe", lambda: facts)
    assert all_engines()["gpu-uring"].unavailable() == facts["no_mmap_reason"]


class _Stream:
    def __init__(self, polls_left: int) -> None:
        self.polls_left = polls_left

    @property
    def done(self) -> bool:
        self.polls_left -= 1
        return self.polls_left < 0


class _Rings:
    def __init__(self, step: int) -> None:
        self.count, self.step, self.woken = 0, step, 0

    def wake(self, check: bool = True) -> int:
        self.woken += 1
        return 0

    def completed(self) -> int:
        self.count += self.step
        return self.count


def _queue(rings, agent_polls):
    from gpufio.io.gio.backends.uring import UringQueue

    q = object.__new__(UringQueue)  # the waiting logic only: no GPU behind it
    q.rings, q.agent_stream, q.kernels_done, q.stalled = rings, _Stream(agent_polls), False, None

    def stall(timeout_ns, streams):
        q.stalled = timeout_ns
        raise RuntimeError("stalled")

    q.stall = stall
    return q


def test_queue_wait_lets_a_long_but_moving_batch_finish():
    q = _queue(_Rings(step=1), agent_polls=400)  # ~400 ms of polls, completions keep coming
    q.wait((_Stream(400),), stall_ns=50_000_000)
    assert q.kernels_done and q.stalled is None and q.rings.woken >= 400


def test_queue_wait_stops_a_queue_whose_completions_stopped():
    q = _queue(_Rings(step=0), agent_polls=10_000)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stalled"):
        q.wait((), stall_ns=100_000_000)
    assert q.stalled == 100_000_000 and 0.1 <= time.monotonic() - start < 2
    assert not q.kernels_done


@pytest.mark.parametrize("given,registered", [
    ({}, True),                                    # sqe_async defaults off
    ({"sqe_async": True}, False),
    ({"sqe_async": False, "registered": False}, False),
    ({"registered": True}, True),
])
def test_rings_register_files_and_slots_by_default_only_when_inline(given, registered):
    job = from_dict({"global": {"engine": "gpu-uring", "targets": ["x"], **given}},
                    "t.toml", {}).jobs[0]
    assert job.engine_settings.registered is registered


@pytest.mark.parametrize("given,ram,threads", [
    ({"rings": 4}, True, 4), ({"rings": 4}, False, 1), ({"rings": 4, "sq_threads": 1}, True, 1),
    ({"rings": 4, "sq_threads": 2}, False, 2), ({"sq_threads": 3}, True, 1)])
def test_sq_threads_default_to_one_per_ring_and_never_exceed_the_rings(given, ram, threads,
                                                                        monkeypatch):
    """One per ring on RAM-backed targets, one per drive otherwise, never above the rings."""
    from gpufio.engines import gpu_uring
    from gpufio.io.gio.backends import uring as backend

    monkeypatch.setattr(gpu_uring.os, "cpu_count", lambda: 2)  # default rings: 1
    monkeypatch.setattr(backend, "ram_backing", lambda path: "tmpfs" if ram else None)
    job = from_dict({"global": {"engine": "gpu-uring", "targets": ["x"], **given}},
                    "t.toml", {}).jobs[0]
    assert job.engine_settings.sq_threads == threads
