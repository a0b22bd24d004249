"""vfio-pci from user space: a PCI function's driver binding, its IOMMU group, the type1
container, the device's BAR0 and its DMA mappings of pinned host memory.

The kernel gives a user-space driver a whole device through vfio-pci with no module of its
own: BAR0 is mmapped through the device descriptor, and host memory becomes reachable by the
device's DMA only where VFIO_IOMMU_MAP_DMA maps it (the IOMMU stays on). The ioctls are
``_IO(';', 100 + n)`` (linux/vfio.h). Register reads and writes go through word views of the
mapped BAR (native/memory.registers): one 32- or 64-bit access each, as controllers require.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
from pathlib import Path

from gpufio.core.errors import BadInput
from gpufio.native.memory import address_of, registers

SYS_PCI = Path("/sys/bus/pci")


def _io(nr: int) -> int:
    return (ord(";") << 8) | nr


GET_API_VERSION, CHECK_EXTENSION, SET_IOMMU = _io(100), _io(101), _io(102)
GROUP_GET_STATUS, GROUP_SET_CONTAINER, GROUP_GET_DEVICE_FD = _io(103), _io(104), _io(106)
DEVICE_GET_REGION_INFO, IOMMU_MAP_DMA, IOMMU_UNMAP_DMA = _io(108), _io(113), _io(114)
TYPE1_IOMMU, TYPE1V2_IOMMU = 1, 3
BAR0_REGION, CONFIG_REGION = 0, 7
GROUP_VIABLE = 1
PCI_COMMAND = 4
PCI_COMMAND_MEMORY, PCI_COMMAND_MASTER = 0x2, 0x4
DMA_READ_WRITE = 0x3


def driver_of(bdf: str, sys_pci: Path = SYS_PCI) -> str | None:
    """The driver PCI function ``bdf`` is bound to, or None."""
    link = sys_pci / "devices" / bdf / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def iommu_group(bdf: str, sys_pci: Path = SYS_PCI) -> str | None:
    """The IOMMU group of ``bdf`` (None: the IOMMU is off or does not cover it)."""
    link = sys_pci / "devices" / bdf / "iommu_group"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def group_members(bdf: str, sys_pci: Path = SYS_PCI) -> list[str]:
    """Every PCI function in ``bdf``'s IOMMU group, itself included."""
    link = sys_pci / "devices" / bdf / "iommu_group" / "devices"
    return sorted(p.name for p in link.iterdir()) if link.exists() else []


def check_group_alone(bdf: str, sys_pci: Path = SYS_PCI) -> None:
    """BadInput if ``bdf`` has no IOMMU group, or shares it with a function that a driver
    other than vfio-pci holds (vfio then refuses the group, and taking the whole group would
    take devices someone uses)."""
    if iommu_group(bdf, sys_pci) is None:
        raise BadInput(f"controller {bdf}: has no IOMMU group (the IOMMU is off: boot with "
                       "intel_iommu=on or amd_iommu=on); gpufio drives NVMe over vfio only "
                       "with the IOMMU on")
    others = [(m, driver_of(m, sys_pci)) for m in group_members(bdf, sys_pci) if m != bdf]
    used = [f"{m} ({d})" for m, d in others if d not in (None, "vfio-pci", "pcieport")]
    if used:
        raise BadInput(f"controller {bdf}: its IOMMU group {iommu_group(bdf, sys_pci)} also "
                       f"holds {', '.join(used)}, in use; vfio takes whole groups")


def bind(bdf: str, driver: str | None, sys_pci: Path = SYS_PCI) -> None:
    """Bind ``bdf`` to ``driver`` (None: leave it unbound) through driver_override, unbinding
    it from its current driver first; the override is cleared again for the nvme driver, so
    the kernel's own matching applies afterwards."""
    dev = sys_pci / "devices" / bdf
    if driver_of(bdf, sys_pci) == driver:
        return
    if driver_of(bdf, sys_pci) is not None:
        (dev / "driver" / "unbind").write_text(bdf)
    (dev / "driver_override").write_text((driver or "") + "\n")
    if driver is not None:
        try:
            (sys_pci / "drivers" / driver / "bind").write_text(bdf)
        except FileNotFoundError:
            (sys_pci / "drivers_probe").write_text(bdf)
        if driver != "vfio-pci":
            (dev / "driver_override").write_text("\n")


def _ioctl(fd: int, req: int, buf: bytes) -> bytes:
    b = bytearray(buf)
    fcntl.ioctl(fd, req, b, True)
    return bytes(b)


class Bar:
    """A mapped BAR: 32- and 64-bit register accesses, each a single load or store."""

    def __init__(self, fd: int, size: int, offset: int) -> None:
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                             offset=offset)
        self.size = size
        self._u32, self._u64 = registers(self.map)

    def r32(self, off: int) -> int:
        return self._u32[off >> 2]

    def w32(self, off: int, value: int) -> None:
        self._u32[off >> 2] = value

    def r64(self, off: int) -> int:
        """The 64-bit register at ``off`` (8-byte aligned, as the 64-bit registers are)."""
        return self._u64[off >> 3]

    def close(self) -> None:
        self._u32.release()
        self._u64.release()
        try:
            self.map.close()
        except BufferError:
            pass  # arrays over it still live: the mapping goes when they do


class Memory:
    """Pinned, page-aligned host memory mapped for the device's DMA at ``iova``: new memory
    of its own, or the whole pages of someone else's at ``addr`` (``map`` is then None; the
    owner must keep them until ``close``)."""

    def __init__(self, device: Device, size: int, iova: int, addr: int | None = None) -> None:
        self.size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self.map: mmap.mmap | None = None
        if addr is None:
            self.map = mmap.mmap(-1, self.size, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
            addr = address_of(self.map)
        self.addr = addr
        self.iova = iova
        self._device = device
        # type1 pins the pages while they are mapped
        fcntl.ioctl(device.container, IOMMU_MAP_DMA,
                    struct.pack("IIQQQ", 32, DMA_READ_WRITE, self.addr, iova, self.size))

    def close(self) -> None:
        if self._device is None:
            return
        _ioctl(self._device.container, IOMMU_UNMAP_DMA,
               struct.pack("IIQQ", 24, 0, self.iova, self.size))
        self._device = None
        try:
            if self.map is not None:
                self.map.close()
        except BufferError:
            pass  # arrays over it still live: the mapping goes when they do


class Device:
    """A PCI function bound to vfio-pci, opened: container (type1 IOMMU), group, device
    descriptor, config space, BAR0, and an IOVA allocator for the memory it maps."""

    maps_host_memory = True  # any of this process's pages can be mapped for its DMA

    IOVA_BASE = 1 << 32

    def __init__(self, bdf: str, sys_pci: Path = SYS_PCI) -> None:
        self.bdf = bdf
        group = iommu_group(bdf, sys_pci)
        self.container = self.group = self.fd = -1
        self.bar0: Bar | None = None
        self._memory: list[Memory] = []
        self._next_iova = self.IOVA_BASE
        self._lock = threading.Lock()  # workers (threads) map their memory at once
        try:
            self._open(group)
        except BaseException:
            self.close()
            raise

    def _open(self, group: str | None) -> None:
        try:
            self.container = os.open("/dev/vfio/vfio", os.O_RDWR)
            self.group = os.open(f"/dev/vfio/{group}", os.O_RDWR)
        except OSError as e:
            raise BadInput(f"controller {self.bdf}: cannot open vfio ({e.strerror}: "
                           f"{e.filename}); load vfio-pci and run as root") from None
        _, flags = struct.unpack("II", _ioctl(self.group, GROUP_GET_STATUS,
                                              struct.pack("II", 8, 0)))
        if not flags & GROUP_VIABLE:
            raise BadInput(f"controller {self.bdf}: IOMMU group {group} is not viable (every "
                           "device in it must be bound to vfio-pci or to no driver)")
        fcntl.ioctl(self.group, GROUP_SET_CONTAINER, struct.pack("i", self.container))
        v2 = fcntl.ioctl(self.container, CHECK_EXTENSION, TYPE1V2_IOMMU)
        fcntl.ioctl(self.container, SET_IOMMU, TYPE1V2_IOMMU if v2 else TYPE1_IOMMU)
        self.fd = fcntl.ioctl(self.group, GROUP_GET_DEVICE_FD,
                              bytearray(self.bdf.encode() + b"\0"), True)
        _, _, cfg = self.region(CONFIG_REGION)
        self._cfg = cfg
        flags, size, off = self.region(BAR0_REGION)
        self.bar0 = Bar(self.fd, size, off)

    def region(self, index: int) -> tuple[int, int, int]:
        """(flags, size, offset in the device descriptor) of region ``index``."""
        r = _ioctl(self.fd, DEVICE_GET_REGION_INFO, struct.pack("IIIIQQ", 32, 0, index, 0, 0, 0))
        _, flags, _, _, size, off = struct.unpack("IIIIQQ", r)
        return flags, size, off

    def command(self, set_bits: int = 0, clear_bits: int = 0) -> int:
        """Change the PCI command register; return the new value."""
        cmd = struct.unpack("H", os.pread(self.fd, 2, self._cfg + PCI_COMMAND))[0]
        cmd = (cmd | set_bits) & ~clear_bits
        os.pwrite(self.fd, struct.pack("H", cmd), self._cfg + PCI_COMMAND)
        return struct.unpack("H", os.pread(self.fd, 2, self._cfg + PCI_COMMAND))[0]

    def bus_master(self, on: bool) -> None:
        """Memory decode and Bus Master Enable (without it the device's DMA is dropped)."""
        bits = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER
        self.command(set_bits=bits) if on else self.command(clear_bits=PCI_COMMAND_MASTER)

    def memory(self, size: int, addr: int | None = None) -> Memory:
        """New pinned host memory of at least ``size`` bytes, mapped for the device's DMA;
        with ``addr`` (page-aligned), the caller's memory there instead."""
        with self._lock:
            mem = Memory(self, size, self._next_iova, addr)
            self._next_iova += mem.size + mmap.PAGESIZE  # a guard page between mappings
            self._memory.append(mem)
        return mem

    def forget(self, mem: Memory) -> None:
        """Unmap ``mem`` now (before its owner frees memory it did not allocate here)."""
        with self._lock:
            self._memory.remove(mem)
        mem.close()

    def close(self) -> None:
        """Unmap every DMA mapping and the BAR, close the descriptors (idempotent)."""
        for mem in reversed(self._memory):
            try:
                mem.close()
            except OSError:
                pass  # the container goes below; its mappings go with it
        self._memory.clear()
        if self.bar0 is not None:
            self.bar0.close()
            self.bar0 = None
        for name in ("fd", "group", "container"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


PCI_EXT_CAP_ACS = 0x000D
ACS_BITS = ((0x01, "SV"), (0x04, "RR"), (0x08, "CR"), (0x10, "UF"))  # ACS Control's bits


def acs_control(config: bytes) -> str | None:
    """The ACS Control bits switched on in a function's config space (extended
    capabilities from 0x100), as "SV RR CR UF" (subset), "none" when the capability has
    none on, None when the function has no ACS capability. ``config`` shorter than 0x104
    (only root reads past 256 bytes) raises ValueError."""
    if len(config) < 0x104:
        raise ValueError("extended config space unreadable")
    at, seen = 0x100, set()
    while at and at not in seen and at + 8 <= len(config):
        seen.add(at)
        header = struct.unpack_from("<I", config, at)[0]
        if header & 0xFFFF == PCI_EXT_CAP_ACS:
            ctrl = struct.unpack_from("<H", config, at + 6)[0]
            return " ".join(name for bit, name in ACS_BITS if ctrl & bit) or "none"
        at = header >> 20
    return None


def upstream_bridges(bdf: str, sys_pci: Path = SYS_PCI) -> list[str]:
    """The PCI functions between ``bdf`` and its root complex, nearest first (the bridges
    and switch ports whose ACS decides its IOMMU group and its peer-to-peer path)."""
    real = (sys_pci / "devices" / bdf).resolve()
    return [p.name for p in real.parents if len(p.name) == 12 and p.name.count(":") == 2
            and (p / "config").exists()]


def acs_path(bdf: str, sys_pci: Path = SYS_PCI) -> str:
    """ACS along ``bdf``'s path up to the root complex, one "bridge: bits" per bridge."""
    parts = []
    for bridge in upstream_bridges(bdf, sys_pci):
        try:
            bits = acs_control((sys_pci / "devices" / bridge / "config").read_bytes())
        except (OSError, ValueError):
            parts.append(f"{bridge}: unreadable (needs root)")
            continue
        parts.append(f"{bridge}: {'no ACS capability' if bits is None else 'ACS ' + bits}")
    return "; ".join(parts) or "directly on the root complex"
