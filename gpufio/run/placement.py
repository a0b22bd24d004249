"""Where a job's GPU workers run and what they read: each GPU's targets (``gpu_targets``:
all, the nearest by PCIe topology, or the profile's table) and the CPUs of each GPU's NUMA
node, which its spawned workers are pinned to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpufio.core.job import Job
from gpufio.core.targets import Target
from gpufio.facts.device import pci_device_of
from gpufio.facts.system import parse_cpulist, pci_relation

# pci_relation's answers, nearest first
NEARNESS = ("same PCIe switch", "same root port", "same root complex, other root ports",
            "across root complexes")


def _facts_of(gpu_facts: list[dict[str, Any]], gpu: int) -> dict[str, Any]:
    return next((g for g in gpu_facts if g.get("index") == gpu), {})


def gpu_cpus(gpu_facts: list[dict[str, Any]], gpu: int) -> list[int]:
    """The CPUs of GPU ``gpu``'s NUMA node this process may use ([] when unknown, or when
    none of them is allowed: the worker is then left where the kernel puts it)."""
    local = parse_cpulist(_facts_of(gpu_facts, gpu).get("local_cpulist", ""))
    return sorted(local & os.sched_getaffinity(0))


def target_sets(job: Job, targets: list[Target], gpu_facts: list[dict[str, Any]],
                pci_devices: Path = Path("/sys/bus/pci/devices")
                ) -> tuple[dict[int, tuple[int, ...]] | None, dict[str, Any]]:
    """Each of the job's GPUs' target indexes (None: every worker reads every target) and
    the facts for the result: which paths each GPU reads and, for "nearest", why."""
    if job.gpu_targets == "all":
        return None, {}
    index = {t.path: i for i, t in enumerate(targets)}
    facts: dict[str, Any] = {}
    if isinstance(job.gpu_targets, tuple):
        sets = {g: tuple(index[p] for p in paths) for g, paths in job.gpu_targets}
    else:
        sets, why = {}, {}
        devs = [pci_device_of(t.path) for t in targets]
        for g in job.gpu_list:
            bus = _facts_of(gpu_facts, g).get("pci_bus_id")
            place = (pci_devices / bus.lower()).resolve() if bus else None
            ranks = []
            for t, dev in zip(targets, devs):
                rel = pci_relation(dev, place) if dev is not None and place is not None else None
                why.setdefault(str(g), {})[t.path] = rel or "unknown"
                ranks.append(NEARNESS.index(rel) if rel in NEARNESS else len(NEARNESS))
            best = min(ranks)
            sets[g] = tuple(i for i, r in enumerate(ranks) if r == best)
        facts["pcie_relation"] = why
    facts["gpu_targets"] = {str(g): [targets[i].path for i in s] for g, s in sorted(sets.items())}
    return sets, facts
