"""rate_iops and rate_process: the schedule by counts on a fake clock, the poisson gaps by
their distribution, real runs whose I/O counts stay at or under the cap and, in the compiled
loops, reach it; a compiled loop reaps while no I/O is due."""

import contextlib
import ctypes
import json
import os
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app
from gpufio.core.rate import Pacer, pacer_for, unpaced
from gpufio.fio.jobfile import parse
from gpufio.io import loops, uring

cli = CliRunner()
SECOND = 1_000_000_000


def issued_by(pacer: Pacer, clock, times_ns: list[int], batch: int = 64) -> list[int]:
    """Take every due I/O at each of ``times_ns``; the running count issued."""
    counts = []
    for t in times_ns:
        clock.now = t
        while True:
            k, _ = pacer.due(batch)
            if not k:
                break
            pacer.take(k)
        counts.append(pacer.issued)
    return counts


def test_linear_schedule_counts_exactly(clock):
    pacer = Pacer(1000, "linear", clock=clock)
    times = [0, 500_000, 1_000_000, 250 * 1_000_000 + 1, SECOND]
    # I/O k is due at k ms: by t, floor(t / 1 ms) + 1 have gone
    assert issued_by(pacer, clock, times) == [1, 1, 2, 251, 1001]
    clock.now = SECOND + 400_000
    assert pacer.due(8) == (0, 600_001)


def test_a_worker_behind_catches_up_but_never_passes_the_schedule(clock):
    pacer = Pacer(10_000, "linear", clock=clock)
    assert issued_by(pacer, clock, [0, 3 * SECOND // 10], batch=8) == [1, 3001]


def test_poisson_gaps_are_exponential():
    rate, n = 5000.0, 20_000
    gaps = Pacer(rate, "poisson", seed=(0x89, 0)).gaps(n)
    mean = 1e9 / rate
    assert abs(gaps.mean() - mean) < 4 * mean / np.sqrt(n)  # the mean of n exponentials
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # an exponential's CV is 1
    # Kolmogorov-Smirnov against the exponential CDF, at the 1% level
    x = np.sort(gaps)
    cdf = 1 - np.exp(-x / mean)
    ks = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert ks < 1.63 / np.sqrt(n)
    # successive gaps are independent (no correlation between neighbours)
    assert abs(np.corrcoef(gaps[:-1], gaps[1:])[0, 1]) < 4 / np.sqrt(n)


def test_poisson_counts_are_the_rate_and_seeded(clock):
    pacer = Pacer(2000, "poisson", seed=(1, 0), clock=clock)
    count = issued_by(pacer, clock, [0, 10 * SECOND])[-1]  # the schedule starts at 0
    expected = 2000 * 10
    assert abs(count - expected) < 5 * np.sqrt(expected)  # a Poisson count's spread
    again, other = (Pacer(2000, "poisson", seed=s) for s in ((1, 0), (1, 1)))
    assert np.array_equal(again.gaps(100), Pacer(2000, "poisson", seed=(1, 0)).gaps(100))
    assert not np.array_equal(Pacer(2000, "poisson", seed=(1, 0)).gaps(100), other.gaps(100))


def test_a_schedule_is_the_due_times_due_hands_out(clock):
    clock.now = 5 * SECOND
    linear = Pacer(1000, "linear", clock=clock)
    assert linear.schedule(3).tolist() == [5 * SECOND, 5 * SECOND + 1_000_000,
                                           5 * SECOND + 2_000_000]
    clock.now += 3_000_000  # the schedule goes on where it left off
    assert linear.due(8) == (1, 0) and linear.issued == 3
    a, b = (Pacer(2000, "poisson", seed=(3, 0), clock=clock) for _ in range(2))
    at = a.schedule(5000) - clock.now  # across two draws of due times
    b.due(5000)
    assert np.array_equal(at, np.ceil(b._due[:5000]).astype(np.int64))
    assert np.all(np.diff(at) >= 0) and at[0] == 0


def test_wait_ends_when_told_to_stop(clock):
    pacer = Pacer(1, "linear", clock=clock)
    assert pacer.wait(4, lambda: False) == 1
    assert pacer.wait(4, lambda: True) == 0 and pacer.issued == 1
    assert pacer.wait(0, lambda: False) == 0


def test_options_and_the_passes_beside_a_job():
    assert pacer_for({"rate_iops": 0}, 1, 0) is None
    p = pacer_for({"rate_iops": 100, "rate_process": "poisson"}, 1, 0)
    assert p.process == "poisson" and p.gap_ns == pytest.approx(1e7)
    assert unpaced({"rate_iops": 100, "rate_process": "poisson"}) == {"rate_process": "poisson"}


def test_fio_job_files_map_the_rate_keys():
    data, _ = parse("[j]\nrate_iops=500\nrate_process=poisson\nsize=1m\n", "x.fio")
    (job,) = profile.from_dict(data, "x.fio", {}).jobs
    assert job.workload_options["rate_iops"] == 500
    assert job.workload_options["rate_process"] == "poisson"


def capped_job(write_profile, tmp_path, engine: str, rate: int, process: str, runtime: str,
               numjobs: int, iodepth: int) -> dict:
    """One time-based capped job on a 1 MiB file through the CLI: its result's job."""
    path = write_profile(f'[global]\nengine = "{engine}"\nsize = "1m"\nruntime = "{runtime}"\n'
                         f'time_based = true\nnumjobs = {numjobs}\niodepth = {iodepth}\n'
                         f'rate_iops = {rate}\nrate_process = "{process}"\n')
    out = tmp_path / "r.json"
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    (job,) = json.loads(out.read_text())["jobs"]
    return job


@pytest.mark.parametrize("engine,process,compiled", [
    ("null", "linear", True), ("uring", "linear", True), ("uring", "poisson", True),
    ("psync", "poisson", True), ("uring", "linear", False), ("psync", "poisson", False)])
def test_a_capped_run_stays_at_or_under_the_cap(write_profile, tmp_path, monkeypatch, engine,
                                                process, compiled):
    if compiled and not loops.available():
        pytest.skip("no compiled loops (no C compiler)")
    monkeypatch.setattr(loops, "available", lambda: compiled)  # workers fork after it
    rate, numjobs, iodepth = 400, 2, 4
    job = capped_job(write_profile, tmp_path, engine, rate, process, "500ms", numjobs, iodepth)
    seconds = job["read"]["runtime"] / 1e3
    allowed = rate * seconds + 1  # each worker's schedule: one at once, then one per 1/rate
    if process == "poisson":
        allowed += 6 * np.sqrt(rate * seconds)  # a Poisson count, six sigmas above its mean
    # each worker may have a batch handed out as the clock stops
    assert 0 < job["read"]["total_ios"] <= numjobs * (allowed + iodepth)
    assert job["engine_facts"].get("loop", "python") == ("compiled" if compiled else "python")


needs_cc = pytest.mark.skipif(not loops.available(), reason="no compiled loops (no C compiler)")


@needs_cc
@pytest.mark.parametrize("engine,process", [("null", "linear"), ("uring", "linear"),
                                            ("null", "poisson"), ("uring", "poisson"),
                                            ("psync", "linear")])
def test_a_compiled_loop_issues_at_the_cap(write_profile, tmp_path, engine, process):
    # a cap far below what the loop can do, even on a starved core (two QEMU guests and a
    # compiler beside it left it 476 reads in 2 s): the count it reached, not how fast
    job = capped_job(write_profile, tmp_path, engine, 250, process, "2s", 1, 8)
    assert job["engine_facts"]["loop"] == "compiled"
    assert 375 <= job["read"]["total_ios"] <= 550


def _uring_loop(fd: int, stop: ctypes.Array, depth: int, bs: int) -> tuple:
    """A compiled io_uring loop reading ``fd`` into ``depth`` slots, as the uring engine sets
    one up, with no stop poll (so every wait has a limit); (loop, ring, buffer)."""
    ring = uring.Ring(depth)
    buf = np.zeros(depth * bs, np.uint8)
    slots = np.arange(depth, dtype=np.uint64)
    ring.sqes[:depth] = uring.sqe_words(
        opcode=uring.OP_READ, sqe_flags=0, fd=np.full(depth, fd), off=np.zeros(depth, np.uint64),
        addr=np.uint64(buf.ctypes.data) + slots * np.uint64(bs), length=bs, user_data=slots)
    loop = loops.NativeLoop(loops.URING, depth=depth, bs=bs, bufs=buf.ctypes.data,
                            stop=ctypes.addressof(stop), fds=np.array([fd]), seeds=None,
                            magic=0, halt_on_error=True, batch=8, writes=False, ring=ring,
                            word0=(uring.OP_READ, uring.OP_WRITE), wait_ns=200_000_000)
    return loop, ring, buf


@contextlib.contextmanager
def _one_due(pattern_file: str, kind: str, words: ctypes.Array):
    """A compiled loop of ``kind`` reading ``pattern_file`` with ``words`` as its control
    words, and a batch of 3 I/Os of which only the first is due (the others in an hour):
    yields (loop, (tgt, offs, due))."""
    if kind == loops.URING and not uring.probe()["available"]:
        pytest.skip("io_uring unavailable")
    bs = 4096
    fd = os.open(pattern_file, os.O_RDONLY)
    ring = None
    try:
        if kind == loops.URING:
            loop, ring, buf = _uring_loop(fd, words, 4, bs)
        else:
            buf = np.zeros(bs, np.uint8)
            loop = loops.NativeLoop(kind, depth=1, bs=bs, bufs=buf.ctypes.data,
                                    stop=ctypes.addressof(words), fds=np.array([fd]),
                                    seeds=None, magic=0, halt_on_error=True, batch=8,
                                    writes=False)
        now = time.monotonic_ns()
        due = np.array([now, now + 3600 * SECOND, now + 3600 * SECOND], np.int64)
        yield loop, (np.zeros(3, np.int32), np.array([0, bs, 2 * bs], np.uint64), due)
    finally:
        if ring is not None:
            ring.close()
        os.close(fd)


@needs_cc
@pytest.mark.parametrize("kind", [loops.NULL, loops.PSYNC, loops.URING])
def test_a_compiled_loop_reaps_what_is_in_flight_while_nothing_is_due(pattern_file, kind):
    words = (ctypes.c_int64 * 2)(0, 1)  # the control words: stop, measuring
    with _one_due(pattern_file, kind, words) as (loop, (tgt, offs, due)):
        # I/O 0 is due, the others not for an hour: the call issues one, reaps it (it does
        # not keep it in flight waiting for the next), and hands it back at the deadline
        # (a deadline a starved core meets: a 4 KiB read took longer than 20 ms there)
        used, k = loop.run(tgt, offs, None, time.perf_counter_ns() + 500_000_000, due)
        assert (used, k, loop.inflight) == (1, 1, 0)
        assert loop.res[0] == 4096 and not loop.timed_out and not loop.began_in_ramp


@needs_cc
@pytest.mark.parametrize("kind", [loops.NULL, loops.PSYNC, loops.URING])
def test_a_compiled_call_begun_in_the_ramp_returns_when_the_window_begins(pattern_file, kind):
    # its completions are all the ramp's: a call that ran on into the window (a batch spans
    # tens of ms at a slow rate) would have its ramp completions counted as measured
    words = (ctypes.c_int64 * 2)(0, 0)  # stop, measuring: still in the ramp
    with _one_due(pattern_file, kind, words) as (loop, (tgt, offs, due)):
        deadline = time.perf_counter_ns() + 60 * SECOND

        def begin_window() -> None:
            # I/O 0 is done: the call is waiting for the next (or, broken, never issued it)
            while loop.res[0] != 4096 and time.perf_counter_ns() < deadline:
                time.sleep(0.001)
            words[1] = 1
        opener = threading.Thread(target=begin_window)
        opener.start()
        used, k = loop.run(tgt, offs, None, deadline, due)
        opener.join()
        assert (used, k) == (1, 1) and loop.began_in_ramp  # its one completion: the ramp's
        assert time.perf_counter_ns() < deadline  # it did not wait for the deadline


def test_the_passes_beside_a_job_are_not_capped():
    from gpufio.workloads.block.phases import precondition_job

    (job,) = profile.from_dict({"global": {"rw": "randwrite", "size": "1m", "rate_iops": 10,
                                           "precondition": "seq"}}, "p.toml", {}).jobs
    assert job.workload_options["rate_iops"] == 10
    assert "rate_iops" not in precondition_job(job, 0).workload_options


@pytest.mark.gpu
def test_a_capped_cpu_gpu_run_stays_at_or_under_the_cap(write_profile, tmp_path):
    rate, iodepth = 400, 4
    path = write_profile(f'[global]\nengine = "cpu-gpu"\nsize = "1m"\nruntime = "500ms"\n'
                         f'time_based = true\niodepth = {iodepth}\nrate_iops = {rate}\n')
    out = tmp_path / "r.json"
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    (job,) = json.loads(out.read_text())["jobs"]
    assert 0 < job["read"]["total_ios"] <= rate * job["read"]["runtime"] / 1e3 + 1 + iodepth
