"""NVMe facts (gpufio/facts/nvme.py) on fake sysfs trees: links as the kernel writes them (the
rig's QEMU reports 2.5 GT/s x1 behind any port, so distinct Gen4 and Gen5 links are checked
here), multipath heads and their paths, poll queues, and the namespaces that are one device."""

import os
from pathlib import Path

from gpufio.facts.device import block_facts
from gpufio.facts.nvme import nvme_facts, paths_of, same_namespace
from gpufio.results.load import setup_facts

PORT = "sys/devices/pci0000:00/0000:00:0{n}.0"


def write(root: Path, rel: str, files: dict[str, str]) -> Path:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text + "\n")
    return d


def link(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.relpath(target, at.parent))


def controller(root: Path, n: int, gen: str, slot_gen: str, serial: str, poll: str = "0"):
    """PCI port n, its NVMe function and controller nvme{n}: current link `gen` GT/s x4, can
    do 32 GT/s x4, in a slot that can do `slot_gen`."""
    port = write(root, PORT.format(n=n), {"max_link_speed": f"{slot_gen} GT/s PCIe",
                                          "max_link_width": "4"})
    fn = write(port, f"0000:0{n}:00.0", {"current_link_speed": f"{gen} GT/s PCIe",
                                         "current_link_width": "4",
                                         "max_link_speed": "32.0 GT/s PCIe",
                                         "max_link_width": "4", "numa_node": "1"})
    ctrl = write(fn, f"nvme/nvme{n}", {"model": "Fast SSD", "serial": serial,
                                       "firmware_rev": "FW1.2", "queue_count": "9",
                                       "state": "live", "transport": "pcie"})
    link(ctrl / "device", fn)
    return ctrl, poll


def namespace(root: Path, parent: Path, name: str, nsid: int, wwid: str, device: Path,
              poll: str | None = "0") -> Path:
    files = {"nsid": str(nsid), "wwid": wwid, "size": "2097152",
             "queue/logical_block_size": "4096"}
    if poll is not None:
        files["queue/io_poll"] = poll
    disk = write(parent, name, files)
    link(disk / "device", device)
    link(root / "sys/block" / name, disk)
    return root / "sys/block" / name


def test_plain_namespace_facts_and_links(tmp_path):
    ctrl, _ = controller(tmp_path, 1, "16.0", "16.0", "S4X1")
    disk = namespace(tmp_path, ctrl, "nvme1n1", 1, "eui.0011", ctrl, poll="1")
    f = nvme_facts(disk, disk.parent)
    assert f["serial"] == "S4X1" and f["firmware"] == "FW1.2" and f["nsid"] == 1
    assert (f["current_pcie_gen"], f["current_link_width"], f["max_pcie_gen"]) == (4, "4", 5)
    assert (f["slot_max_pcie_gen"], f["slot_max_link_width"]) == (4, "4")  # Gen5 drive, Gen4 slot
    assert f["numa_node"] == "1" and f["io_queues"] == 8 and f["poll_queues"] is True
    assert f["generic_device"] == "ng1n1" and f["pci_address"] == "0000:01:00.0"
    assert "multipath" not in f
    full = block_facts(disk.resolve())
    assert full["logical_block_size"] == 4096 and full["serial"] == "S4X1"


def test_multipath_head_lists_paths_with_their_links(tmp_path):
    c2, _ = controller(tmp_path, 2, "32.0", "32.0", "MP1")
    c3, _ = controller(tmp_path, 3, "16.0", "16.0", "MP1")
    subsys = write(tmp_path, "sys/devices/virtual/nvme-subsystem/nvme-subsys2",
                   {"model": "Fast SSD", "iopolicy": "numa"})
    head = namespace(tmp_path, subsys, "nvme2n1", 1, "uuid.aa", subsys, poll=None)
    p1 = namespace(tmp_path, c2, "nvme2c2n1", 1, "uuid.aa", c2)
    namespace(tmp_path, c3, "nvme2c3n1", 1, "uuid.aa", c3)
    blocks = head.parent
    assert [p.name for p in paths_of(head, blocks)] == ["nvme2c2n1", "nvme2c3n1"]
    assert paths_of(p1, blocks) == []
    f = nvme_facts(head.resolve(), blocks)  # as block_facts finds it: under the subsystem
    mp = f["multipath"]
    assert (mp["head"], mp["subsystem"], mp["iopolicy"]) == ("nvme2n1", "nvme-subsys2", "numa")
    assert [(p["path"], p["controller"], p["current_pcie_gen"]) for p in mp["paths"]] == [
        ("nvme2c2n1", "nvme2", 5), ("nvme2c3n1", "nvme3", 4)]
    assert f["current_pcie_gen"] == 5 and f["serial"] == "MP1" and f["poll_queues"] is False
    assert [d.name for d in same_namespace(p1, blocks)] == ["nvme2c2n1", "nvme2c3n1", "nvme2n1"]


def test_shared_namespace_without_native_multipath_is_one_device(tmp_path):
    """nvme_core multipath=N: each controller shows its own disk of the shared namespace."""
    c4, _ = controller(tmp_path, 4, "16.0", "16.0", "SH")
    c5, _ = controller(tmp_path, 5, "16.0", "16.0", "SH")
    a = namespace(tmp_path, c4, "nvme4n1", 1, "nvme.1b36-5348-01", c4)
    b = namespace(tmp_path, c5, "nvme5n1", 1, "nvme.1b36-5348-01", c5)
    other = namespace(tmp_path, c5, "nvme5n2", 2, "nvme.1b36-5348-02", c5)
    blocks = a.parent
    assert [d.name for d in same_namespace(a, blocks)] == ["nvme4n1", "nvme5n1"]
    assert same_namespace(b, blocks) == same_namespace(a, blocks)
    assert same_namespace(other, blocks) == [other]


def test_compare_header_names_each_drive_link():
    doc = {"host": {}, "jobs": [{"targets": [
        {"path": "/dev/nvme0n1", "model": "A", "current_pcie_gen": 4, "current_link_width": "4"},
        {"path": "/dev/nvme1n1", "model": "B", "current_pcie_gen": 5, "current_link_width": "4"}]}]}
    assert setup_facts(doc)["targets"] == "/dev/nvme0n1 (A Gen4x4); /dev/nvme1n1 (B Gen5x4)"


def test_guard_checks_every_name_of_the_device(tmp_path):
    """A partition seen through the multipath head refuses writes through a path."""
    import pytest

    from gpufio.core.errors import BadInput
    from gpufio.core.guard import check_names_free

    c, _ = controller(tmp_path, 6, "16.0", "16.0", "G")
    head = namespace(tmp_path, c, "nvme6n1", 1, "uuid.g", c)
    path = namespace(tmp_path, c, "nvme6c6n1", 1, "uuid.g", c)
    check_names_free("/dev/nvme6c6n1", [head, path])  # nothing in use: no error
    write(head.resolve(), "nvme6n1p1", {"partition": "1"})
    with pytest.raises(BadInput, match=r"nvme6c6n1: has partitions \(nvme6n1p1\) \(through "
                                       r"nvme6n1, the same device\)"):
        check_names_free("/dev/nvme6c6n1", same_namespace(path, path.parent))


def test_doctor_nvme_checks_both_ways(tmp_path):
    from gpufio.facts.system import Host
    from gpufio.doctor import nvme_checks

    write(tmp_path, "sys/module/nvme_core/parameters", {"multipath": "Y"})
    write(tmp_path, "sys/module/nvme/parameters", {"poll_queues": "0"})
    group = write(tmp_path, "sys/kernel/iommu_groups/7/devices", {})
    fn = write(tmp_path, "sys/bus/pci/devices/0000:01:00.0", {})
    link(fn / "iommu_group", group.parent)
    link(group / "0000:01:00.0", fn)
    facts = {"nsid": 1, "pci_address": "0000:01:00.0", "poll_queues": False,
             "multipath": {"head": "nvme2n1", "paths": [{"path": "nvme2c2n1"}]}}
    checks = {c.name: c for c in nvme_checks("t", facts, Host(str(tmp_path)))}
    assert checks["NVMe multipath"].found == "nvme_core multipath=Y; head nvme2n1 over nvme2c2n1"
    assert checks["NVMe poll queues"].status == "warn" and "poll_queues=N" in checks[
        "NVMe poll queues"].fix
    assert checks["IOMMU group"].found == "group 7: 0000:01:00.0 (alone: vfio-pci can take it)"
    facts.update(poll_queues=True, pci_address="0000:09:00.0")
    checks = {c.name: c for c in nvme_checks("t", facts, Host(str(tmp_path)))}
    assert checks["NVMe poll queues"].status == "ok"
    assert checks["IOMMU group"].found == "none (no IOMMU, or it is off)"
