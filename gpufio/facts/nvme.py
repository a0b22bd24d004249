"""NVMe facts of a namespace's block device, read from sysfs.

The kernel exports everything a result needs next to its numbers (identify data, the
namespace, the queues, the multipath topology) as sysfs attributes readable without root;
libnvme reads the same attributes to build its tree, and neither libnvme's Python bindings
(no wheel on PyPI) nor nvme-cli (a binary whose JSON changed between its 1.x and 2.x) are
there on most machines. docs/design/NVME-RIG.md says more.

Native multipath: a namespace shared by controllers shows as a head ``nvmeXnZ`` (its sysfs
``device`` is the subsystem) over hidden path disks ``nvmeXcYnZ``, one per controller. The
head has no PCIe link of its own: each path's controller has one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpufio.facts.device import pci_link, read_text

SYS_BLOCK = Path("/sys/block")
_HEAD = re.compile(r"^nvme(\d+)n(\d+)$")
_PATH = re.compile(r"^nvme(\d+)c(\d+)n(\d+)$")


def paths_of(head: Path, sys_block: Path = SYS_BLOCK) -> list[Path]:
    """The path disks (their ``sys_block`` entries) of multipath head ``head``, by the
    kernel's naming (nvmeXcYnZ under nvmeXnZ); empty for a disk that is no head."""
    m = _HEAD.match(head.name)
    if not m:
        return []
    x, z = m.groups()
    return sorted(p for p in sys_block.glob(f"nvme{x}c*n{z}") if _PATH.match(p.name))


def same_namespace(disk: Path, sys_block: Path = SYS_BLOCK) -> list[Path]:
    """The ``sys_block`` entries of every disk that is the namespace ``disk`` is: the head and
    its paths, and, with native multipath off, the other controllers' disks of a shared
    namespace (the same ``wwid``). ``disk`` itself for anything else."""
    wwid = read_text(disk / "wwid")
    if not disk.name.startswith("nvme") or not wwid:
        return [disk]
    return sorted(d for d in sys_block.glob("nvme*")
                  if d.name == disk.name or read_text(d / "wwid") == wwid)


def controller_facts(ctrl: Path) -> dict[str, Any]:
    """What one controller (its /sys/class/nvme directory) says: identity, queues, link."""
    facts: dict[str, Any] = {"controller": ctrl.name}
    for key, attr in (("model", "model"), ("serial", "serial"), ("firmware", "firmware_rev"),
                      ("transport", "transport"), ("controller_state", "state")):
        value = read_text(ctrl / attr)
        if value:
            facts[key] = value
    count = read_text(ctrl / "queue_count")
    if count and count.isdigit():
        facts["io_queues"] = int(count) - 1  # queue_count includes the admin queue
    pci = (ctrl / "device").resolve()
    if (pci / "current_link_speed").exists():
        facts["pci_address"] = pci.name
        facts.update(pci_link(pci))
        slot = pci_link(pci.parent)  # the port above: what the slot can do
        for key in ("max_link_speed", "max_link_width", "max_pcie_gen"):
            if key in slot:
                facts[f"slot_{key}"] = slot[key]
    return facts


def _queue_facts(disk: Path) -> dict[str, Any]:
    """Poll queues of the disk's request queue (only disks with one: not a head)."""
    poll = read_text(disk / "queue" / "io_poll")
    return {"poll_queues": poll == "1"} if poll in ("0", "1") else {}


def nvme_facts(disk: Path, sys_block: Path = SYS_BLOCK) -> dict[str, Any]:
    """The NVMe facts of namespace disk ``disk`` (a /sys/block directory): serial, firmware,
    namespace id, generic device, the controller's queues and PCIe link (the first path's
    for a multipath head) and, for a head, ``multipath``: its paths and their controllers."""
    facts: dict[str, Any] = {}
    nsid = read_text(disk / "nsid")
    if nsid and nsid.isdigit():
        facts["nsid"] = int(nsid)
    wwid = read_text(disk / "wwid")
    if wwid:
        facts["wwid"] = wwid
    m = _HEAD.match(disk.name)
    paths = paths_of(disk, sys_block)
    if m:
        facts["generic_device"] = f"ng{m.group(1)}n{m.group(2)}"
    if not paths:
        facts.update(controller_facts((disk / "device").resolve()))
        facts.update(_queue_facts(disk))
        return facts
    subsys = (disk / "device").resolve()
    per_path = []
    for p in paths:
        ctrl = controller_facts((p / "device").resolve())
        per_path.append({"path": p.name, **ctrl, **_queue_facts(p)})
    first = per_path[0]
    facts.update({k: v for k, v in first.items() if k != "path"})
    facts["multipath"] = {"head": disk.name, "subsystem": subsys.name,
                          "iopolicy": read_text(subsys / "iopolicy"),
                          "paths": per_path}
    return facts
