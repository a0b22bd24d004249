"""DMA memory carved out of a region a controller reaches (a software controller's shared
file, QEMU's guest RAM): page-aligned pieces, zeroed, handed out in order."""

from __future__ import annotations

import numpy as np

from gpufio.io.nvme.spec import PAGE


def carve(region: np.ndarray, used: int, nbytes: int, what: str) -> tuple[np.ndarray, int]:
    """The next ``nbytes`` of ``region`` past ``used`` bytes, from a page boundary, zeroed:
    (its view, its offset in the region); MemoryError naming ``what`` where it does not fit."""
    start = -(-used // PAGE) * PAGE
    end = start + max(nbytes, 1)
    if end > len(region):
        raise MemoryError(f"{what}: {nbytes} bytes more do not fit in {len(region)}")
    view = region[start:end]
    view[:] = 0
    return view, start
