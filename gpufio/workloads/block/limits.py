"""The machine's limits a profile must fit before anything is laid out: open files
(RLIMIT_NOFILE, raised to the hard limit where that suffices) and processes."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from gpufio.core.errors import BadInput
from gpufio.core.job import Profile
from gpufio.engines import all_engines

# descriptors the runner holds per worker (its pipe, its sentinel, a ring and an eventfd
# when the worker is a thread), beside the targets it opens once per job
FDS_PER_WORKER = 4


FDS_SPARE = 64


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return FDS_SPARE


def _process_room() -> int:
    """How many more processes (threads) the kernel will start: threads-max and pid_max,
    less what already runs."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[1])
        limits = [int(Path(p).read_text()) for p in ("/proc/sys/kernel/threads-max",
                                                      "/proc/sys/kernel/pid_max")]
    except (OSError, ValueError, IndexError):
        return sys.maxsize
    return min(limits) - running


def check_machine_limits(profile: Profile) -> None:
    """BadInput, before any target is laid out, for jobs this machine cannot start: more
    open files than RLIMIT_NOFILE allows (the soft limit is raised to the hard one when that
    suffices, as a user's ulimit -n would), more processes than the kernel has room for."""
    batches = profile.batches(profile.jobs)
    if profile.runs_together and any(j.cpu_accounting == "cgroup" for j in profile.jobs):
        raise BadInput("cpu_accounting = \"cgroup\" counts one job at a time: it cannot be "
                       "used with concurrent = true (nor with a fio job file's jobs that run "
                       "at once)")
    target_fds = sum(max(len(j.targets), 1) for j in profile.jobs)
    worst = max(batches, key=lambda b: sum(j.numjobs for j in b))
    need = _open_fds() + FDS_SPARE + target_fds + FDS_PER_WORKER * sum(j.numjobs for j in worst)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need > soft:
        if hard != resource.RLIM_INFINITY and need > hard:
            job = max(worst, key=lambda j: j.numjobs)
            raise BadInput(f"job '{job.name}': numjobs {job.numjobs} needs about {need} open "
                           f"files; this process may open {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    room = _process_room()
    for batch in batches:
        procs = sum(j.numjobs for j in batch
                    if all_engines()[j.engine].worker_kind_for(j) != "thread")
        if procs > room:
            job = max(batch, key=lambda j: j.numjobs)
            raise BadInput(f"job '{job.name}': numjobs {job.numjobs} needs {procs} worker "
                           f"processes; the kernel has room for {room} more "
                           "(kernel.threads-max, kernel.pid_max)")
