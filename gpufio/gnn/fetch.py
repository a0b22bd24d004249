"""Feature aggregation backends: fetch the rows of a mini-batch's nodes into one tensor.

``MmapFetch`` is the loaders' baseline the experiment measures (DGL's memory-mapped feature
loader): the feature files are memory-mapped, the CPU gathers each row through page faults
into a staging buffer (page-locked when the tensor goes to a GPU), and one copy takes the
gathered rows to the device. It reads through the page cache by nature; ``drop_cache``
evicts the files' cached pages before the first iteration.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gpufio.gnn.dataset import Dataset


class MmapFetch:
    """Page-fault gathers from memory-mapped feature files, then one copy to the device."""

    page_cache = True

    def __init__(self, ds: Dataset, xp: Any, dim: int, drop_cache: bool) -> None:
        self.xp, self.dim, self.layout = xp, dim, ds.layout
        self.rows = 0
        self._maps = []
        for t, path in enumerate(ds.paths):
            if drop_cache:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            n = ds.layout.rows_on(t, ds.graph.nodes)
            self._maps.append(np.memmap(path, dtype=np.float32, mode="r", offset=ds.layout.header,
                                        shape=(n, ds.layout.row_bytes // 4)))
        self._staging = np.empty((0, dim), np.float32)

    def _buffer(self, n: int) -> np.ndarray:
        """Staging rows, grown as needed (page-locked for GPU copies)."""
        if len(self._staging) < n:
            size = max(n, 2 * len(self._staging))
            if self.xp is np:
                self._staging = np.empty((size, self.dim), np.float32)
            else:
                import cupyx

                self._staging = cupyx.empty_pinned((size, self.dim), np.float32)
        return self._staging[:n]

    def fetch(self, nodes: Any) -> Any:
        """The feature rows of ``nodes`` (on the device), in order."""
        ids = nodes if self.xp is np else self.xp.asnumpy(nodes)
        out = self._buffer(len(ids))
        tgt, off = self.layout.locate(ids)
        rows = (off - self.layout.header) // self.layout.row_bytes
        if len(self._maps) == 1:
            np.take(self._maps[0][:, :self.dim], rows, axis=0, out=out)
        else:
            for t, m in enumerate(self._maps):
                mask = tgt == t
                out[mask] = m[rows[mask], :self.dim]
        self.rows += len(ids)
        return out.copy() if self.xp is np else self.xp.asarray(out)

    def close(self) -> None:
        self._maps.clear()
