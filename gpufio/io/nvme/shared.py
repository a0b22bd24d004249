"""A software controller's shared file (io/nvme/model.Memory) seen as a vfio-pci device, so
that the host driver (io/nvme/pcie_vfio.Controller) brings up and drives the Python model and
the compiled controller exactly as it drives a drive: BAR0 registers are words of the file,
DMA memory is the file's host memory at its bus addresses."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from gpufio.io.nvme import model


class SharedBar:
    """BAR0 of a shared file: the ``vfio.Bar`` accessors over ``Memory``'s registers."""

    def __init__(self, mem: model.Memory) -> None:
        self.mem = mem

    def r32(self, off: int) -> int:
        return self.mem.reg(off)

    def w32(self, off: int, value: int) -> None:
        self.mem.set_reg(off, value)

    def r64(self, off: int) -> int:
        return self.mem.reg64(off)


@dataclass
class Buffer:
    """DMA memory as ``vfio.Memory`` gives it: its bytes (``map``), bus address (``iova``),
    this process's address of it (``addr``) and ``size``."""

    map: np.ndarray
    iova: int

    @property
    def addr(self) -> int:
        return self.map.ctypes.data

    @property
    def size(self) -> int:
        return len(self.map)


class SharedDevice:
    """The ``vfio.Device`` look-alike of a software controller (bus mastering is always
    on: its DMA is a copy in the shared file); ready once the controller's process says
    it is alive. Its DMA reaches the shared file only, never the caller's memory
    (``maps_host_memory``)."""

    maps_host_memory = False

    def __init__(self, mem: model.Memory, name: str = "software") -> None:
        model._wait("the controller process", lambda: mem.reg(model.M_ALIVE) == 1)
        self.mem, self.bdf, self.bar0 = mem, name, SharedBar(mem)
        self._lock = threading.Lock()  # a job's workers (threads) allocate at once

    def bus_master(self, on: bool) -> None:
        """Nothing to switch: a software controller's DMA is always on."""

    def memory(self, size: int) -> Buffer:
        with self._lock:
            view, iova = self.mem.alloc(size)
        return Buffer(view, iova)

    def forget(self, mem: Buffer) -> None:
        """Nothing to unmap: the bump allocator keeps it until the file goes."""

    def close(self) -> None:
        """The memory goes with the shared file (its owner closes it)."""
