"""Where a checkpoint goes: a file per shard in each target directory (``layout =
"files"``), or one file or block device per target holding its shards at 4 KiB-aligned
offsets (``"single"``); shards are dealt to the targets round-robin, so each drive takes an
equal share. Files are created at their full size (allocated, as fio lays out a file before
writing it); existing files and devices are written only where the write guard allows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from gpufio.core import space
from gpufio.core import targets as tg
from gpufio.core.errors import BadInput
from gpufio.core.guard import WriteConsent
from gpufio.core.job import Job
from gpufio.core.tensors import Extent

SINGLE_NAME = "gpufio-ckpt.dat"


def shard_name(i: int) -> str:
    return f"gpufio-ckpt-shard{i:05d}.dat"


@dataclass(frozen=True)
class Plan:
    """The files of a checkpoint, the bytes each must hold, and each shard's extent."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    extents: tuple[Extent, ...]


def _roots(job: Job) -> list[str]:
    """The job's targets, or gpufio's scratch directory (created if missing)."""
    if job.targets:
        return tg.resolve(job.targets)
    root = job.directory or tg.default_scratch_dir()
    if root == tg.default_scratch_dir():
        os.makedirs(root, exist_ok=True)
    return [root]


def plan(job: Job, sizes: Sequence[int]) -> Plan:
    """Lay ``sizes`` (the shards, in order) out over the job's targets."""
    roots = _roots(job)
    n = len(roots)
    if job.workload_settings.layout == "files":
        for root in roots:
            if not os.path.isdir(root):
                raise BadInput(f"target {root}: layout = \"files\" puts a file per shard in each "
                               "target, so it must be an existing directory (or use layout = "
                               "\"single\" for a file or block device)")
        paths = tuple(os.path.join(roots[i % n], shard_name(i)) for i in range(len(sizes)))
        return Plan(paths, tuple(sizes), tuple(Extent(i, i, 0, s) for i, s in enumerate(sizes)))
    paths = tuple(os.path.join(r, SINGLE_NAME) if os.path.isdir(r) else r for r in roots)
    used = [0] * n
    extents = []
    for i, s in enumerate(sizes):
        extents.append(Extent(i, i % n, used[i % n], s))
        used[i % n] += s
    return Plan(paths, tuple(used), tuple(extents))


def _to_lay_out(path: str, need: int) -> int:
    """The bytes that laying out ``path`` with ``need`` bytes adds: all of a missing file's,
    the rest of a smaller file's, none of a device's."""
    if not os.path.lexists(path):
        return need
    return max(need - os.path.getsize(path), 0) if os.path.isfile(path) else 0


def _ensure(path: str, need: int, consent: WriteConsent) -> bool:
    """Create ``path`` with ``need`` bytes allocated (True), or grow a smaller regular file the
    guard lets the job write (False); devices are left as they are."""
    if not os.path.lexists(path):
        tg.check_creatable(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        _allocate(fd, path, 0, need)
        return True
    if os.path.isfile(path) and os.path.getsize(path) < need:
        consent.check(path, False)
        fd = os.open(path, os.O_WRONLY)
        _allocate(fd, path, os.path.getsize(path), need)
    return False


def _allocate(fd: int, path: str, start: int, end: int) -> None:
    """Allocate bytes [start, end) of ``fd`` and close it; BadInput when there is no room."""
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as e:
        raise BadInput(f"target {path}: cannot make room for {end} bytes of checkpoint: "
                       f"{e.strerror}") from None
    finally:
        os.close(fd)


def open_files(job: Job, p: Plan) -> list[tg.Target]:
    """Every file of the plan, created or checked by the write guard, open for writing."""
    consent = WriteConsent(job.overwrite, job.write_device)
    for path in p.paths:
        if not os.path.lexists(path):
            tg.check_creatable(path)  # where no file may be, that is the error to report
    # the new bytes of every file, together: many shards may each be small
    space.check_layouts([(path, n) for path, need in zip(p.paths, p.sizes)
                         if (n := _to_lay_out(path, need))], job.allow_large_layout)
    opened: list[tg.Target] = []
    try:
        for path, need in zip(p.paths, p.sizes):
            created = _ensure(path, need, consent)
            # a file gpufio has just created is its own to write
            t = tg.open_target(path, job.direct, WriteConsent(True, None) if created else consent)
            opened.append(t)
            if t.size < need:
                raise BadInput(f"target {path}: {t.size} bytes, too small for its "
                               f"{need} bytes of checkpoint")
    except BaseException:
        for t in opened:
            t.close()
        raise
    return opened
