"""The interfaces every controller gpufio drives meets, whatever its transport: the host
driver of a drive over vfio-pci (io/nvme/pcie_vfio.py) and the software controllers' own
CPU driver (io/nvme/model.Host) each hand out queue pairs, and the GPU side
(io/gio/backends/nvme.py) takes any of them with the memory the controller reaches.
SPDK draws the same line between nvme_ctrlr/nvme_qpair and a transport."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class QueuePair(Protocol):
    """An I/O queue pair a host driver created: its id, depth, SQ/CQ entries (numpy arrays
    of spec.SQE_DTYPE / CQE_DTYPE over memory the controller reads and writes) and the BAR0
    offsets of its two doorbells (CAP.DSTRD applied)."""

    qid: int
    entries: int
    sq: np.ndarray
    cq: np.ndarray
    sq_db: int
    cq_db: int

    def submit(self, entries: np.ndarray) -> None:
        """Write ``entries`` (spec.SQE_DTYPE) at the SQ tail and ring its doorbell once."""


@runtime_checkable
class Controller(Protocol):
    """A controller brought up by a host driver, enabled, handing out I/O queue pairs."""

    def create_pairs(self, count: int, depth: int) -> Sequence[QueuePair]:
        """``count`` more polled I/O queue pairs of ``depth`` entries each."""


@runtime_checkable
class Memory(Protocol):
    """What a controller's host side offers GPU threads: host memory the controller reaches
    by bus address and the GPU by host address, and BAR0."""

    def alloc(self, nbytes: int) -> tuple[np.ndarray, int]:
        """``nbytes`` zeroed, page-aligned: (this process's view, the bus address)."""

    def set_reg(self, off: int, value: int) -> None:
        """A 32-bit MMIO write to BAR0 at byte ``off`` (the relay's doorbell writes)."""

    def reg(self, off: int) -> int:
        """A 32-bit MMIO read of BAR0 (CPU only: the stall diagnostic's CSTS)."""

    def bar_address(self) -> int | None:
        """BAR0 mapped into this process where GPU threads may store to its doorbells;
        None where they may not."""

    def ended(self) -> str:
        """Why the controller cannot answer at all, where that is known (a software
        controller's process has ended), as a clause a stall report appends; else ""."""
