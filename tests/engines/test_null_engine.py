"""The null engine: every I/O completes as it is handed out, so a run counts exactly its
budget, splits it over the targets, and reads nothing."""

from __future__ import annotations

import numpy as np
import pytest

from gpufio.core import targets
from gpufio.core.errors import BadInput
from gpufio.profile import from_dict, load
from gpufio.run import jobrun
from gpufio.workloads.block import runner


def _run(paths, **opts):
    glob = {"engine": "null", "targets": [str(p) for p in paths], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_a_budgeted_run_completes_exactly_its_ios_over_both_targets(tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 1 << 20, 1)
    targets.create_file(str(b), 1 << 20, 2)
    r = _run([a, b], iodepth=32, numjobs=2, io_size="4m")
    assert r.ok, r.failure
    assert r.ios == 2 * 1024 and r.bytes == r.ios * 4096
    assert [p["ios"] for p in r.per_target] == [1024, 1024]
    assert r.lat.n == r.ios and sum(r.lat.hist) == r.ios
    assert sorted(w["ios"] for w in r.per_worker) == [1024, 1024]
    assert r.engine_facts["moves_data"] is False


def test_a_timed_run_keeps_going_for_its_runtime(pattern_file):
    r = _run([pattern_file], iodepth=128, runtime="300ms", time_based=True)
    assert r.ok and r.ios > 0 and 0.25e9 < r.runtime_ns < 1.5e9


def test_verify_is_refused_because_nothing_is_read(pattern_file):
    with pytest.raises(BadInput, match="engine 'null' moves no data, so verify has nothing"):
        from_dict({"global": {"engine": "null", "targets": [str(pattern_file)],
                              "verify": True}}, "t.toml", {})


def test_fios_null_job_files_run_on_it(tmp_path):
    path = tmp_path / "null.fio"
    path.write_text("[global]\nioengine=null\nbs=4k\nsize=1m\n[j]\niodepth=16\n")
    (job,) = load(str(path)).jobs
    assert (job.engine, job.iodepth) == ("null", 16)


@pytest.fixture
def stuck(monkeypatch):
    """The null engine's block loop with a run that completes a few I/Os, then makes a call
    that never returns (as a library stuck inside would); released when the test ends."""
    import threading

    from gpufio.loops.block_host import BlockLoop

    release = threading.Event()

    def run(self):
        tgt, offs = self.ctx.next_batch(4)
        self.ctx.complete(np.full(len(offs), 1000, np.int64), tgt,
                          np.full(len(offs), self.job.bs, np.int32), self.ctx.last_writes())
        release.wait()  # the call that does not return

    monkeypatch.setattr(BlockLoop, "run", run)
    monkeypatch.setattr(jobrun, "STOP_GRACE_S", 0.3)
    monkeypatch.setattr(jobrun, "NO_PROGRESS_S", 0.3)
    yield
    release.set()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_worker_that_never_returns_after_its_runtime_is_named_not_waited_for(
        stuck, pattern_file, monkeypatch, kind):
    """A thread is named with the gpufio frame it is stuck under (the process then exits
    without it, cli.py); a process worker is killed."""
    import os

    from gpufio.core.errors import WorkerHung
    from gpufio.engines.null import Null

    monkeypatch.setattr(Null, "worker_kind", kind)
    monkeypatch.setattr(jobrun, "NO_PROGRESS_S", 60.0)  # only the runtime's end stops it
    where = (r"thread t/0, in gpufio/\S+\.py:\d+ \(\w+\)" if kind == "thread"
             else r"process (\d+)")
    with pytest.raises(WorkerHung, match=rf"job 't': worker 0 \({where}\) did not stop "
                                         r"within 0.3 s of being told to") as e:
        _run([pattern_file], runtime="200ms", time_based=True)
    if kind == "process":
        pid = int(str(e.value).split("process ")[1].split(")")[0])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_job_whose_ios_stopped_completing_is_stopped_and_its_worker_named(stuck,
                                                                           pattern_file):
    from gpufio.core.errors import WorkerHung

    with pytest.raises(WorkerHung, match=r"worker 0 .* did not stop within 0.3 s after no "
                                         r"I/O completed for 0.3 s; it is stuck"):
        _run([pattern_file], io_size="1m")  # no runtime: only the stall ends it


def test_gpufio_run_with_a_stuck_worker_thread_says_so_and_exits_1(tmp_path, pattern_file):
    """The CLI ends the process at once (exit 1, one line) instead of waiting in the
    interpreter's shutdown for the thread that never returns."""
    import re
    import subprocess
    import sys

    profile = tmp_path / "p.toml"
    profile.write_text(f'[global]\nengine = "null"\ntargets = ["{pattern_file}"]\n'
                       'runtime = "200ms"\ntime_based = true\n')
    code = f"""
import sys, threading
from gpufio.engines.null import Null
from gpufio.loops.block_host import BlockLoop
from gpufio.run import jobrun
Null.worker_kind = "thread"
BlockLoop.run = lambda self: threading.Event().wait()
jobrun.STOP_GRACE_S = 0.3
sys.argv = ["gpufio", "run", {str(profile)!r}, "-q"]
from gpufio.cli import main
main()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert re.fullmatch(r"gpufio: error: job 'p': worker 0 \(thread p/0, in gpufio/run/"
                        r"launch.py:\d+ \(_run\)\) did not stop within 0.3 s of being told to; "
                        r"it is stuck in a call that does not return, and gpufio ends "
                        r"without it", line)


def test_ctrl_c_with_a_worker_stuck_in_a_call_names_it_instead_of_waiting(stuck, pattern_file):
    from gpufio.core.errors import WorkerHung

    ticks = []

    def on_tick(snapshots):
        ticks.append(1)
        if len(ticks) == 3:
            raise KeyboardInterrupt

    prof = from_dict({"global": {"engine": "null", "targets": [str(pattern_file)],
                                 "runtime": "60s", "time_based": True}}, "t.toml", {})
    with pytest.raises(WorkerHung, match=r"job 't': worker 0 \(process \d+\) did not stop "
                                         r"within 0.3 s"):
        runner.run_profile(prof, on_tick=on_tick, quiet=True, tick_every_s=0.05)
