"""The bam engine's host side in the NVMe rig (QEMU's emulated controllers, the emulated
IOMMU on): bring-up over vfio-pci, identify, queue pairs, PRP lists, reads and writes from
the CPU stand-in, teardown and the nvme driver's namespace afterwards. One guest script per
controller, TCG being slow (tests/bam_guest.py)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.nvme


@pytest.fixture(scope="module")
def host_side(nvme_rig) -> dict:
    """What tests/bam_guest.py saw on rig-gen4 (512-byte blocks)."""
    res = nvme_rig.run("modprobe vfio-pci && PYTHONPATH=. python3 tests/bam_guest.py rig-gen4",
                       timeout=900)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_bring_up_identifies_the_controller(host_side: dict) -> None:
    assert host_side["driver_during"] == "vfio-pci"
    assert host_side["block_device_during"] is False
    assert host_side["serial"] == "rig-gen4"
    assert host_side["ns"] == {"1": {"blocks": 2 * 1024 * 1024, "lba_bytes": 512}}
    assert [p[:2] for p in host_side["pairs"]] == [[1, 64], [2, 64]]


def test_prp_list_read_and_two_page_write(host_side: dict) -> None:
    assert host_side["prp_entries"] == 4
    assert host_side["read_status"] == 0 and host_side["read_ok"]
    assert host_side["write_status"] == 0
    # LBA Out of Range (generic status 0x80)
    assert host_side["past_end_status"] == 0x80


def test_given_back_to_nvme_and_reads(host_side: dict) -> None:
    assert host_side["driver_after"] == "nvme"
    assert host_side["write_read_back"] is True
    assert "no such PCI device" in host_side["refuse_missing"]
