"""Facts about the storage behind a path, read from sysfs and mountinfo.

A benchmark number is only meaningful next to what produced it: drive model, logical block
size, scheduler, and for NVMe the PCIe link actually negotiated (a Gen5 drive in a Gen4 slot
is a Gen4 drive). Everything here is best effort: a missing sysfs file yields no key rather
than an error, since containers and virtual disks expose less.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from gpufio.native import libc


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
    return libc.dio_alignment(path)


def _mount(dev: int) -> tuple[str, str, str] | None:
    """(filesystem type, mount point, source) of the mount whose device number is ``dev``."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    text = read_text(Path("/proc/self/mountinfo")) or ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == want and " - " in line:
            after = line.split(" - ", 1)[1].split()
            return after[0], fields[4], after[1] if len(after) > 1 else ""
    return None


def fs_type(dev: int) -> tuple[str, str] | None:
    """(filesystem type, mount point) of the mount whose device number is ``dev``."""
    found = _mount(dev)
    return found[:2] if found else None


def mount_source(dev: int) -> str:
    """What the mount whose device number is ``dev`` was mounted from (a device path, a
    server's export, a FUSE daemon's name; '' where unknown)."""
    found = _mount(dev)
    return found[2] if found else ""


def disk_dir(dev: int) -> Path | None:
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
    disk = disk_dir(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    text = read_text(disk / "inflight") if disk is not None else None
    if not text or len(text.split()) != 2:
        return None
    reads, writes = text.split()
    return disk.name, int(reads), int(writes)


def poll_refusal(path: str) -> str | None:
    """Why I/O to ``path`` cannot be polled for completion (IORING_SETUP_IOPOLL), or None
    when it can: the disk under it must be a block device whose queue polls (its
    ``queue/io_poll`` attribute is 1; NVMe needs poll queues, nvme.poll_queues)."""
    st = os.stat(path)
    disk = disk_dir(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    if disk is None:
        return "it is not on a block device (polled I/O needs one)"
    value = read_text(disk / "queue" / "io_poll")
    if value is None:
        return f"{disk.name} has no queue/io_poll attribute"
    if value != "1":
        return f"{disk.name}'s queue does not poll (queue/io_poll = {value}; for NVMe, " \
               "load nvme with poll_queues > 0)"
    return None


def pci_device_of(path: str) -> Path | None:
    """The PCI device (its /sys/devices directory) of the disk holding ``path``: the
    nearest PCI function above the disk in sysfs (an NVMe controller, a virtio device's
    function); None for RAM-backed and other targets with no disk on a PCI bus."""
    st = os.stat(path)
    disk = disk_dir(st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
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


def path_facts(path: str, direct: bool = True, extents: bool = True) -> dict[str, Any]:
    """What gpufio reports about a target: its kind, backing device and filesystem, what its
    reads reach (``storage``: facts/storage, for reads of the whole target, with O_DIRECT
    when ``direct``, its holes looked for when ``extents``) and whether it lives in memory (``ram_backed``, with the kind of
    memory in ``ram_backing``)."""
    # imported here: facts/storage builds on this module's readers
    from gpufio.facts import storage

    st = os.stat(path)
    is_block = stat.S_ISBLK(st.st_mode)
    facts: dict[str, Any] = {"kind": "block" if is_block else "file"}
    dev = st.st_rdev if is_block else st.st_dev
    if not is_block:
        fs = fs_type(dev)
        if fs:
            facts["filesystem"], facts["mountpoint"] = fs
    disk = disk_dir(dev)
    if disk is not None:
        facts.update(block_facts(disk))
    found = storage.classify(path, direct=direct, extents=extents)
    facts["storage"] = found.as_dict()
    facts["ram_backed"] = found.kind in storage.RAM_KINDS
    if facts["ram_backed"]:
        facts["ram_backing"] = found.kind
    align = dio_alignment(path)
    if align:
        facts["dio_mem_align"], facts["dio_offset_align"] = align
    return facts
