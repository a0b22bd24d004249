"""Nothing outlives gpufio: kill -9 of the runner (an OOM kill, a CI timeout) ends every
worker, forked or spawned, within a second or two; a SIGTERM sent to gpufio's whole process
group (timeout(1), a batch system) stops the run as Ctrl-C does, its workers ending under
the runner, not before it."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufio.core import processes
from gpufio.core.errors import WorkerHung

# runs gpufio's CLI; with "spawn", psync's workers start as spawned interpreters, the kind
# GPU engines use for processes and MPS clients
LAUNCH = """
import sys
from gpufio.engines.psync import Psync
if sys.argv[1] == "spawn":
    Psync.worker_kind_for = classmethod(lambda cls, job: "spawn")
from gpufio.cli import main
sys.argv = ["gpufio", *sys.argv[2:]]
main()
"""


# a live line of a job in its measured phase with I/Os completed
MEASURING = re.compile(r"\] run \S+ iops=[1-9]")


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _starting(proc: subprocess.Popen, numjobs: int) -> list[int]:
    """The worker processes of ``proc`` as soon as all ``numjobs`` exist (starting up)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = [c for c in _children(proc.pid)
                   if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
        if len(workers) >= numjobs:
            return workers
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.01)
    raise AssertionError("the workers never started")


def _start(path: Path, scratch: Path, kind: str, numjobs: int,
           args: tuple[str, ...] = (), when: str = "measuring",
           **popen: Any) -> tuple[subprocess.Popen, list[int]]:
    """gpufio running ``path`` with ``kind`` workers, once they all exist (``when`` =
    "starting"), or once its live lines (stderr) show the job measuring with I/Os completed:
    every worker up and reading."""
    env = {**os.environ, "GPUFIO_SCRATCH": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, kind, "run", str(path), *args],
                            stderr=subprocess.PIPE, env=env, **popen)
    if when == "starting":
        return proc, _starting(proc, numjobs)
    seen = []
    while not seen or not MEASURING.search(seen[-1]):
        assert select.select([proc.stderr], [], [], 120)[0], f"no progress: {seen}"
        line = proc.stderr.readline().decode()
        assert line, f"gpufio ended (exit {proc.wait()}) before measuring: {seen}"
        seen.append(line)
    workers = [c for c in _children(proc.pid)
               if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(workers) >= numjobs, f"workers {workers}, not {numjobs}"
    return proc, workers


def _reap(proc: subprocess.Popen, workers: list[int]) -> None:
    """A failing run must not leave load behind either."""
    if proc.poll() is None:
        proc.kill()
    for pid in workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("kind,engine", [("fork", "psync"), ("fork", "uring"),
                                          ("spawn", "psync")])
def test_kill_9_of_the_runner_leaves_no_worker(write_profile, scratch, kind, engine):
    path = write_profile(f'[global]\nsize = "1m"\nruntime = "60s"\ntime_based = true\n'
                         f'engine = "{engine}"\niodepth = 4\nnumjobs = 2\n')
    proc, workers = _start(path, scratch, kind, 2, stdout=subprocess.DEVNULL)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60  # the kernel's PDEATHSIG, or the sentinel's watch
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [w for w in workers if _alive(w)] == []
    finally:
        _reap(proc, workers)


@pytest.mark.parametrize("kind,when", [("fork", "measuring"), ("spawn", "measuring"),
                                       ("fork", "starting"), ("spawn", "starting")])
def test_sigterm_to_the_process_group_keeps_the_results_and_exits_130(write_profile, scratch,
                                                                      kind, when):
    """Whether the workers are still starting (their handlers not yet in: the signal waits
    for them) or reading, the run ends with exit 130 and its document."""
    path = write_profile('[global]\nsize = "1m"\nruntime = "60s"\ntime_based = true\n'
                         'numjobs = 2\n')
    proc, workers = _start(path, scratch, kind, 2, args=("-f", "json"), when=when,
                           stdout=subprocess.PIPE, start_new_session=True)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # what timeout(1) sends: the workers get it too
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        doc = json.loads(out)
        assert doc["interrupted"] and [j["interrupted"] for j in doc["jobs"]] == [True]
        assert doc["jobs"][0]["error"] == 0
        assert doc["jobs"][0]["read"]["total_ios"] > 0 or when == "starting"
        assert [w for w in workers if _alive(w)] == []
    finally:
        _reap(proc, workers)


def _child_takes_a_signal_sent_while_starting(conn, sent) -> None:
    """A child started under processes.held: its stop signals arrive blocked; the SIGTERM
    its parent sent meanwhile (the parent says when it has, so that the signal is surely
    sent before the handlers go in, however the two are scheduled) waits pending and
    reaches the handler it installs."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    sent.recv()
    pending = signal.SIGTERM in signal.sigpending()
    got: list[bool] = []
    processes.take_stop_signals(lambda: got.append(True))
    conn.send((sorted(int(s) for s in blocked), pending, got))


def test_a_stop_sent_while_a_helper_starts_waits_for_its_handlers():
    """(Spawned helpers: the tests above with when = "starting".)"""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)
    waits, says = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child_takes_a_signal_sent_while_starting, args=(theirs, waits))
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # ours too, held meanwhile
    try:
        with processes.held():
            p.start()
            os.kill(p.pid, signal.SIGTERM)
            says.send(True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    theirs.close()
    waits.close()
    assert mine.poll(60), f"the child said nothing (exit {p.exitcode})"
    blocked, pending, got = mine.recv()
    p.join()
    assert p.exitcode == 0
    assert {signal.SIGINT, signal.SIGTERM} <= set(blocked) and pending and got == [True]


def test_a_helper_that_never_comes_up_is_named():
    """The parent waits for each helper's word with a deadline, and names the one that
    stayed silent, or ended first."""
    import multiprocessing

    with pytest.raises(WorkerHung, match="the trainer on GPU 1 did not come up within 0.5 s"):
        processes.await_ready("the trainer on GPU 1", lambda t: time.sleep(t) or False,
                              lambda: None, timeout=0.5)
    p = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(7,))
    processes.start(p)
    with pytest.raises(WorkerHung, match=r"the trainer on GPU 0 ended \(exit code 7\) before"):
        processes.await_ready("the trainer on GPU 0", lambda t: time.sleep(t) or False,
                              lambda: p.exitcode)
    p.join()


# a thread of a parent starts a software NVMe controller and waits until it serves; once the
# thread has ended, the parent prints the controller's pid and waits to be killed
THREAD_STARTS = """
import sys, threading, time
from gpufio.core import targets
from gpufio.io.nvme.model import ModelProcess
targets.create_file(sys.argv[1] + "/ns.dat", 1 << 20, 1)
made = []
def start():
    made.append(ModelProcess(sys.argv[1], sys.argv[1] + "/ns.dat"))
    made[0].host()  # it serves, its parent-death arrangements made
t = threading.Thread(target=start)
t.start()
t.join()
print(made[0]._proc.pid, flush=True)
time.sleep(600)
"""


def test_a_helper_a_thread_started_outlives_the_thread_but_not_the_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", THREAD_STARTS, str(tmp_path)],
                            stdout=subprocess.PIPE)
    child = 0
    try:
        assert select.select([proc.stdout], [], [], 120)[0], "the controller never came up"
        child = int(proc.stdout.readline())
        assert _alive(child)  # its starting thread has ended
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60  # the sentinel's watch alone
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        _reap(proc, [child] if child else [])
