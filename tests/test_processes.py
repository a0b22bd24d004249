"""Nothing outlives gpufio: kill -9 of the runner (an OOM kill, a CI timeout) ends every
worker, forked or spawned, within a second or two."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.parametrize("kind,engine", [("fork", "psync"), ("fork", "uring"),
                                          ("spawn", "psync")])
def test_kill_9_of_the_runner_leaves_no_worker(write_profile, scratch, kind, engine):
    numjobs = 2
    path = write_profile(f'[global]\nsize = "1m"\nruntime = "60s"\ntime_based = true\n'
                         f'engine = "{engine}"\niodepth = 4\nnumjobs = {numjobs}\n')
    env = {**os.environ, "GPUFIO_SCRATCH": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, kind, "run", str(path), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    workers: list[int] = []
    try:
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
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(2.0)
        assert [w for w in workers if _alive(w)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:  # a failing run must not leave load behind either
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
