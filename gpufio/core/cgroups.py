"""cgroups for measuring: where a controller's hierarchy is mounted, this process's place in
it, and a group of its own whose CPU use can be read.

CPU use is read from the group, not from getrusage, so that kernel threads working for the
processes in it (io_uring's SQPOLL and io-wq workers, which are created in their task's
cgroup) are charged the same way for every tool: gpufio's ``cpu_accounting = "cgroup"`` and
the benchmarks' peers (fio) measured like for like.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path
from typing import IO

from gpufio.core import processes
from gpufio.core.stats import CpuTimes


def mounts(controller: str) -> tuple[Path | None, Path | None]:
    """(the v1 hierarchy mounted with ``controller``, the v2 mount); either may be None."""
    v1 = v2 = None
    with open("/proc/mounts") as f:
        for line in f:
            _, point, fstype, opts = line.split()[:4]
            if fstype == "cgroup" and controller in opts.split(","):
                v1 = Path(point)
            elif fstype == "cgroup2" and v2 is None:
                v2 = Path(point)
    return v1, v2


def own_paths(controller: str) -> tuple[str | None, str | None]:
    """This process's cgroup path in the v1 ``controller`` hierarchy and in v2."""
    v1 = v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                v1 = path
            elif controllers == "":
                v2 = path
    return v1, v2


def remove(group: Path) -> None:
    """rmdir an emptied group (the kernel may take a moment to let go of it)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def remove_stale(parent: Path) -> None:
    """Remove the groups of earlier gpufio runs that were killed (kill -9, an OOM kill on
    cgroup v1) before they could remove their own: empty, and named after a process that is
    gone (gpufio-PID, gpufio-PID-..., gpufio-bench-PID-...)."""
    for group in parent.glob("gpufio-*"):
        pid = group.name.removeprefix("gpufio-").removeprefix("bench-").split("-")[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            if not (group / "cgroup.procs").read_text().strip():
                group.rmdir()
        except OSError:
            pass  # not ours to remove, or not empty after all


# how often follow_anonymous looks at the group: the limit stays that close behind its growth
FOLLOW_S = 0.02


def _stat(stat_file: Path, key: str) -> int:
    for line in stat_file.read_text().splitlines():
        name, value = line.split()
        if name == key:
            return int(value)
    raise OSError(f"{stat_file} has no '{key}'")


def follow_anonymous(limit_file: Path, stat_file: Path, key: str, limit: int,
                     done: IO[bytes]) -> dict[str, int]:
    """Keep a memory group's limit at ``limit`` plus the group's anonymous memory (``key`` of
    its memory.stat: anon on v2, rss on v1) until ``done`` is readable or closed, so that
    ``limit`` bounds the page cache alone: anonymous memory cannot be reclaimed without swap,
    and a group held above its limit by it throttles (v2) or kills (v1) every allocation.
    Returns the largest anonymous size seen."""
    peak = written = -1
    while True:
        try:
            anon = _stat(stat_file, key)
        except OSError:  # the group went (its process ended first): nothing left to follow
            break
        peak = max(peak, anon)
        # up at once, down only by a MiB or more: lowering a limit makes the writer reclaim
        if anon > written or written - anon >= 1 << 20:
            try:
                limit_file.write_text(str(limit + anon))
                written = anon
            except OSError:  # v1 refuses a limit below its usage (EBUSY) until reclaim
                pass
        if select.select([done], [], [], FOLLOW_S)[0]:
            break
    return {"anon_peak_bytes": max(peak, 0)}


def _follow_main(argv: list[str], inp: IO[bytes], out: IO[bytes]) -> None:
    """``python -m gpufio.core.cgroups LIMIT_FILE STAT_FILE KEY LIMIT``: follow_anonymous
    until ``inp`` closes (or its parent dies); says "ready" on ``out`` first and the result
    last. ``out`` is a pipe to gpufio (memlimit.py), never a terminal."""
    limit_file, stat_file, key, limit = Path(argv[0]), Path(argv[1]), argv[2], int(argv[3])
    processes.take_stop_signals()  # a stop sent to gpufio's group: gpufio closes our input
    out.write(processes.READY.encode() + b"\n")
    out.flush()
    seen = follow_anonymous(limit_file, stat_file, key, limit, inp)
    out.write(json.dumps(seen).encode() + b"\n")
    out.flush()


class CpuGroup:
    """A new cgroup (cpuacct on v1; on v2 a sibling of this process's own group, whose
    cpu.stat every v2 group has) that processes are moved into and whose user and system CPU
    time is read. Raises OSError where no group can be made (not root, no cgroupfs)."""

    def __init__(self, name: str) -> None:
        v1_mount, v2_mount = mounts("cpuacct")
        v1_path, v2_path = own_paths("cpuacct")
        if v1_mount is not None and v1_path is not None:
            self.home = v1_mount / v1_path.lstrip("/")
            parent, self.version = self.home, 1
        elif v2_mount is not None and v2_path is not None:
            self.home = v2_mount / v2_path.lstrip("/")
            # a v2 group holding processes may have no children with controllers: a sibling
            parent, self.version = (self.home if self.home == v2_mount else self.home.parent), 2
        else:
            raise OSError("no cgroup hierarchy with CPU accounting is mounted")
        remove_stale(parent)
        self.path = parent / name
        self.path.mkdir(exist_ok=True)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def times(self) -> CpuTimes:
        """User and system CPU seconds charged to the group so far."""
        if self.version == 1:
            # cpuacct.usage is the exact run time; usage_user and usage_sys are sampled at
            # the scheduler's ticks (0 for a burst that no tick saw, little under load), so
            # they only split the exact total; with no tick seen it is all counted as user
            total = int((self.path / "cpuacct.usage").read_text()) / 1e9
            usr = int((self.path / "cpuacct.usage_user").read_text())
            sys_ = int((self.path / "cpuacct.usage_sys").read_text())
            user_share = usr / (usr + sys_) if usr + sys_ else 1.0
            return CpuTimes(total * user_share, total * (1.0 - user_share))
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return CpuTimes(int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6)

    def close(self, pids: list[int] | None = None) -> None:
        """Move ``pids`` (None: this process; []: none, they have ended) back home and remove
        the group."""
        for pid in [os.getpid()] if pids is None else pids:
            try:
                (self.home / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass  # it has ended: nothing to move
        remove(self.path)


if __name__ == "__main__":
    _follow_main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer)
