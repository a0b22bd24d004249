"""A user-space NVMe driver over vfio-pci: a controller taken from the kernel's nvme driver,
reset and enabled with an admin queue in DMA-mapped host memory, identified, given polled
I/O queue pairs, shut down (CC.SHN) and handed back to the nvme driver.

Every entry and register comes from io/nvme/spec.py. A ``QueuePair`` is the whole state of
one I/O queue pair (its SQ and CQ memory, bus addresses, doorbell offsets, tail, head and
phase), so whoever drives it next, the CPU stand-in here or GPU threads, takes one object.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core.checks import FAIL, OK, WARN, Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.guard import check_not_in_use
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme import vfio
from gpufio.io.nvme.guardian import Guard

if TYPE_CHECKING:
    from gpufio.facts.system import Host

ADMIN_DEPTH = 32
ADMIN_TIMEOUT_S = 10.0
REPROBE_S = 30.0  # how long the nvme driver may take to show the namespaces again


class ControllerError(RuntimeError):
    """The controller failed a command, went fatal (CSTS.CFS) or did not get ready."""


def namespaces_of(bdf: str, sys_pci: Path = vfio.SYS_PCI) -> list[str]:
    """The block devices (/dev/nvmeXnY) of the namespaces of the nvme controller at
    ``bdf``, while the nvme driver holds it."""
    out = []
    for ctrl in sorted((sys_pci / "devices" / bdf / "nvme").glob("nvme*")):
        out += [f"/dev/{d.name}" for d in sorted(ctrl.glob(f"{ctrl.name}n*"))
                if (d / "dev").exists() and "p" not in d.name[len(ctrl.name):]]
        # the multipath heads of a subsystem sit beside its controllers
        for ns in sorted(ctrl.glob("ng*")):
            head = f"/dev/nvme{ctrl.name[4:]}n{ns.name.rsplit('n', 1)[1]}"
            if os.path.exists(head) and head not in out:
                out.append(head)
    return out


@dataclass
class Taken:
    """A controller bound to vfio-pci by gpufio: the driver to give it back to."""

    bdf: str
    driver: str | None
    namespaces: int = 0  # block devices it had on the nvme driver

    def give_back(self, sys_pci: Path = vfio.SYS_PCI) -> None:
        """Bind it to its driver again and wait (bounded) until the nvme driver, which
        probes in the background, has its namespaces in /dev again, so that what runs next
        finds them."""
        vfio.bind(self.bdf, self.driver, sys_pci)
        deadline = time.monotonic() + REPROBE_S
        while self.driver == "nvme" and time.monotonic() < deadline:
            found = [ns for ns in namespaces_of(self.bdf, sys_pci) if os.path.exists(ns)]
            if len(found) >= self.namespaces:
                return
            time.sleep(0.05)


def take(bdf: str, *, writes: bool, sys_pci: Path = vfio.SYS_PCI) -> Taken:
    """Move controller ``bdf`` to vfio-pci (one already there stays), after the refusals:
    no namespace mounted or held, no other device of its IOMMU group in use. ``writes``
    says the job's write guard has already passed for the namespace it writes."""
    if not (sys_pci / "devices" / bdf).exists():
        raise BadInput(f"controller {bdf}: no such PCI device")
    vfio.check_group_alone(bdf, sys_pci)
    driver = vfio.driver_of(bdf, sys_pci)
    if driver == "vfio-pci":
        return Taken(bdf, "vfio-pci")
    held = namespaces_of(bdf, sys_pci)
    for ns in held:
        check_not_in_use(ns)
    if not (sys_pci / "drivers" / "vfio-pci").exists():
        raise BadInput(f"controller {bdf}: the vfio-pci driver is not loaded "
                       "(modprobe vfio-pci)")
    vfio.bind(bdf, "vfio-pci", sys_pci)
    return Taken(bdf, driver, len(held))


@dataclass
class QueuePair:
    """One polled I/O queue pair in DMA-mapped host memory: everything a submitter needs.
    ``sq``/``cq`` are the entries as arrays (SQE_DTYPE, CQE_DTYPE) over the memory the
    controller reads and writes, ``sq_iova``/``cq_iova`` their bus addresses, ``sq_db``/
    ``cq_db`` the doorbells' offsets in BAR0."""

    qid: int
    depth: int
    sq: np.ndarray
    cq: np.ndarray
    sq_iova: int
    cq_iova: int
    sq_db: int
    cq_db: int
    bar: vfio.Bar
    tail: int = 0
    head: int = 0
    phase: int = 1
    inflight: int = field(default=0)

    @property
    def entries(self) -> int:
        """The SQ's and the CQ's entries (what the GPU side calls them)."""
        return self.depth

    def space(self) -> int:
        """Free SQ slots (one stays empty: a full ring would look empty)."""
        return self.depth - 1 - self.inflight

    def submit(self, entries: np.ndarray) -> None:
        """The CPU stand-in's submission: write ``entries`` at the tail, ring the SQ
        doorbell once."""
        n = len(entries)
        idx = (self.tail + np.arange(n)) % self.depth
        self.sq[idx] = entries
        self.tail = (self.tail + n) % self.depth
        self.inflight += n
        self.bar.w32(self.sq_db, self.tail)

    def reap(self) -> tuple[np.ndarray, np.ndarray]:
        """Completions posted since the last reap, by phase tag: (cid, status field); the
        CQ head doorbell is rung once for them."""
        cids, status = [], []
        while True:
            e = self.cq[self.head]
            st = int(e["status"])
            if st & 1 != self.phase:
                break
            cids.append(int(e["cid"]))
            status.append(st)
            self.head += 1
            if self.head == self.depth:
                self.head, self.phase = 0, self.phase ^ 1
        if cids:
            self.inflight -= len(cids)
            self.bar.w32(self.cq_db, self.head)
        return np.array(cids, np.int64), np.array(status, np.int64)


class Controller:
    """An NVMe controller over vfio-pci, enabled with an admin queue."""

    def __init__(self, device: vfio.Device) -> None:
        self.device = device
        self.bar = device.bar0
        self.cap = nq.cap_fields(self.bar.r64(nq.REG_CAP))
        self._cid = 0
        self.pairs: list[QueuePair] = []
        device.bus_master(True)
        self._disable()
        self._scratch = device.memory(nq.PAGE)
        self.admin = self._queue_pair(0, ADMIN_DEPTH)
        self.bar.w32(nq.REG_AQA, (ADMIN_DEPTH - 1) << 16 | (ADMIN_DEPTH - 1))
        for reg, iova in ((nq.REG_ASQ, self.admin.sq_iova), (nq.REG_ACQ, self.admin.cq_iova)):
            self.bar.w32(reg, iova & 0xFFFFFFFF)  # two 32-bit halves: QEMU takes no 64-bit
            self.bar.w32(reg + 4, iova >> 32)
        self.bar.w32(nq.REG_CC, nq.CC_ENABLE)
        self._wait_ready(1)

    def _wait_ready(self, want: int) -> None:
        deadline = time.monotonic() + max(self.cap["timeout"], 1) * 0.5 + 5
        while (self.bar.r32(nq.REG_CSTS) & nq.CSTS_RDY) != want:
            if self.bar.r32(nq.REG_CSTS) & nq.CSTS_CFS:
                raise ControllerError(f"controller {self.device.bdf}: fatal status (CSTS.CFS)")
            if time.monotonic() > deadline:
                raise ControllerError(f"controller {self.device.bdf}: CSTS.RDY did not "
                                      f"become {want}")
            time.sleep(0.001)

    def _disable(self) -> None:
        if self.bar.r32(nq.REG_CC) & nq.CC_EN:
            self.bar.w32(nq.REG_CC, 0)
        self._wait_ready(0)

    def _queue_pair(self, qid: int, depth: int) -> QueuePair:
        sq_mem = self.device.memory(depth * nq.SQE_BYTES)
        cq_mem = self.device.memory(depth * nq.CQE_BYTES)
        return QueuePair(qid, depth,
                         np.frombuffer(sq_mem.map, nq.SQE_DTYPE, depth),
                         np.frombuffer(cq_mem.map, nq.CQE_DTYPE, depth),
                         sq_mem.iova, cq_mem.iova, nq.doorbell(qid, False, self.cap["dstrd"]),
                         nq.doorbell(qid, True, self.cap["dstrd"]), self.bar)

    def command(self, build, *args, **kw) -> int:  # type: ignore[no-untyped-def]
        """Send one admin command (``build(cid, ...)``, a builder of io/nvme/spec.py) and wait
        for it; its result dword, or ControllerError naming the failing status."""
        self._cid = (self._cid + 1) & 0xFFFF
        entry = build(self._cid, *args, **kw)
        self.admin.submit(entry)
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            head = self.admin.head
            cids, status = self.admin.reap()
            if len(cids):
                break
            if time.monotonic() > deadline:
                raise ControllerError(f"controller {self.device.bdf}: no completion of admin "
                                      f"opcode {int(entry['opcode'][0]):#x}")
        e = self.admin.cq[head]
        st = int(nq.status_of(status[0]))
        if st or cids[0] != self._cid:
            raise ControllerError(f"controller {self.device.bdf}: admin opcode "
                                  f"{int(entry['opcode'][0]):#x} failed: status {st:#x}")
        return int(e["result"])

    def identify(self) -> dict[str, object]:
        """Identify Controller and each active namespace (nsid -> blocks, lba_bytes)."""
        page = self._scratch
        self.command(nq.identify, nq.CNS_CONTROLLER, page.iova)
        info = nq.parse_controller(bytes(page.map[:nq.PAGE]))
        self.command(nq.identify, nq.CNS_ACTIVE_NSIDS, page.iova)
        nsids = [int(n) for n in np.frombuffer(page.map, "<u4", 1024) if n]
        spaces = {}
        for nsid in nsids:
            self.command(nq.identify, nq.CNS_NAMESPACE, page.iova, nsid=nsid)
            spaces[nsid] = nq.parse_namespace(bytes(page.map[:nq.PAGE]))
        info["ns"] = spaces
        mdts = int(info["mdts"])  # type: ignore[call-overload]
        info["max_transfer"] = self.cap["mpsmin"] << mdts if mdts else 0
        return info

    def create_pairs(self, count: int, depth: int) -> list[QueuePair]:
        """``count`` polled I/O queue pairs of ``depth`` entries (Set Features first; the
        controller may grant fewer, which is BadInput naming what it grants)."""
        if depth > self.cap["max_depth"] or depth < 2:
            raise BadInput(f"controller {self.device.bdf}: queue depth {depth} is outside "
                           f"2..{self.cap['max_depth']} (CAP.MQES + 1)")
        granted = self.command(nq.set_queue_count, count)
        most = min(granted & 0xFFFF, granted >> 16) + 1
        if most < count:
            raise BadInput(f"controller {self.device.bdf}: grants {most} I/O queue pairs, "
                           f"the job asks {count} (numjobs)")
        for qid in range(len(self.pairs) + 1, len(self.pairs) + 1 + count):
            pair = self._queue_pair(qid, depth)
            self.command(nq.create_cq, qid, depth, pair.cq_iova)
            self.command(nq.create_sq, qid, depth, pair.sq_iova, qid)
            self.pairs.append(pair)
        return self.pairs[-count:]

    def shutdown(self) -> None:
        """Delete the I/O queues, then the orderly shutdown (CC.SHN normal, wait for
        CSTS.SHST complete), disable and stop bus mastering. Best effort past a failure:
        whatever happened, the controller ends disabled."""
        try:
            for pair in reversed(self.pairs):
                self.command(nq.delete_queue, pair.qid, False)
                self.command(nq.delete_queue, pair.qid, True)
            self.bar.w32(nq.REG_CC, self.bar.r32(nq.REG_CC) | nq.CC_SHN_NORMAL)
            deadline = time.monotonic() + 5
            while (self.bar.r32(nq.REG_CSTS) & nq.CSTS_SHST_MASK) != nq.CSTS_SHST_DONE:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
        finally:
            self.pairs.clear()
            self.bar.w32(nq.REG_CC, 0)
            try:
                self._wait_ready(0)
            finally:
                self.device.bus_master(False)


class Enabled:
    """A controller brought up by the host driver (``controller``, ``info``: Identify) on
    the device a transport opens, and on ``close`` shut down before the transport lets go
    of the rest (``release``): what a session over any transport shares."""

    controller: Controller | None = None
    info: dict[str, object]

    def bring_up(self, open_device: Callable[[], Any]) -> None:
        """``device`` = ``open_device()``, enabled and identified; closed on any failure."""
        try:
            self.device = open_device()
            self.controller = Controller(self.device)
            self.info = self.controller.identify()
        except BaseException:
            self.close()
            raise

    def release(self) -> None:
        """What the transport lets go of once the controller is shut down."""

    def close(self) -> None:
        """The orderly shutdown, then ``release`` (idempotent)."""
        try:
            if self.controller is not None:
                self.controller.shutdown()
        finally:
            self.controller = None
            self.release()


class Session(Enabled):
    """A controller gpufio drives: guarded (io/nvme/guardian: given back if this process
    dies, kill -9 included), taken from its driver, opened over vfio, enabled; and on
    ``close`` (every other exit path) shut down, unmapped and given back to its driver."""

    def __init__(self, bdf: str, *, writes: bool, sys_pci: Path = vfio.SYS_PCI) -> None:
        self.guard = Guard(bdf)
        try:
            self.taken = take(bdf, writes=writes, sys_pci=sys_pci)
        except BaseException:
            self.guard.release()
            raise
        self.sys_pci = sys_pci
        self.device: vfio.Device | None = None
        self.bring_up(lambda: vfio.Device(bdf, sys_pci))

    def release(self) -> None:
        """Unmap its memory, give it back (after the shutdown: ``close``)."""
        if self.device is not None:
            self.device.close()
            self.device = None
        try:
            if self.taken.driver != "vfio-pci":
                self.taken.give_back(self.sys_pci)
        finally:
            self.guard.release()


NVME_CLASS = "0x010802"


def doctor_checks(host: Host, area: str, needed: bool) -> list[Check]:
    """What a vfio-driven NVMe path needs on ``host``: the vfio-pci driver, the IOMMU on,
    and for each NVMe controller its IOMMU group, what shares it, and whether gpufio could
    take it now (or why not). A missing need fails where jobs ask for the path
    (``needed``), else warns."""
    bad = FAIL if needed else WARN
    sys_pci = host.path("sys/bus/pci")
    out = []
    loaded = (sys_pci / "drivers" / "vfio-pci").exists()
    built = host.kernel_config("CONFIG_VFIO_PCI")
    out.append(verdict(area, "vfio-pci", loaded or built in ("y", "m"),
                       "loaded" if loaded else f"not loaded (CONFIG_VFIO_PCI={built})",
                       "the kernel has no vfio-pci: it cannot take a controller", bad=bad))
    groups = host.path("sys/kernel/iommu_groups")
    ngroups = len(list(groups.iterdir())) if groups.exists() else 0
    out.append(verdict(area, "IOMMU", ngroups > 0, f"{ngroups} IOMMU groups",
                       "the IOMMU is off: boot with intel_iommu=on (or amd_iommu=on); gpufio "
                       "drives NVMe over vfio only with it on", bad=bad))
    devices = sorted(p for p in (sys_pci / "devices").glob("*")
                     if host.read(str((p / "class").relative_to(host.root))) == NVME_CLASS) \
        if (sys_pci / "devices").exists() else []
    for dev in devices:
        bdf = dev.name
        group = vfio.iommu_group(bdf, sys_pci)
        mates = [m for m in vfio.group_members(bdf, sys_pci) if m != bdf]
        shares = ", ".join(f"{m} ({vfio.driver_of(m, sys_pci) or 'no driver'})"
                           for m in mates) or "nothing else"
        why = None
        try:
            vfio.check_group_alone(bdf, sys_pci)
            if host.root == Path("/") and vfio.driver_of(bdf, sys_pci) == "nvme":
                for ns in namespaces_of(bdf, sys_pci):
                    check_not_in_use(ns)
        except BadInput as e:
            why = str(e)
        found = (f"driver {vfio.driver_of(bdf, sys_pci) or 'none'}, IOMMU group {group}, "
                 f"shared with {shares}")
        out.append(Check(area, f"controller {bdf}", OK if why is None else WARN,
                         found + ("; can be taken" if why is None else ""), why or ""))
        out.append(Check(area, f"ACS above {bdf}", OK, vfio.acs_path(bdf, sys_pci), ""))
    if not devices:
        out.append(Check(area, "NVMe controllers", WARN, "none on PCI here",
                         f"{area} needs a PCIe NVMe controller"))
    return out
