"""Facts about the storage behind a path, read from sysfs and mountinfo.

A benchmark number is only meaningful next to what produced it: drive model, logical block
size, scheduler, and for NVMe the PCIe link actually negotiated (a Gen5 drive in a Gen4 slot
is a Gen4 drive). Everything here is best effort: a missing sysfs file yields no key rather
than an error, since containers and virtual disks expose less.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
from pathlib import Path
from typing import Any

_STATX_DIOALIGN = 0x2000
# filesystems whose files live in memory: reading them measures RAM, not a drive
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
# block devices that are memory: zram, brd (ramN), pmem emulated from RAM is left out (real
# persistent memory exists)
_RAM_DISKS = ("zram", "ram")
_AT_FDCWD = -100


class _Statx(ctypes.Structure):
    """struct statx up to the direct-I/O alignment fields (Linux 6.1+), padded to 256 bytes."""

    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("pad0", ctypes.c_uint8 * 144), ("dio_mem_align", ctypes.c_uint32),
                ("dio_offset_align", ctypes.c_uint32), ("pad1", ctypes.c_uint8 * 96)]


def read_text(path: Path) -> str | None:
    """The stripped text of a sysfs or proc file; None where it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_int(path: str | Path) -> int | None:
    """The integer a sysfs or cgroup file holds; None where it is missing or holds none."""
    text = read_text(Path(path))
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def dio_alignment(path: str) -> tuple[int, int] | None:
    """(memory, offset) alignment O_DIRECT needs on ``path``, from statx; None if unknown."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "statx"):
        return None
    buf = _Statx()
    rc = libc.statx(_AT_FDCWD, os.fsencode(path), 0, _STATX_DIOALIGN, ctypes.byref(buf))
    if rc != 0 or not buf.mask & _STATX_DIOALIGN or buf.dio_offset_align == 0:
        return None
    return buf.dio_mem_align, buf.dio_offset_align


def _fs_type(dev: int) -> tuple[str, str] | None:
    """(filesystem type, mount point) of the mount whose device number is ``dev``."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    text = read_text(Path("/proc/self/mountinfo")) or ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == want and " - " in line:
            return line.split(" - ", 1)[1].split()[0], fields[4]
    return None


def _disk_dir(dev: int) -> Path | None:
    """The sysfs directory of the whole disk holding block device ``dev``."""
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not node.exists():
        return None
    node = node.resolve()
    return node.parent if (node / "partition").exists() else node


def disk_inflight(fd: int) -> tuple[str, int, int] | None:
    """The whole disk under an open file or block device and the requests it has in flight
    at its driver and device (reads, writes; every process's), from sysfs ``inflight``;
    None where no disk holds it (tmpfs, a pipe) or the counter cannot be read."""
    st = os.fstat(fd)
    disk = _disk_dir(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    text = _read(disk / "inflight") if disk is not None else None
    if not text or len(text.split()) != 2:
        return None
    reads, writes = text.split()
    return disk.name, int(reads), int(writes)


def pci_device_of(path: str) -> Path | None:
    """The PCI device (its /sys/devices directory) of the disk holding ``path``: the
    nearest PCI function above the disk in sysfs (an NVMe controller, a virtio device's
    function); None for RAM-backed and other targets with no disk on a PCI bus."""
    st = os.stat(path)
    disk = _disk_dir(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    if disk is None:
        return None
    for parent in [disk, *disk.parents]:
        if _PCI_FUNCTION.match(parent.name):
            return parent
    return None


_PCI_FUNCTION = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GT_PER_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def pci_link(device: Path) -> dict[str, Any]:
    """PCIe link of a PCI device directory: current/max speed and width, the generation the
    current speed means (a Gen5 drive in a Gen4 slot links at Gen4), and its NUMA node."""
    facts: dict[str, Any] = {}
    for key in ("current_link_speed", "current_link_width", "max_link_speed",
                "max_link_width", "numa_node"):
        value = read_text(device / key)
        if value is not None:
            facts[key] = value
    for which in ("current", "max"):
        speed = facts.get(f"{which}_link_speed", "").split(" ")[0]
        if speed in _GT_PER_GEN:
            facts[f"{which}_pcie_gen"] = _GT_PER_GEN[speed]
    return facts


def block_facts(disk: Path) -> dict[str, Any]:
    """Model, size and queue settings of one disk's sysfs directory."""
    facts: dict[str, Any] = {"device": disk.name}
    model = read_text(disk / "device" / "model")
    if model:
        facts["model"] = model
    sectors = read_text(disk / "size")
    if sectors:
        facts["device_size"] = int(sectors) * 512
    for key in ("logical_block_size", "physical_block_size", "rotational"):
        value = read_text(disk / "queue" / key)
        if value is not None:
            facts[key] = int(value)
    sched = read_text(disk / "queue" / "scheduler")
    if sched:
        chosen = [w[1:-1] for w in sched.split() if w.startswith("[")]
        facts["scheduler"] = chosen[0] if chosen else sched
    if disk.name.startswith("nvme"):
        # imported here: facts/nvme builds on this module's readers
        from gpufio.facts.nvme import nvme_facts

        facts.update(nvme_facts(disk))
    return facts


def ram_disk(disk: Path, depth: int = 0) -> str | None:
    """Why the disk at sysfs directory ``disk`` is memory (its name, or what it stacks on),
    or None: zram and brd, a loop device over a file on a RAM filesystem, an md or
    device-mapper device whose every member is memory."""
    name = disk.name
    if any(name.startswith(p) and name[len(p):].isdigit() for p in _RAM_DISKS):
        return name
    backing = read_text(disk / "loop" / "backing_file")
    if backing and depth < 4:
        why = ram_backing(backing, depth + 1)
        return f"{name} over {backing} ({why})" if why else None
    try:
        members = sorted((disk / "slaves").iterdir())
    except OSError:
        return None
    whys = [ram_disk(m.resolve(), depth + 1) for m in members] if depth < 4 else []
    return f"{name} over {', '.join(w for w in whys if w)}" if whys and all(whys) else None


def ram_backing(path: str, depth: int = 0) -> str | None:
    """Why ``path`` (a file or block device) lives in memory, or None if it does not."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    is_block = stat.S_ISBLK(st.st_mode)
    dev = st.st_rdev if is_block else st.st_dev
    if not is_block:
        fs = _fs_type(dev)
        if fs and fs[0] in RAM_FILESYSTEMS:
            return fs[0]
    disk = _disk_dir(dev)
    return ram_disk(disk, depth) if disk is not None else None


def path_facts(path: str) -> dict[str, Any]:
    """What gpufio reports about a target: its kind, backing device and filesystem, and
    whether it lives in memory (``ram_backed``, with the reason in ``ram_backing``)."""
    st = os.stat(path)
    is_block = stat.S_ISBLK(st.st_mode)
    facts: dict[str, Any] = {"kind": "block" if is_block else "file"}
    dev = st.st_rdev if is_block else st.st_dev
    if not is_block:
        fs = _fs_type(dev)
        if fs:
            facts["filesystem"], facts["mountpoint"] = fs
    disk = _disk_dir(dev)
    if disk is not None:
        facts.update(block_facts(disk))
    why = ram_backing(path)
    facts["ram_backed"] = why is not None
    if why:
        facts["ram_backing"] = why
    align = dio_alignment(path)
    if align:
        facts["dio_mem_align"], facts["dio_offset_align"] = align
    return facts
