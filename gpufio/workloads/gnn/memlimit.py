"""``memory_limit``: run a GNN job's iterations inside a memory cgroup, so the page cache
cannot hold a feature table larger than the limit, as with the experiment's 892 GB data set.

The process moves itself into a new memory cgroup with the limit set (cgroup v1: a child of
its own memory cgroup; v2: a sibling of its own cgroup, or a child of the root, where the
parent can delegate the memory controller), and moves back afterwards; memory charged before
the move stays where it was. The limit is one of page cache: what the process allocates for
itself after the move (its heap, the GPU runtime's host memory: anonymous memory, which
without swap cannot be reclaimed) is added to it as it grows, by a watcher process outside
the group (cgroups.follow_anonymous). A fixed limit is held above by that memory, and then
every allocation is throttled (v2's memory.high) or the job killed (v1): a group held
above its limit by anonymous memory with almost no page cache in it stalls. The result
records the limit, the control file, the cgroup used, the usage
measured there and the largest anonymous size the watcher saw.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gpufio.core import cgroups, processes
from gpufio.core.errors import BadInput, WorkerHung
from gpufio.facts.device import read_int

# v2 caps with memory.high: over it the group is throttled and reclaimed, never OOM-killed.
# A hard memory.max kills a loader whose mapped pages are faulted back as fast as reclaim
# takes them, which is exactly the thrashing an out-of-core mmap run is meant to show.
# v1 has only the hard limit.
V1 = {"limit": "memory.limit_in_bytes", "peak": "memory.max_usage_in_bytes",
      "usage": "memory.usage_in_bytes", "anon": "rss"}
# v1's hard limit kills the job when its allocations outrun the watcher (a few MiB of
# Python and runtime heap at once): a smaller limit is refused rather than killed
V1_FLOOR = 64 << 20
V2 = {"limit": "memory.high", "peak": "memory.peak", "usage": "memory.current", "anon": "anon"}


def _parent() -> tuple[Path, Path, dict[str, str]]:
    """The memory cgroup to create our group in, the cgroup to come back to, and the
    control file names."""
    v1_mount, v2_mount = cgroups.mounts("memory")
    v1_path, v2_path = cgroups.own_paths("memory")
    if v1_mount is not None and v1_path is not None:
        own = v1_mount / v1_path.lstrip("/")
        return own, own, V1
    if v2_mount is not None and v2_path is not None:
        own = v2_mount / v2_path.lstrip("/")
        # v2 lets a cgroup that holds processes (ours holds us) have no children with
        # controllers, so the new group is a sibling, except under the root, which may
        parent = own if own == v2_mount else own.parent
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            raise OSError("the memory controller is not delegated to this cgroup")
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text("+memory")
        return parent, own, V2
    raise OSError("no memory cgroup (v1 or v2) is mounted")


def _watcher(child: Path, files: dict[str, str], limit: int) -> subprocess.Popen:
    """The process that keeps the group's limit at ``limit`` plus its anonymous memory,
    started outside the group (it must never be throttled itself), watching once it says
    so; it ends when its standard input closes, also when gpufio is killed."""
    with processes.held():
        w = subprocess.Popen([sys.executable, "-m", "gpufio.core.cgroups",
                              str(child / files["limit"]), str(child / "memory.stat"),
                              files["anon"], str(limit)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def said_ready(timeout: float) -> bool:
        return (bool(select.select([w.stdout], [], [], timeout)[0])
                and w.stdout.readline().decode().strip() == processes.READY)

    try:
        processes.await_ready("the memory watcher", said_ready, w.poll)
    except WorkerHung as e:
        w.kill()
        w.wait()
        raise OSError(str(e)) from None
    return w


def _stop(w: subprocess.Popen) -> dict[str, int]:
    """End the watcher; what it saw (nothing, if it had to be killed)."""
    try:
        out, _ = w.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # stuck in a write the kernel makes wait: kill it
        w.kill()
        w.communicate()
        return {}
    try:
        return json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def resolve(value: int | float | None, table_bytes: int) -> tuple[int | None, str]:
    """memory_limit's bytes and how it was asked: a size as given, or a share (a float:
    0.25 for "25%") of the feature table's ``table_bytes``, which then says so."""
    if value is None:
        return None, ""
    if isinstance(value, float):
        return max(int(value * table_bytes), 4096), \
            f"{100 * value:g}% of the {table_bytes / 1e9:.2f} GB feature table"
    return value, ""


def describe(facts: dict[str, Any]) -> str:
    """The limit of a result's ``memory_limit`` facts in a few words, for titles."""
    limit = f"page cache capped at {facts['limit_bytes'] / 1e9:.2f} GB"
    return f"{limit} ({facts['asked']})" if facts.get("asked") else limit


@contextmanager
def limited(limit: int) -> Iterator[dict[str, Any]]:
    """Run the block with this process's new page cache charged to a cgroup capped at
    ``limit`` bytes (its new anonymous memory on top); yields the facts for the result
    (usage and peaks filled in on the way out)."""
    watcher = None
    try:
        parent, home, files = _parent()
        if files is V1 and limit < V1_FLOOR:
            raise BadInput(f"key 'memory_limit': {limit / 2**20:.1f} MiB is below "
                           f"{V1_FLOOR >> 20} MiB, the least cgroup v1's hard limit holds "
                           "without the kernel killing the job; give a larger size or table")
        cgroups.remove_stale(parent)
        child = parent / f"gpufio-{os.getpid()}"
        child.mkdir(exist_ok=True)
        (child / files["limit"]).write_text(str(limit))
        watcher = _watcher(child, files, limit)
        (child / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        if watcher is not None:
            _stop(watcher)
        raise BadInput(f"key 'memory_limit': cannot run under a memory cgroup here: "
                       f"{e.strerror or e}; run gpufio under one instead (e.g. systemd-run "
                       "--scope -p MemoryHigh=...), or let the page cache hold the table with "
                       "--set memory_limit=none") from None
    facts: dict[str, Any] = {"limit_bytes": limit, "applies_to": "page cache; the process's "
                             "new anonymous memory is added to the group's limit as it grows",
                             "cgroup": str(child), "cgroup_version": 1 if files is V1 else 2,
                             "control": files["limit"]}
    facts["usage_at_entry_bytes"] = read_int(child / files["usage"])
    try:
        yield facts
    finally:
        facts["usage_at_exit_bytes"] = read_int(child / files["usage"])
        # memory.peak needs Linux 5.19 on cgroup v2
        facts["peak_bytes"] = read_int(child / files["peak"])
        (home / "cgroup.procs").write_text(str(os.getpid()))
        facts.update(_stop(watcher))
        cgroups.remove(child)
