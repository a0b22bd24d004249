"""The GPU software cache in front of ``gpu-uring`` aggregation (kernels/gio_cache.cuh).

BaM keeps recently read storage pages in GPU memory so that a row read again (a hub node of
a power-law graph is sampled in most mini-batches) costs a GPU-memory copy instead of an
I/O. A page here is one feature row, the read unit; replacement is CLOCK. This module owns
the cache's memory and its descriptor; the kernel does every lookup, fill and eviction.
The cache lives as long as the fetcher, so it warms up over the warm-up iterations.
"""

from __future__ import annotations

from typing import Any

from gpufio.core.errors import BadInput
from gpufio.io.gio import contract


def cache_rows(cache_bytes: int, row_bytes: int, requesters: int) -> int:
    """How many rows ``cache_bytes`` holds; BadInput unless that is more than the requester
    threads, each of which may pin or lock one page while the clock looks for a victim."""
    rows = cache_bytes // row_bytes
    if rows <= requesters:
        raise BadInput(f"key 'cache_size': {cache_bytes} bytes hold {rows} rows of {row_bytes} "
                       f"bytes; the cache needs more rows than the {requesters} GPU requester "
                       "threads (rings x iodepth), and should have many more")
    return rows


class GpuCache:
    """``rows`` cached rows of ``row_bytes`` for a table of ``nodes`` rows, in GPU memory."""

    def __init__(self, xp: Any, rows: int, row_bytes: int, nodes: int) -> None:
        self.rows, self.row_bytes = rows, row_bytes
        page16 = -(-row_bytes // 16)
        try:
            self._pages = xp.empty(rows * page16 * 16, xp.uint8)
            self._map = xp.zeros(nodes, xp.uint32)
            self._ctl = xp.zeros(rows, xp.uint32)
            self._key = xp.full(rows, -1, xp.int64)
            self._hand = xp.zeros(1, xp.uint64)
        except xp.cuda.memory.OutOfMemoryError:
            raise BadInput(f"key 'cache_size': out of GPU memory for a cache of {rows} rows of "
                           f"{row_bytes} bytes") from None
        self.descriptor = xp.asarray(contract.build(contract.GIO_CACHE, {
            "pages": self._pages.data.ptr, "nslots": rows, "page16": page16,
            "map": self._map.data.ptr, "ctl": self._ctl.data.ptr, "key": self._key.data.ptr,
            "hand": self._hand.data.ptr}))

    def facts(self) -> dict[str, int]:
        """What the result says about the cache itself."""
        return {"bytes": self.rows * self.row_bytes, "rows": self.rows}
