"""Where a job's GPU workers run and what they read, on fake PCIe trees: gpu_targets (all,
nearest by PCIe topology, a table), the NUMA node's CPUs, NVML's facts when it is there."""

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpufio.core.errors import BadInput
from gpufio.core.offsets import OffsetStream
from gpufio.facts.system import parse_cpulist
from gpufio.io import gpu
from gpufio.profile import from_dict
from gpufio.run import placement


def _job(**g):
    return from_dict({"global": {"engine": "cpu-gpu", **g}}, "p.toml", {}).jobs[0]


def test_cpulists_and_the_gpus_allowed_cpus(monkeypatch):
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    facts = [{"index": 0, "local_cpulist": "2-7"}, {"index": 1, "local_cpulist": "8-9"}]
    assert placement.gpu_cpus(facts, 0) == [2, 3, 4]
    assert placement.gpu_cpus(facts, 1) == []  # none allowed: left where the kernel puts it
    assert placement.gpu_cpus(facts, 5) == []


def test_a_table_of_gpu_targets_is_checked_and_kept():
    job = _job(targets=["/a", "/b", "/c"], gpus=[0, 1], gpu_targets={"0": ["/a"], "1": ["/b", "/c"]})
    targets = [SimpleNamespace(path=p) for p in ("/a", "/b", "/c")]
    sets, facts = placement.target_sets(job, targets, [])
    assert sets == {0: (0,), 1: (1, 2)} and facts["gpu_targets"] == {"0": ["/a"], "1": ["/b", "/c"]}
    assert placement.target_sets(_job(targets=["/a"]), targets[:1], []) == (None, {})


@pytest.mark.parametrize("table,msg", [
    ({"3": ["/a"]}, "GPU 3 is not one of the job's GPUs"),
    ({"0": ["/z"]}, "/z \\(GPU 0\\) is not one of the job's targets"),
    ({"x": ["/a"]}, "'x' is not a GPU index"),
])
def test_bad_gpu_targets_are_one_line(table, msg):
    with pytest.raises(BadInput, match=msg):
        _job(targets=["/a", "/b"], gpus=[0, 1], gpu_targets=table)
    with pytest.raises(BadInput, match="GPU 1 reads no target"):
        _job(targets=["/a", "/b"], gpus=[0, 1], gpu_targets={"0": ["/a"]})


def test_nearest_targets_by_pcie_topology(tmp_path, monkeypatch):
    dev = tmp_path / "devices"
    switch = dev / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    gpu_dir, near = switch / "0000:02:00.0", switch / "0000:02:01.0"
    far = dev / "pci0000:80" / "0000:80:01.0" / "0000:81:00.0"
    for d in (gpu_dir, near, far):
        d.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:02:00.0").symlink_to(gpu_dir)
    where = {"/near": near, "/far": far, "/ram": None}
    monkeypatch.setattr(placement, "pci_device_of", lambda p: where[p])
    targets = [SimpleNamespace(path=p) for p in ("/far", "/near", "/ram")]
    job = _job(targets=["/far", "/near", "/ram"], gpu_targets="nearest")
    sets, facts = placement.target_sets(job, targets, [{"index": 0, "pci_bus_id": "0000:02:00.0"}],
                                        pci_devices=bus)
    assert sets == {0: (1,)} and facts["gpu_targets"] == {"0": ["/near"]}
    assert facts["pcie_relation"]["0"] == {"/far": "across root complexes",
                                           "/near": "same PCIe switch", "/ram": "unknown"}
    # where nothing is known, every target is as near as any other
    monkeypatch.setattr(placement, "pci_device_of", lambda p: None)
    assert placement.target_sets(job, targets, [], pci_devices=bus)[0] == {0: (0, 1, 2)}


def test_a_workers_stream_reads_only_its_gpus_targets():
    dist = _job().random_distribution
    for service in ("roundrobin", "random"):
        s = OffsetStream(random=True, bs=4096, regions=[(0, 64)] * 4, dist=dist,
                         file_service=service, seed=(1,), budget=None, subset=(1, 3))
        tgt, offs = s.next(1000)
        assert set(np.unique(tgt).tolist()) == {1, 3} and (offs < 64 * 4096).all()


def test_a_targets_pci_device_is_a_pci_function_or_none(tmp_path):
    import re

    from gpufio.facts.device import pci_device_of

    found = pci_device_of(str(tmp_path))
    assert found is None or re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", found.name)


def test_without_nvml_the_gpu_facts_are_sysfs_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu.nvml_facts(["0000:01:00.0", "0000:02:00.0"]) == [{}, {}]


def test_nvml_facts_read_links_affinity_and_peers(monkeypatch):
    class Fake:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetHandleByPciBusId(self, b): return b
        def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return 5
        def nvmlDeviceGetCurrPcieLinkWidth(self, h): return 16
        def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return 5
        def nvmlDeviceGetMaxPcieLinkWidth(self, h): return 16
        def nvmlDeviceGetCpuAffinity(self, h, n): return [0b1011] + [0] * (n - 1)
        def nvmlDeviceGetTopologyCommonAncestor(self, a, b): return 50

    monkeypatch.setitem(sys.modules, "pynvml", Fake())
    a, b = gpu.nvml_facts(["A", "B"])
    assert a == {"link_gen": 5, "link_width": 16, "max_link_gen": 5, "max_link_width": 16,
                 "cpu_affinity": [0, 1, 3], "to_gpus": {"1": "across sockets"}}
    assert b["to_gpus"] == {"0": "across sockets"}
