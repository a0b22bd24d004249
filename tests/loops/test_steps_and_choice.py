"""The loops band's shared pieces: the one stall rule (loops/steps.StallWatch) every loop
ends a stall through, reads drawn ahead (loops/steps.DrawnAhead), and the choice of loop
from the engine's primitive and the memory."""

from __future__ import annotations

import numpy as np
import pytest

from gpufio.core.requests import CHANNEL, GPU, HOST, QUEUE, Capability
from gpufio.engines.base import Engine
from gpufio.io.watchdog import Stalled
from gpufio.loops.block import loop_class
from gpufio.loops.steps import DrawnAhead, StallWatch
from gpufio.profile import from_dict


def test_a_stall_is_no_progress_for_the_limit_and_its_message_says_where(clock):
    watch = StallWatch(1000, clock)
    clock.now = 900
    watch.check(0, "3 I/Os in flight", lambda: "never asked")  # first sight: the clock starts
    clock.now = 1800
    watch.check(0, "3 I/Os in flight", lambda: "never asked")  # 900 ns without progress
    clock.now = 1900
    watch.check(1, "3 I/Os in flight", lambda: "never asked")  # progress: starts again
    clock.now = 2901
    with pytest.raises(Stalled, match=r"^2 I/Os in flight and none completed for 1e-06 s: "
                                      r"ring state$"):
        watch.check(1, "2 I/Os in flight", lambda: "ring state")


def test_a_started_watch_counts_from_its_start(clock):
    watch = StallWatch(1000, clock).start()
    clock.now = 1001
    assert watch.stuck(0)  # one wait of the limit, with nothing done since the start
    fresh = StallWatch(1000, clock)
    assert not fresh.stuck(0)  # unstarted: its first count starts the clock


def _engine(cap, uses_gpu=False, queue=False):
    attrs = {"name": "t", "summary": "t", "capability": cap, "uses_gpu": uses_gpu}
    if queue:
        attrs["queue"] = classmethod(lambda cls, job, files, spec: None)
    return type("T", (Engine,), attrs)


@pytest.fixture
def job():
    return from_dict({"global": {"engine": "null", "size": "1m"}}, "t.toml", {}).jobs[0]


def test_the_block_loop_follows_the_primitive_and_the_memory(job):
    from gpufio.loops.block_device import DeviceBlockLoop
    from gpufio.loops.block_gpu_slots import GpuSlotLoop
    from gpufio.loops.block_host import BlockLoop
    from gpufio.loops.block_staged import StagedLoop

    host = _engine(Capability())
    assert host.primitive(job) == CHANNEL and loop_class(host, job) is BlockLoop
    assert loop_class(_engine(Capability(memory=(GPU,)), uses_gpu=True), job) is GpuSlotLoop
    assert loop_class(_engine(Capability(memory=(HOST,)), uses_gpu=True), job) is StagedLoop
    assert loop_class(_engine(Capability(moves_data=False), uses_gpu=True), job) is None
    gpu_threads = _engine(None, uses_gpu=True, queue=True)
    assert gpu_threads.primitive(job) == QUEUE
    assert loop_class(gpu_threads, job) is DeviceBlockLoop
    assert _engine(None).primitive(job) is None and loop_class(_engine(None), job) is None


class _Context:
    """A worker context's next_batch over offsets 0, 1, 2 ... up to ``total``, and done."""

    def __init__(self, total: int) -> None:
        self.total, self.pos, self.done, self.asked = total, 0, False, []

    def next_batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.asked.append(n)
        k = 0 if self.done else min(n, self.total - self.pos)
        offs = np.arange(self.pos, self.pos + k, dtype=np.uint64)
        self.pos += k
        return np.zeros(k, np.int32), offs


def test_reads_drawn_ahead_come_out_in_order_and_all_of_them():
    ctx = _Context(10)
    ahead = DrawnAhead(ctx, 4)
    got = []
    for k in (1, 2, 3, 4):
        batch = ahead.take(k)[1].tolist()
        assert len(batch) == k  # a take of up to iodepth is never short while pairs remain
        got += batch
        ahead.fill()  # what a loop does while its reads are in flight
    assert got == list(range(10))  # none lost, none twice, in the context's order
    assert ahead.take(4)[1].tolist() == []


def test_reads_drawn_ahead_are_not_issued_once_the_worker_is_done():
    ctx = _Context(100)
    ahead = DrawnAhead(ctx, 8)
    assert ahead.take(2)[1].tolist() == [0, 1]
    ctx.done = True  # the runtime is over: the 6 drawn are never handed out
    tgt, offs = ahead.take(8)
    assert len(offs) == 0 and tgt.dtype == np.int32 and offs.dtype == np.uint64

