"""Whether reads of a target reach storage, decided from the target itself.

A number is a drive's only when its reads reach one. They do not for a file in RAM (tmpfs,
ramfs), a RAM disk (zram, brd, pmem emulated from RAM), the holes and unwritten
(fallocated) extents of a file, a loop device without direct I/O (its backing file's page
cache answers), a device-mapper device with no member (zero, error), and any buffered
I/O (the page cache may serve it). Network and FUSE filesystems and network block devices
reach storage somewhere else, and are named so. Stacks are followed down: a filesystem to its
disk, a loop device to its backing file (from the byte it maps), device-mapper and md
devices to their members (sysfs ``slaves``).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufio.facts import device
from gpufio.facts.extents import coverage

# filesystems whose files live in memory
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
# filesystems whose files are another machine's (or the host's, for a guest)
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs",
                                 "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs",
                                 "orangefs", "coda"})
PAGE_CACHE = "page cache"
HOLES = "holes"
UNWRITTEN = "unwritten"
DRIVE = "drive"
UNKNOWN = "unknown storage"
EMULATED_PMEM = "pmem (RAM)"
# the kinds that are memory: what ``ram_backed`` has always meant
RAM_KINDS = RAM_FILESYSTEMS | {"zram", "brd", EMULATED_PMEM}
_MAX_DEPTH = 6  # a stack deeper than this is not followed further
_DISK_KINDS = ((re.compile(r"zram\d+"), "zram"), (re.compile(r"ram\d+"), "brd"),
               (re.compile(r"nbd\d+"), "nbd"), (re.compile(r"rbd\d+"), "rbd"))


@dataclass(frozen=True)
class Storage:
    """What reads of a target reach: ``kind`` (drive, page cache, holes, unwritten, zram,
    brd, tmpfs, nfs4, fuse.sshfs ...), whether that is storage, and the chain that says
    so; ``backed``: the share of the range read that has data on the drive, for files."""

    kind: str
    reaches_storage: bool
    reason: str
    backed: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``storage`` fact of a result's target."""
        out: dict[str, Any] = {"kind": self.kind, "reaches_storage": self.reaches_storage,
                               "reason": self.reason}
        if self.backed is not None:
            out["backed"] = round(self.backed, 4)
        return out


def _over(what: str, below: Storage) -> Storage:
    """``below`` seen from the device or file ``what`` stacked on it."""
    return Storage(below.kind, below.reaches_storage, f"{what}: {below.reason}", below.backed)


def _loop(disk: Path, offset: int, length: int | None, extents: bool, depth: int) -> Storage:
    """A loop device: its backing file from the byte it maps, read directly (loop/dio = 1)
    or through that file's page cache."""
    name = disk.name
    backing = (device.read_text(disk / "loop" / "backing_file") or "").removesuffix(" (deleted)")
    if not backing:
        return Storage(UNKNOWN, True, f"{name} is a loop device whose backing file sysfs "
                                      "does not name")
    dio = device.read_text(disk / "loop" / "dio") == "1"
    start = (device.read_int(disk / "loop" / "offset") or 0) + offset
    try:
        below = _path(backing, start, length, dio, extents, depth + 1)
    except OSError as e:
        return Storage(UNKNOWN, True, f"{name} over {backing}: {e.strerror}")
    if below.kind == PAGE_CACHE and not dio:
        return Storage(PAGE_CACHE, False, f"{name} reads {backing} through its page cache "
                                          "(loop/dio = 0)", below.backed)
    return _over(f"{name} over {backing} (loop/dio = {int(dio)})", below)


def _members(disk: Path, extents: bool, depth: int) -> Storage | None:
    """A device-mapper or md device by its members (None: it has none)."""
    try:
        members = sorted(m.resolve() for m in (disk / "slaves").iterdir())
        # a partition's facts are its disk's (a loop device's partition: the loop device)
        members = [m.parent if (m / "partition").exists() else m for m in members]
    except OSError:
        members = []
    if not members:
        return None
    below = [_disk(m, 0, None, extents, depth + 1) for m in members]
    names = ", ".join(m.name for m in members)
    bad = [b for b in below if not b.reaches_storage]
    if bad:
        return _over(f"{disk.name} over {names}", bad[0])
    kinds = {b.kind for b in below}
    return Storage(kinds.pop() if len(kinds) == 1 else DRIVE, True, f"{disk.name} over "
                   f"{'; '.join(b.reason for b in below)}")


def _disk(disk: Path, offset: int, length: int | None, extents: bool, depth: int) -> Storage:
    """The device at sysfs directory ``disk`` (a whole disk), bytes from ``offset``."""
    name = disk.name
    for pattern, kind in _DISK_KINDS:
        if pattern.fullmatch(name):
            if kind in RAM_KINDS:
                return Storage(kind, False, f"{name} is a RAM disk ({kind})")
            return Storage(kind, True, f"{name} is a network block device ({kind}): its "
                                       "storage is on another machine")
    if re.fullmatch(r"pmem\d+(\.\d+)?", name):
        if "e820" in str(disk.resolve()):  # memmap= carves it out of RAM
            return Storage(EMULATED_PMEM, False, f"{name} is persistent memory emulated "
                                                 "from RAM (memmap=)")
        return Storage("pmem", True, f"{name} is persistent memory (reads are memory loads)")
    if depth >= _MAX_DEPTH:
        return Storage(UNKNOWN, True, f"{name}: stacked deeper than gpufio follows")
    if (disk / "loop").is_dir():
        return _loop(disk, offset, length, extents, depth)
    stacked = _members(disk, extents, depth)
    if stacked is not None:
        return stacked
    if (disk / "dm").is_dir():
        return Storage("device-mapper", False, f"{name} is a device-mapper device with no "
                                               "member device (a zero, error or similar "
                                               "target): its reads reach no drive")
    model = device.read_text(disk / "device" / "model")
    return Storage(DRIVE, True, name + (f" ({model})" if model else ""))


def _filesystem(path: str, dev: int, depth: int) -> Storage:
    """The filesystem holding ``path`` and the device under it."""
    fs = device.fs_type(dev)
    fstype = fs[0] if fs else "?"
    if fstype in RAM_FILESYSTEMS:
        return Storage(fstype, False, f"{path} is on {fstype}, in RAM")
    source = device.mount_source(dev)
    if fstype in NETWORK_FILESYSTEMS:
        return Storage(fstype, True, f"{path} is on {fstype} ({source}): its reads go to "
                                     "storage on another machine, whose caches may answer")
    if fstype == "fuse" or fstype.startswith("fuse."):
        return Storage(fstype, True, f"{path} is on a FUSE filesystem ({fstype}, {source}): "
                                     "a daemon answers its reads, from storage elsewhere")
    disk = device.disk_dir(dev)
    if disk is None and source.startswith("/dev/"):  # btrfs: an anonymous device number
        try:
            disk = device.disk_dir(os.stat(source).st_rdev)
        except OSError:
            disk = None
    if disk is None:
        return Storage(UNKNOWN, True, f"{path} is on {fstype} ({source or '?'}), which "
                                      "names no block device gpufio can follow")
    return _over(f"{path} on {fstype}", _disk(disk, 0, None, False, depth + 1))


def _holes(path: str, offset: int, length: int | None) -> Storage | None:
    """Holes or unwritten extents in bytes [offset, offset + length) of the file ``path``
    (None when every byte has data)."""
    cov = coverage(path, offset, length)
    if cov.backed >= 1.0:
        return None
    share = f"{100 * (1 - cov.backed):.0f}%" if cov.written else "all"
    where = f"bytes {offset}-{offset + cov.length} of {path}"
    if cov.unwritten >= cov.holes:
        what, why = UNWRITTEN, "allocated but never written (fallocate)"
    else:
        what, why = HOLES, "holes (a sparse file)"
    return Storage(what, False, f"{share} of {where} are {why}: their reads return zeros "
                                f"without reaching the drive ({cov.method})", cov.backed)


def _path(path: str, offset: int, length: int | None, direct: bool, extents: bool,
          depth: int) -> Storage:
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        disk = device.disk_dir(st.st_rdev)
        found = _disk(disk, offset, length, extents, depth) if disk is not None else \
            Storage(UNKNOWN, True, f"{path}: a block device sysfs does not list")
    else:
        found = _filesystem(path, st.st_dev, depth)
        if found.reaches_storage and extents and stat.S_ISREG(st.st_mode):
            found = _holes(path, offset, length) or Storage(found.kind, True, found.reason, 1.0)
    if found.reaches_storage and not direct:
        return Storage(PAGE_CACHE, False, f"buffered I/O (direct = 0): the page cache may "
                                          f"serve it ({found.reason})", found.backed)
    return found


def classify(path: str, offset: int = 0, length: int | None = None, direct: bool = True,
             extents: bool = True) -> Storage:
    """What reads of bytes [offset, offset + length) of ``path`` (a file or block device;
    ``length`` None: to its end) reach, read with O_DIRECT or not; ``extents``: look for
    holes and unwritten extents in that range (not for a job that writes what it reads).
    OSError where ``path`` cannot be looked at."""
    return _path(path, offset, length, direct, extents, 0)


def ram_backing(path: str) -> str | None:
    """The kind of memory ``path`` (a file or block device) lives in, or None if it does
    not live in memory (or cannot be looked at)."""
    try:
        kind = classify(path, extents=False).kind
    except OSError:
        return None
    return kind if kind in RAM_KINDS else None
