"""uring-engine specifics: its options, its limits, and that it never hangs."""

import os
import threading
import time

import numpy as np
import pytest

from gpufio.core.context import WorkerContext
from gpufio.core.errors import BadInput
from gpufio.core.offsets import Distribution, OffsetStream
from gpufio.core.shared import JobShared
from gpufio.core.targets import Target
from gpufio.engines import uring as uring_engine
from gpufio.io import loops, uring
from gpufio.io.watchdog import Stalled
from gpufio.profile import from_dict
from gpufio.loops import block_host as blockloop
from gpufio.loops.block_host import BlockLoop


def worker_context(nblocks: int, budget: int) -> WorkerContext:
    """A lone worker's context reading 4 KiB blocks sequentially, as the runner builds it."""
    shared = JobShared(1)
    stream = OffsetStream(random=False, bs=4096, regions=[(0, nblocks)],
                          dist=Distribution("random"), file_service="roundrobin", seed=(1,),
                          budget=budget)
    return WorkerContext(bs=4096, stream=stream, control=shared.control, ntargets=1,
                         block=shared.blocks[0], seeds=None, verify=False,
                         continue_on_error=False)


def job(**opts):
    return from_dict({"global": {"engine": "uring", "size": "1m", **opts}}, "p.toml", {}).jobs[0]


@pytest.mark.parametrize("opts,message", [
    ({"iodepth": 64, "ring_entries": 32},
     "key 'iodepth': 64 reads in flight do not fit a ring of ring_entries = 32"),
    ({"iodepth": 40000}, "is above the largest io_uring ring \\(32768 entries\\)"),
    ({"ring_entries": 65536}, "key 'ring_entries': 65536 is more than io_uring's 32768"),
    ({"sqpoll": "maybe"}, "key 'sqpoll': expected true or false"),
])
def test_bad_uring_options(opts, message):
    with pytest.raises(BadInput, match=message):
        job(**opts)


def test_uring_options_belong_to_uring_only():
    with pytest.raises(BadInput, match="key 'sqpoll' is an option of engine 'uring', not of 'psync'"):
        from_dict({"global": {"engine": "psync", "sqpoll": True}}, "p.toml", {})


def test_unavailable_io_uring_is_reported(monkeypatch):
    monkeypatch.setattr(uring, "probe", lambda: {"available": False,
                                                 "reason": "io_uring is disabled here"})
    assert uring_engine.Uring.unavailable() == "io_uring is disabled here"


def test_result_describes_the_ring_options():
    facts = uring_engine.Uring.describe(job(sqpoll=True, fixedbufs=True))
    assert facts == {"page_cache": False, "sqpoll": True, "fixedbufs": True,
                     "registerfiles": False, "hipri": False, "defer_taskrun": True,
                     "iodepth_batch_submit": 1, "wait_spin": 3_000, "op": "io",
                     "loop": "compiled" if loops.available() else "python"}


def stop_once_submitted(ctx: WorkerContext, ring: uring.Ring, n: int) -> threading.Thread:
    """A thread that stops the job once the kernel has taken ``n`` SQEs of ``ring``: the
    worker is then blocked in its wait, with those I/Os in flight."""
    def body() -> None:
        while ring.state()["sq_head"] < n:
            time.sleep(0.001)
        ctx.control.stop()
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


@pytest.mark.skipif(not uring.probe()["available"], reason="io_uring unavailable")
@pytest.mark.parametrize("compiled", [True, False])
def test_a_stop_wakes_a_wait_on_ios_that_never_complete(tmp_path, monkeypatch, compiled):
    """Waits have no time limit while I/Os run; the stop's eventfd wakes a blocked one, and
    I/Os that still never complete then end in the stall diagnostic."""
    if compiled and not loops.available():
        pytest.skip("no compiled loops here (no C compiler)")
    monkeypatch.setattr(loops, "available", lambda: compiled)
    monkeypatch.setattr(blockloop, "STALL_LIMIT_NS", 300_000_000)
    monkeypatch.setattr(blockloop, "WAIT_NS", 50_000_000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # reads on it wait forever for data
    j = job(iodepth=4, rw="read", direct=False)
    ctx = worker_context(nblocks=256, budget=4)
    engine = BlockLoop(uring_engine.Uring, j, [Target(str(fifo), fd, 1 << 20, False, 512, None)],
                       ctx)
    stopper = stop_once_submitted(ctx, engine.channel.ring, 5)  # the stop poll and the 4 reads
    try:
        with pytest.raises(Stalled,
                           match="4 I/Os in flight and none completed for 0.3 s: .*'inflight': 4"):
            engine.run()
    finally:
        engine.close()
        os.close(fd)
    stopper.join()
    assert ctx.rec.completed == 0 and np.sum(ctx.rec.short) == 0
    assert engine.channel.ring.woken or compiled  # the compiled loop reaps the poll's CQE itself


@pytest.mark.skipif(not uring.probe()["available"], reason="io_uring unavailable")
def test_a_lagging_sq_head_does_not_end_the_job(pattern_file):
    """SQPOLL may post completions before it frees their SQ slots; the job must go on."""
    j = job(iodepth=4, rw="read", targets=[str(pattern_file)])
    ctx = worker_context(nblocks=1024, budget=64)
    fd = os.open(pattern_file, os.O_RDONLY)
    engine = BlockLoop(uring_engine.Uring, j,
                       [Target(str(pattern_file), fd, 4 << 20, False, 512, 1234)], ctx)
    real_space = engine.channel.ring.space
    calls = {"n": 0}

    def lagging_space():
        calls["n"] += 1
        return 0 if calls["n"] % 3 == 0 else real_space()  # every third look: head not moved

    engine.channel.ring.space = lagging_space
    try:
        engine.run()
    finally:
        engine.close()
        os.close(fd)
    assert ctx.rec.completed == 64


@pytest.mark.skipif(not uring.probe().get("sqpoll"), reason="SQPOLL not available")
@pytest.mark.parametrize("sqpoll,numjobs", [(True, 1), (True, 2), (False, 1)])
def test_an_sqpoll_run_reports_its_threads_working_share(pattern_file, sqpoll, numjobs):
    """One share per SQPOLL thread: each worker (a forked process) has its own ring and
    thread, and the result gathers every worker's."""
    from gpufio.facts.host import kernel_version
    from gpufio.workloads.block import runner

    profile = from_dict({"global": {"engine": "uring", "targets": [str(pattern_file)],
                                    "sqpoll": sqpoll, "iodepth": 8, "runtime": "500ms",
                                    "ramp_time": "200ms", "time_based": True,
                                    "numjobs": numjobs}}, "p.toml", {})
    (r,) = runner.run_profile(profile, quiet=True).results
    assert r.ok and r.ios > 0
    if not sqpoll:
        assert "sq_thread_busy" not in r.engine_facts
    elif kernel_version() >= (6, 13):  # SqWorkTime in the ring's fdinfo
        # the kernel's clocks behind the shares are tick-sampled: under load a thread may
        # gather no tick in a short run and is then left out (busy_shares, tested on
        # recorded readings), so only the shares' number and range are the run's to assert
        shares = r.engine_facts.get("sq_thread_busy", [])
        assert len(shares) <= numjobs and all(0 <= s <= 1 for s in shares)


def test_nop_completes_every_request_without_touching_storage(tmp_path):
    from gpufio.workloads.block import runner

    target = tmp_path / "t.dat"
    prof = from_dict({"global": {"engine": "uring", "op": "nop", "iodepth": 16, "size": "1m",
                                 "io_size": "8m", "targets": [str(target)]}}, "p.toml", {})
    (r,) = runner.run_profile(prof, quiet=True).results
    assert r.ok and r.read.ios == 2048 and r.engine_facts["op"] == "nop"
    assert r.engine_facts["storage"] == "none: NOPs"


@pytest.mark.parametrize("extra", [{"rw": "write"}, {"verify": True}])
@pytest.mark.parametrize("engine", ["uring", "gpu-uring"])
def test_nop_refuses_writes_and_verify(extra, engine):
    with pytest.raises(BadInput, match='op = "nop" moves no data'):
        from_dict({"global": {"engine": engine, "op": "nop", **extra}}, "p.toml", {})
