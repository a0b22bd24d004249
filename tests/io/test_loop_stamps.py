"""Where the uring loops take their latency stamps, counted, never timed: as fio's ``lat``,
from the moment an I/O is taken into its slot (fio's start_time, before the io_uring_enter
that submits it: its wait for that call counts, as fio's slat) to just after the call that
brought its completion back; and as fio's iodepth_batch_submit, how many I/Os each call of
the compiled loop submits. tests/loops/test_littles_law.py holds the same stamps to Little's law
on a real device.

The compiled loop (io/loops.c) is built here against a stand-in kernel
(tests/data/loops_fake_ring.c) whose clock ticks once per read and which logs each clock
read and each enter; the Python loop's channel (io/uring_channel.py) is run on a real ring
with a ticking clock and its ring's calls logged."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpufio.core.requests import ChannelSpec
from gpufio.io import loops, uring, uring_channel
from gpufio.io.nvme import passthru
from gpufio.io.uring_channel import RingOptions, UringChannel
from gpufio.native import loops as native_loops

from checkout import DATA

FAKE = DATA / "loops_fake_ring.c"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
needs_uring = pytest.mark.skipif(not uring.probe()["available"], reason="io_uring unavailable")


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> ctypes.CDLL:
    """io/loops.c with its clock and system calls those of the stand-in kernel."""
    lib = tmp_path_factory.mktemp("loops") / "loops-fake.so"
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-Dsyscall=gf_fake_syscall",
                    "-Dclock_gettime=gf_fake_clock_gettime", *loops.OPTIONS, "-o", str(lib),
                    *map(str, loops.SOURCES), str(FAKE)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def fake_loop(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, depth: int,
              batch_submit: int, lazy: int, spin_ns: int = 0, **passthrough: Any
              ) -> tuple[loops.NativeLoop, np.ndarray, list]:
    """A compiled URING loop of ``depth`` slots on an in-memory ring the stand-in serves
    (``lazy``: as its fake_ring's); (loop, its event log, what keeps the ring's memory
    alive). With ``passthrough`` (``status``: what every CQE carries, and NativeLoop's
    ``nvme``, ``sqe_flags``, ``cmd_flags``, ``writes``), a passthrough ring's."""
    entries = 1 << (depth - 1).bit_length()
    words = np.zeros(8, np.uint32)  # sq head, sq tail, sq flags, cq head, cq tail
    sq_array = np.zeros(entries, np.uint32)
    big = bool(passthrough)
    sqes = np.zeros((entries, 16 if big else 8), np.uint64)
    sqes[:depth, 3] = 4096                       # each slot's length
    sqes[:depth, 4] = np.arange(depth)           # and user_data: its slot
    cqes = np.zeros((2 * entries, 4 if big else 2), np.uint64)
    log = np.zeros(1 << 16, np.uint8)
    at = [words.ctypes.data + 4 * i for i in range(5)]
    lib.fake_ring(*[ctypes.c_void_p(a) for a in (at[0], at[1], sq_array.ctypes.data, at[2],
                                                  at[4], sqes.ctypes.data, cqes.ctypes.data)],
                  ctypes.c_uint32(entries - 1), ctypes.c_uint32(2 * entries - 1),
                  ctypes.c_void_p(log.ctypes.data), ctypes.c_int64(len(log)),
                  ctypes.c_int64(int(lazy)))
    if big:
        lib.fake_passthrough(ctypes.c_int32(passthrough.pop("status")))
    ring = SimpleNamespace(
        fd=-1, sqpoll=False, sq_entries=entries, cq_entries=2 * entries,
        ring_words={"sq_head": at[0], "sq_tail": at[1], "sq_flags": at[2], "cq_head": at[3],
                    "cq_tail": at[4], "sqes": sqes.ctypes.data, "cqes": cqes.ctypes.data,
                    "sq_array": sq_array.ctypes.data},
        local_heads=lambda: (0, 0))
    stop = np.array([0, 1], np.int64)  # the control words: stop, measuring (the window's)
    bufs = np.zeros(depth * 4096, np.uint8)
    monkeypatch.setattr(native_loops.build, "library", lambda name, *sources: lib)
    loop = loops.NativeLoop(loops.URING, depth=depth, bs=4096, bufs=bufs.ctypes.data,
                            stop=stop.ctypes.data, fds=np.zeros(1, np.int64), seeds=None,
                            magic=0, halt_on_error=True, batch=64, ring=ring,
                            word0=(uring.OP_READ, uring.OP_WRITE), batch_submit=batch_submit,
                            spin_ns=spin_ns, **{"writes": False, **passthrough})
    return loop, log, [words, sq_array, sqes, cqes, stop, bufs]


@needs_cc
@pytest.mark.parametrize("write,status,fixed", [(False, 0, False), (True, 0, True),
                                                (False, 0x80, False)],
                         ids=["read", "write-fixed", "status"])
def test_compiled_passthrough_loop_builds_the_nvme_entry_and_decodes_its_status(
        fake_lib, monkeypatch, write, status, fixed):
    # uring-cmd's compiled loop: each SQE is the one encoder's passthrough entry (the same
    # bytes as io/nvme/passthru.build's), each CQE's NVMe status decoded as passthru.result
    flags = uring.SQE_FIXED_FILE if fixed else 0
    loop, log, keep = fake_loop(
        fake_lib, monkeypatch, depth=1, batch_submit=1, lazy=0, status=status,
        nvme=(np.array([3]), np.array([12])), sqe_flags=flags, writes=write,
        cmd_flags=passthru.URING_CMD_FIXED if fixed else 0)
    used, k = loop.run(np.zeros(1, np.int32), np.array([8192], np.uint64), None, 1 << 62)
    assert used == 1 and k == 1 and loop.inflight == 0
    assert loop.res[0] == passthru.result(np.array([status]), 4096)[0]
    assert (loop.res[0] == 4096) == (status == 0)
    sqes, bufs = keep[2], keep[5]
    want = passthru.build(write=write, fd=0, nsid=3, lba_shift=12, off=np.array([8192]),
                          length=4096, addr=np.array([bufs.ctypes.data], np.uint64),
                          user_data=np.zeros(1, np.uint64), sqe_flags=flags,
                          fixed_buffer=0 if fixed else None)
    assert sqes[0].tobytes() == want[0].tobytes()


def events(lib: ctypes.CDLL, log: np.ndarray) -> str:
    return log[:lib.fake_events()].tobytes().decode()


@needs_cc
@pytest.mark.parametrize("lazy", [False, True], ids=["completes-at-submit", "completes-on-wait"])
def test_compiled_loop_stamps_enclose_the_enter_calls_and_nothing_else(fake_lib, monkeypatch,
                                                                        lazy):
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=1, batch_submit=1,
                                 lazy=int(lazy))
    used, k = loop.run(np.zeros(5, np.int32), np.arange(5, dtype=np.uint64) * 4096, None,
                       1 << 62)
    assert used == 5 and k + loop.inflight == 5
    assert (loop.res[:k] == 4096).all()
    ev = events(fake_lib, log)
    # at depth 1, as fio: one call submits, and one waits only if that brought nothing back
    per_io = "CSCWC" if lazy else "CSC"
    assert ev.startswith(per_io * k), ev
    # each latency is the ticks from the stamp before the submitting call to the stamp
    # after the call that brought it back (the clock reads between are the loop's own
    # stamps of those calls): the enters, and none of the loop's bookkeeping
    assert loop.lat[:k].tolist() == [per_io.count("C") - 1] * k


@needs_cc
@pytest.mark.parametrize("batch_submit,calls", [(4, 2), (0, 2)])
def test_compiled_loop_submits_batch_submit_ios_per_call(fake_lib, monkeypatch,
                                                         batch_submit, calls):
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=4, batch_submit=batch_submit,
                                 lazy=0)
    used, k = loop.run(np.zeros(8, np.int32), np.arange(8, dtype=np.uint64) * 4096, None,
                       1 << 62)
    assert used == 8 and k == 8
    ev = events(fake_lib, log)
    assert ev.count("S") == calls and "W" not in ev, ev
    # every free slot's I/O is taken, stamped and submitted together: one call between the
    # two stamps of every I/O
    assert (loop.lat[:k] == 1).all()


@needs_cc
def test_ios_waiting_for_their_submit_call_are_in_flight_by_their_stamps(fake_lib,
                                                                        monkeypatch):
    # batch_submit 1 at depth 4, on a device that completes each I/O in its submitting call:
    # the four slots take their I/Os at once (tick 1), and each waits its turn for a call
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=4, batch_submit=1, lazy=0)
    used, k = loop.run(np.zeros(8, np.int32), np.arange(8, dtype=np.uint64) * 4096, None,
                       1 << 62)
    assert used == 8 and k == 8
    ev = events(fake_lib, log)
    assert ev.count("S") == 8 and "W" not in ev, ev
    # as fio, the CQ is reaped once all four are in: rounds of a stamp and a call (C S C)
    # until then, the reap's stamp the last call's (tick 8); the last four are stamped at
    # tick 9 and go in one call each (S C), then one reap (tick 13). Each latency runs from
    # its stamp, its wait for a call included, as fio's lat runs from get_io_u; had the
    # waits gone unstamped, every latency would be 1 tick
    assert ev == "CSC" * 4 + "C" + "SC" * 4, ev
    assert loop.lat[:k].tolist() == [7] * 4 + [4] * 4
    # the waits alone, fio's slat: from each stamp to the return of its submitting call
    assert loop.slat_mean_ns == (2 + 4 + 6 + 8 - 4 * 1 + 10 + 11 + 12 + 13 - 4 * 9) / 8


@needs_cc
def test_a_wait_that_sees_a_completion_pending_does_not_look_again(fake_lib, monkeypatch):
    # as a DEFER_TASKRUN ring: the completion is the kernel's from the submitting call on,
    # flagged in the SQ ring, and posted by the waiting call
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=1, batch_submit=1, lazy=2,
                                 spin_ns=1000)
    used, k = loop.run(np.zeros(5, np.int32), np.arange(5, dtype=np.uint64) * 4096, None,
                       1 << 62)
    assert used == 5 and k + loop.inflight == 5 and (loop.res[:k] == 4096).all()
    # stamp, submit, reap; the look's one clock read (its end), which finds the flag at
    # once; the wait, which does not sleep for it; the stamp after it
    assert events(fake_lib, log).startswith("CSCCWC" * k)
    assert loop._loop.spin_misses == 0


@needs_cc
def test_looks_that_find_nothing_come_ever_more_rarely(fake_lib, monkeypatch):
    # a device slower than the look: every look runs out (its clock reads: its end, then
    # one a turn until that end); after three misses in a row, each further one doubles
    # the waits that sleep at once
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=1, batch_submit=1, lazy=1,
                                 spin_ns=2)
    for first in range(0, 200, 50):
        used, k = loop.run(np.zeros(50, np.int32),
                           np.arange(first, first + 50, dtype=np.uint64) * 4096, None, 1 << 62)
        assert used == 50
    # before each wait: the submit, then its reap's clock read (and, where a call began
    # with the I/O in flight, that call's stamp), then a look's three
    before_waits = events(fake_lib, log).split("W")[:200]
    looked = [i for i, ev in enumerate(before_waits) if len(ev) - ev.rindex("S") - 1 >= 4]
    assert looked == [0, 1, 2, 3, 5, 9, 17, 33, 65, 129, 193]  # then one in 64, no fewer
    assert loop._loop.spin_misses == 9


@needs_uring
@pytest.mark.skipif(not loops.available(), reason="no compiled loops here")
@pytest.mark.parametrize("ring,cpus,looks", [({}, {0, 1}, True), ({"sqpoll": True}, {0, 1}, False),
                                             ({}, {1}, False)],
                         ids=["plain", "sqpoll", "plain-on-one-cpu"])
def test_the_channel_hands_the_look_to_rings_that_can_use_it(tmp_path, monkeypatch, ring,
                                                              looks, cpus):
    # an SQPOLL ring has its kernel thread spinning already (IOPOLL's waits poll the device:
    # those rings cannot be made here), and a thread allowed one CPU would spin on the CPU
    # its io-wq worker needs, so only a plain ring's loop on more than one CPU looks first
    if ring and not uring.probe().get("sqpoll"):
        pytest.skip("SQPOLL is not available here")
    monkeypatch.setattr(uring_channel.os, "sched_getaffinity", lambda pid: cpus)
    path = tmp_path / "f.dat"
    path.write_bytes(bytes(4096 * 4))
    buf = np.zeros((4, 4096), np.uint8)
    stop = np.zeros(2, np.int64)
    with open(path, "rb") as f:
        ch = UringChannel([SimpleNamespace(path=str(path), fd=f.fileno())],
                          ChannelSpec(4, region=(buf.ctypes.data, buf.nbytes)),
                          options=RingOptions(spin_ns=3000, **ring))
        try:
            native = ch.native(SimpleNamespace(reads=True, writes=False),
                               SimpleNamespace(stop_address=stop.ctypes.data,
                                               continue_on_error=False), 64, 0)
            assert native.spin_ns == (3000 if looks else 0)
            # the result says what ran: the worker's engine facts carry the channel's notes
            assert ch.notes()["wait_spin_ns"] == [native.spin_ns]
        finally:
            ch.close()


@needs_uring
def test_python_channel_times_each_request_around_its_enter_calls(tmp_path, monkeypatch):
    path = tmp_path / "f.dat"
    path.write_bytes(bytes(range(256)) * 64)
    buf = np.zeros((4, 4096), np.uint8)
    with open(path, "rb") as f:
        ch = UringChannel([SimpleNamespace(path=str(path), fd=f.fileno())],
                          ChannelSpec(4, region=(buf.ctypes.data, buf.nbytes)),
                          options=RingOptions(batch_submit=1))
        log: list[str] = []
        ticks = iter(range(1, 1 << 20))

        def clock() -> int:
            log.append("C")
            return next(ticks)
        monkeypatch.setattr(uring_channel, "time", SimpleNamespace(perf_counter_ns=clock))
        enter = ch.ring.submit

        def logged_enter(*a, **kw) -> None:
            log.append("E")
            enter(*a, **kw)
        monkeypatch.setattr(ch.ring, "submit", logged_enter)
        try:
            slots = np.arange(3)
            assert ch.submit(np.zeros(3, np.int64), slots * 4096, np.full(3, 4096),
                             np.uint64(buf.ctypes.data) + slots.astype(np.uint64) * 4096,
                             False, slots) == 3
            submitted = "".join(log).count("E")
            got: dict[int, int] = {}
            while len(got) < 3:
                done, res = ch.reap(1_000_000_000)
                assert (res == 4096).all()
                got.update(zip(done.tolist(), ch.times().tolist()))
        finally:
            ch.close()
    text = "".join(log)
    # submit stamps the requests it takes (tick 1); every enter is bracketed by two clock
    # reads, and nothing else reads the clock
    assert text.startswith("C") and text[1:].replace("CEC", "") == "", text
    # the requests went in together with the first enter (the submit batch is the compiled
    # loop's: a call per request would cost Python more than it saves), at tick 2; each
    # one's time runs from its stamp at tick 1 to the second stamp (an odd tick) of the
    # enter that brought it back
    assert submitted == 0
    for i, took in got.items():
        assert took > 0 and (1 + took) % 2 == 1, (i, took, text)
    assert ch.notes()["slat_mean_ns"] == [1]  # each waited from tick 1 to the enter's 2


@needs_cc
@pytest.mark.parametrize("lazy", [0, 1], ids=["completes-at-submit", "completes-on-wait"])
def test_a_call_whose_time_is_up_hands_back_with_every_slot_busy(fake_lib, monkeypatch, lazy):
    # the slots its last reap freed take their next I/Os and go in before it returns: none
    # sits free while the caller records (IOPS x mean latency would fall short of depth)
    loop, log, _keep = fake_loop(fake_lib, monkeypatch, depth=4, batch_submit=0, lazy=lazy)
    used, k = loop.run(np.zeros(64, np.int32), np.arange(64, dtype=np.uint64) * 4096, None, 6)
    assert 4 < used < 64 and loop.inflight == 4 and used == k + 4
    # its last call submitted and did not reap: the stamp after it, no reap's
    assert events(fake_lib, log).endswith("CSC"), events(fake_lib, log)
