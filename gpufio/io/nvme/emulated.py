"""A session over a controller gpufio starts for the job instead of taking a drive: the
Python model, the compiled controller (both io/nvme/model.ModelProcess) or QEMU's hw/nvme
(io/nvme/qemu.py), serving one file as namespace 1. It has io/nvme/pcie_vfio.Session's face
(``device``, ``controller``: the host driver, enabled; ``info``: Identify; ``close``), so
whatever drives a drive's queue pairs from the CPU drives these unchanged; ``qemu`` is
QEMU's process and guest RAM where the controller is QEMU's (GPU threads map that RAM)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from gpufio.io.nvme import pcie_vfio, model
from gpufio.io.nvme import qemu, shared

MIB = 1 << 20


class EmulatedSession(pcie_vfio.Enabled):
    """Controller ``kind`` serving ``backing`` with ``1 << lba_shift``-byte blocks and
    ``dma_bytes`` of memory its DMA reaches; ``server``: the software controller's loop
    (io/nvme/compiled.server; None: the model's)."""

    def __init__(self, kind: str, backing: str, lba_shift: int, dma_bytes: int,
                 server: Callable[..., None] | None = None) -> None:
        self.qemu: qemu.QemuNvme | None = None
        self._undo: list[Callable[[], Any]] = []
        self.bring_up(lambda: self._start(kind, backing, lba_shift, dma_bytes, server))

    def _start(self, kind: str, backing: str, lba_shift: int, dma_bytes: int,
               server: Callable[..., None] | None) -> Any:
        """The controller's process started: its device."""
        if kind == "qemu":
            ram = max(64 * MIB, -(-(dma_bytes + qemu.RAM_START) // MIB) * MIB)
            self.qemu = qemu.QemuNvme(backing, 1 << lba_shift, ram_bytes=ram)
            self._undo.append(self.qemu.close)
            return self.qemu.device
        where = model.shared_directory()
        self._undo.append(lambda: shutil.rmtree(where, ignore_errors=True))
        proc = model.ModelProcess(where, backing, lba_shift, dma_bytes, server=server)
        self._undo += [proc.mem.close, proc.stop]
        return shared.SharedDevice(proc.mem, kind)

    def release(self) -> None:
        """Stop the controller and remove its files (after the shutdown: ``close``)."""
        while self._undo:
            self._undo.pop()()
