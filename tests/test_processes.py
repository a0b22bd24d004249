"""Nothing outlives gpufio: kill -9 of the runner (an OOM kill, a CI timeout) ends every
worker, forked or spawned, within a second or two; a SIGTERM sent to gpufio's whole process
group (timeout(1), a batch system) stops the run as Ctrl-C does, its workers ending under
the runner, not before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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


def _start(path: Path, scratch: Path, kind: str, numjobs: int,
           args: tuple[str, ...] = ("-q",), **popen: Any) -> tuple[subprocess.Popen, list[int]]:
    """gpufio running ``path`` with ``kind`` workers, once all ``numjobs`` of them read."""
    env = {**os.environ, "GPUFIO_SCRATCH": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, kind, "run", str(path), *args],
                            stderr=subprocess.PIPE, env=env, **popen)
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [c for c in _children(proc.pid)
                   if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
        if len(workers) >= numjobs:
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.1)
    assert len(workers) >= numjobs, "the workers never started"
    time.sleep(1.0)  # they are reading now
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
        time.sleep(2.0)
        assert [w for w in workers if _alive(w)] == []
    finally:
        _reap(proc, workers)


@pytest.mark.parametrize("kind", ["fork", "spawn"])
def test_sigterm_to_the_process_group_keeps_the_results_and_exits_130(write_profile, scratch,
                                                                      kind):
    path = write_profile('[global]\nsize = "1m"\nruntime = "60s"\ntime_based = true\n'
                         'numjobs = 2\n')
    proc, workers = _start(path, scratch, kind, 2, args=("-q", "-f", "json"),
                           stdout=subprocess.PIPE, start_new_session=True)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # what timeout(1) sends: the workers get it too
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        doc = json.loads(out)
        assert doc["interrupted"] and [j["interrupted"] for j in doc["jobs"]] == [True]
        assert doc["jobs"][0]["read"]["total_ios"] > 0 and doc["jobs"][0]["error"] == 0
        assert [w for w in workers if _alive(w)] == []
    finally:
        _reap(proc, workers)
