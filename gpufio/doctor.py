"""``gpufio doctor``: every check that explains a number before it is measured.

Each engine checks what its path needs (``Engine.doctor``: cuFile's mode and why, io_uring for
GPU-initiated I/O, MPS for spawned workers); here the targets are checked (RAM-backed or a
drive, O_DIRECT alignment, scheduler and queue limits, the drive's PCIe link against what it
can do, and where it sits against each GPU in the PCIe tree; a profile's scratch directory
where its jobs name no targets), and the GPUs' own links. A host without a GPU says so in
the headline, and its GPU engines get a line of what runs here instead of their checks.
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from gpufio.core import targets as tg
from gpufio.core.checks import FAIL, OK, WARN, Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.core.targets import check_creatable
from gpufio.engines import all_engines
from gpufio.engines.base import Engine
from gpufio.facts.device import path_facts, pci_device_of, pci_link, read_int
from gpufio.facts.system import ACS_REDIRECTS, Host, acs_control, bar_size, pci_relation


def _link(facts: dict) -> str:
    return (f"Gen{facts.get('current_pcie_gen', '?')} x{facts.get('current_link_width', '?')} "
            f"(can do Gen{facts.get('max_pcie_gen', '?')} x{facts.get('max_link_width', '?')})")


def link_check(area: str, name: str, facts: dict) -> Check:
    """A PCIe link at its best speed and width, or a warning that it trained lower."""
    full = (facts.get("current_pcie_gen") == facts.get("max_pcie_gen")
            and facts.get("current_link_width") == facts.get("max_link_width"))
    return verdict(area, name, full, _link(facts),
                   "the link trained below what the device can do: check the slot, riser and "
                   "BIOS link settings")


def gpu_checks(host: Host) -> tuple[list[Check], dict[str, Path]]:
    """Each GPU's PCIe link, and where each GPU sits in the device tree."""
    out, places = [], {}
    for addr in host.gpu_pci_devices():
        place = host.pci_path(addr)
        if place is None:
            continue
        places[addr] = place
        out.append(link_check("gpu", f"GPU {addr} PCIe link", pci_link(place)))
        bar1 = bar_size(place, 1)
        if bar1 is not None:
            out.append(Check("gpu", f"GPU {addr} BAR1", OK, f"{bar1 / 2**30:g} GiB (the window "
                             "peer devices, GDS and P2PDMA among them, write GPU memory "
                             "through)"))
        out.append(acs_check(place))
    return out, places


def acs_check(device: Path) -> Check:
    """Whether a bridge above ``device`` redirects peer-to-peer traffic to the root complex
    (ACS): GPUDirect between a drive and a GPU under one switch then crosses the root."""
    redirecting = []
    for bridge in device.parents:
        if not bridge.name.count(":") == 2:  # PCI addresses only (0000:00:01.0)
            break
        control = acs_control(bridge)
        if control:
            what = [name for bit, name in ACS_REDIRECTS.items() if control & bit]
            if what:
                redirecting.append(f"{bridge.name}: {', '.join(what)}")
    return verdict("gpu", f"ACS above GPU {device.name}", not redirecting,
                   "; ".join(redirecting) or "no bridge redirects peer-to-peer traffic",
                   "peer-to-peer transfers go up to the root complex: disable ACS redirection on "
                   "those bridges (BIOS, or setpci) where the platform allows it")


def nvme_checks(area: str, facts: dict, host: Host) -> list[Check]:
    """An NVMe namespace: native multipath (and a head's paths), the controller's poll queues
    and its IOMMU group."""
    multipath = host.module_param("nvme_core", "multipath")
    mp = facts.get("multipath")
    found = f"nvme_core multipath={multipath or '?'}" + (
        f"; head {mp['head']} over {', '.join(p['path'] for p in mp['paths'])}" if mp else "")
    out = [Check(area, "NVMe multipath", OK, found)]
    polls = host.module_param("nvme", "poll_queues")
    out.append(verdict(area, "NVMe poll queues", bool(facts.get("poll_queues")),
                       f"{'present' if facts.get('poll_queues') else 'none'} (nvme.poll_queues="
                       f"{polls or '?'} when the controller was reset)",
                       "polled I/O (hipri, IOPOLL) needs them: load nvme with poll_queues=N "
                       "(or nvme.poll_queues=N on the kernel command line)"))
    addr = facts.get("pci_address")
    group = Path(host.root, "sys/bus/pci/devices", addr, "iommu_group") if addr else None
    if group is not None and group.exists():
        members = sorted(p.name for p in (group.resolve() / "devices").iterdir())
        out.append(Check(area, "IOMMU group", OK, f"group {group.resolve().name}: "
                         f"{', '.join(members)}" + (" (alone: vfio-pci can take it)"
                                                    if members == [addr] else "")))
    elif addr:
        out.append(Check(area, "IOMMU group", OK, "none (no IOMMU, or it is off)"))
    return out


def target_checks(path: str, depth: int | None, gpus: dict[str, Path],
                  of_a_job: bool = False, host: Host | None = None) -> list[Check]:
    """A target: what its reads reach (a drive, RAM, holes ...), its O_DIRECT alignment, scheduler, queue limit, PCIe link,
    NVMe facts and its place against each GPU; ``depth``: the most I/Os the jobs keep in
    flight on it (None: no job reads it, the target alone is described). ``of_a_job``: a
    path a profile's job reads or writes, which its run (or ``gpufio prepare``) may still
    lay out: missing, it is a warning where a file may be created."""
    area = f"target {path}"
    try:
        facts = path_facts(path)
    except OSError as e:
        if of_a_job and e.errno == errno.ENOENT:
            try:
                check_creatable(path)
            except BadInput as why:
                return [Check(area, "exists", FAIL, str(why), "name an existing file, "
                              "block device or directory")]
            return [Check(area, "exists", WARN, "not laid out yet", "gpufio prepare PROFILE "
                          "lays it out (the run does otherwise, where the job gives a size)")]
        return [Check(area, "exists", FAIL, e.strerror or str(e),
                      "name an existing file or block device (gpufio creates files only "
                      "where a profile gives a size)")]
    found = facts["storage"]  # the whole target, its holes included
    out = [verdict(area, "storage", found["reaches_storage"],
                   f"{found['kind']}: {found['reason']}",
                   "its reads do not reach a drive, so its numbers say nothing about one: "
                   "point the target at a drive (a file: write it first)")]
    align = facts.get("dio_offset_align") or facts.get("logical_block_size")
    out.append(Check(area, "O_DIRECT alignment", OK if align else WARN,
                     f"{align} bytes" if align else "unknown (no O_DIRECT here?)",
                     "" if align else "set direct = false where the filesystem has no O_DIRECT"))
    if "scheduler" in facts:
        nvme = facts.get("device", "").startswith("nvme")
        out.append(verdict(area, "I/O scheduler", not nvme or facts["scheduler"] == "none",
                           facts["scheduler"], "NVMe needs no scheduler: echo none > "
                           f"/sys/block/{facts.get('device')}/queue/scheduler"))
    disk = facts.get("device")
    limit = read_int(f"/sys/block/{disk}/queue/nr_requests") if disk else None
    if limit is not None and depth is None:
        out.append(Check(area, "queue depth limit", OK, f"nr_requests {limit}: the block layer "
                         f"queues up to {limit} requests for {disk} (doctor PROFILE checks "
                         "its jobs' depth against it)"))
    elif limit is not None:
        out.append(verdict(area, "queue depth limit", depth <= limit,
                           f"nr_requests {limit}, jobs keep up to {depth} in flight",
                           f"raise /sys/block/{disk}/queue/nr_requests to {depth} or more"))
    if "current_pcie_gen" in facts:
        out.append(link_check(area, "drive PCIe link", facts))
    if "nsid" in facts:
        out += nvme_checks(area, facts, host or Host())
    # the PCI function the disk hangs below (NVMe controller, virtio or SCSI adapter)
    place = pci_device_of(path) if gpus and not facts.get("ram_backed") else None
    if place is not None:
        for addr, gpu_place in gpus.items():
            out.append(Check(area, f"PCIe path to GPU {addr}", OK,
                             f"{pci_relation(place, gpu_place)} (the disk's PCI function "
                             f"{place.name})"))
    return out


NO_GPU = "no GPU on this host: the GPU paths' checks are skipped"


def headline(host: Host | None = None) -> str:
    """What the whole report stands under ('' when nothing does): a host without a GPU."""
    return "" if (host or Host()).has_gpu() else NO_GPU


def needs_gpu(engine: type[Engine], job: Job) -> bool:
    """The job's data lands in GPU memory: a GPU engine, unless the job keeps its data in
    host memory (device = "cpu") and the engine moves it there."""
    host_side = bool(set(engine.host_memory()) - {"block"})
    return engine.uses_gpu and not (host_side and job.workload_options.get("device") == "cpu")


def without_gpu(engine: type[Engine], jobs: list[Job]) -> list[Check]:
    """A GPU engine on a host without a GPU: what of it runs here, in place of its checks
    (its driver and cuFile settings would be advice for a GPU that is not there)."""
    area = engine.name
    here = [w for w in engine.host_memory() if w != "block"]
    elsewhere = (f"here it moves {' and '.join(here)} in host memory (device = \"cpu\")"
                 if here else "it needs one")
    if not jobs:
        return [Check(area, "GPU", WARN, f"none on this host: {elsewhere}",
                      "run its GPU jobs on a host with an NVIDIA GPU")]
    return [verdict(area, f"GPU for job '{j.name}'", not needs_gpu(engine, j),
                    "none needed: device = \"cpu\"" if not needs_gpu(engine, j)
                    else f"none on this host; {elsewhere}",
                    "run it on a host with an NVIDIA GPU" +
                    (", or set device = \"cpu\"" if here else ""), bad=FAIL)
            for j in jobs]


def _existing(path: str) -> str:
    """``path``, or the nearest directory above it that exists (where it will be created)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return str(p)


def _depth(job: Job) -> int:
    """The I/Os a job keeps in flight on a target: iodepth per worker; a job whose engine
    picks its depth when it runs (iodepth None: GNN rows) is judged at one per worker."""
    return (job.iodepth or 1) * job.numjobs


def scratch_checks(jobs: list[Job], places: dict[str, Path],
                   checked: Iterable[str] = ()) -> list[Check]:
    """The scratch directory of the jobs that name no targets (the run creates their files
    there): the same checks as a target's, on the directory or the nearest one that exists,
    unless files in it that exist are ``checked`` as targets already (their rows say the
    same; a file not laid out yet gets only its "exists" row, so the directory's stay)."""
    inside = {os.path.dirname(p) for p in (os.path.abspath(os.path.expanduser(t))
                                           for t in checked) if os.path.exists(p)}
    depths: dict[str, int] = {}
    for j in jobs:
        if not j.targets:
            where = j.directory or tg.default_scratch_dir()
            depths[where] = max(depths.get(where, 0), _depth(j))
    out = []
    for where, depth in depths.items():
        area, at = f"scratch {where}", _existing(where)
        out.append(Check(area, "scratch target", OK, "the run creates its files here (the "
                         "profile names no targets)" + (f"; checked at {at}, which exists"
                                                        if at != os.path.abspath(where) else "")))
        if os.path.abspath(where) not in inside:
            out += [replace(c, area=area) for c in target_checks(at, depth, places)]
    return out


def diagnose(jobs: list[Job], targets: list[str], host: Host | None = None,
             paths: Callable[[Job], list[str]] | None = None) -> list[Check]:
    """Every check for ``jobs`` (a profile's; none: every engine in general) and their
    targets plus ``targets``; ``paths``: where a job reads and writes (its workload's
    answer, scratch files included; by default its ``targets``); a host without a GPU gets
    no GPU engine's checks, one line per GPU engine instead."""
    host = host or Host()
    gpu_less = not host.has_gpu()
    engines = all_engines()
    used = list(dict.fromkeys(j.engine for j in jobs)) if jobs else list(engines)
    out: list[Check] = []
    for name in used:
        mine = [j for j in jobs if j.engine == name]
        engine = engines[name]
        out += without_gpu(engine, mine) if gpu_less and engine.uses_gpu \
            else engine.doctor(host, mine)
    gpus, places = gpu_checks(host)
    out += gpus
    depths: dict[str, int | None] = {}
    given = set(targets)
    for j in jobs:
        for t in (paths(j) if paths is not None else j.targets):
            depths[t] = max(depths.get(t) or 0, _depth(j))
    for t in targets:
        depths.setdefault(t, None)  # named on the command line, no job of the profile on it
    for t, depth in depths.items():
        out += target_checks(os.path.expanduser(t), depth, places, of_a_job=t not in given,
                             host=host)
    return out + scratch_checks(jobs, places, depths)
