"""Tables of fixed-size rows striped over files, and what fetching their rows means.

A workload that gathers rows (the GNN workload's feature aggregation: one row per node) reads
them through the job's engine's channel (loops/rows), or through its request queue where GPU
threads read them (loops/rows_device). The table, the request and the errors are defined
here, below both, so neither names the other.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layout:
    """Where row i is: the rows go round the files in stripes of ``stripe_rows`` rows, so
    stripe s = i // stripe_rows is on file s % ntargets, at byte header + ((s // ntargets)
    * stripe_rows + i % stripe_rows) * row_bytes. One row a stripe: row i on file i %
    ntargets; a 4 KiB page of rows a stripe: page i on file i % ntargets, as BaM stripes."""

    ntargets: int
    row_bytes: int
    header: int = 0
    stripe_rows: int = 1

    def locate(self, nodes: np.ndarray, xp=np) -> tuple:
        """(target index, byte offset) of each row."""
        n = xp.asarray(nodes, dtype=xp.int64)
        k, s = self.stripe_rows, n // self.stripe_rows
        return s % self.ntargets, self.header + ((s // self.ntargets) * k + n % k) * self.row_bytes

    def rows_of(self, target: int, nodes: int) -> np.ndarray:
        """The rows target ``target`` holds for ``nodes`` rows in all, in its file's order."""
        k = self.stripe_rows
        starts = np.arange(target * k, nodes, self.ntargets * k, dtype=np.int64)
        ids = (starts[:, None] + np.arange(k, dtype=np.int64)[None, :]).ravel()
        return ids[ids < nodes]

    def rows_on(self, target: int, nodes: int) -> int:
        """How many rows target ``target`` holds for ``nodes`` rows in all."""
        k = self.stripe_rows
        stripes = -(-nodes // k)
        mine = len(range(target, stripes, self.ntargets))
        short = stripes * k - nodes  # the last stripe's missing rows, if it is this target's
        return mine * k - (short if stripes and (stripes - 1) % self.ntargets == target else 0)

    def bytes_needed(self, target: int, nodes: int) -> int:
        return self.header + self.rows_on(target, nodes) * self.row_bytes


@dataclass(frozen=True)
class RowTable:
    """The files of a row table, its layout and its number of rows."""

    paths: tuple[str, ...]
    layout: Layout
    rows: int


@dataclass(frozen=True)
class RowRequest:
    """What a workload asks of a row fetcher: ``dim`` float32 columns of each row, at most
    ``max_rows`` rows a fetch (buffers are sized for it before any memory limit applies),
    O_DIRECT where the layout allows it, a GPU cache of ``cache_bytes`` and the mapping
    advice ('normal' or 'random') where the engine offers them."""

    dim: int
    max_rows: int
    direct: bool
    cache_bytes: int = 0
    advice: str = "normal"
    # the job's iodepth when the profile gives one; None picks the rows' default
    # (row_depth), derived from the batch
    iodepth: int | None = None
    ram_backed: bool = False  # every feature file lives in memory (tmpfs, zram)


# reads in flight per queue (ring, pool) when a workload's profile gives no iodepth: the
# depth the tuned GNN benches used (bench/gnn.py); a batch with fewer rows gets fewer
ROW_DEPTH = 128


def row_depth(request: RowRequest, queues: int = 1) -> int:
    """Reads in flight per queue for a row fetcher: the profile's iodepth, else ROW_DEPTH,
    but no more than the largest mini-batch spread over ``queues`` needs."""
    if request.iodepth is not None:
        return request.iodepth
    return max(1, min(ROW_DEPTH, -(-request.max_rows // queues)))


@dataclass(frozen=True)
class RowSupport:
    """What the rows through an engine offer, for the workloads' checks: they need GPU
    memory (no ``device = "cpu"``; for a channel, derived from its capability), a GPU
    cache, mapping advice (the channel's ``advise``), a multiple the row width must be of,
    and whether it is the loaders' baseline the experiment compares against."""

    gpu_only: bool = False
    cache: bool = False
    advice: bool = False
    dim_multiple: int = 1
    baseline: bool = False


class RowFetchError(RuntimeError):
    """A row could not be read whole (the job fails, naming the row and why)."""


def row_error(row: int, res: int, more: str = "") -> RowFetchError:
    """The one-line failure of a row read that returned ``res`` (-errno, or too few bytes)."""
    why = errno.errorcode.get(-res, str(-res)) if res < 0 else f"short read of {res} bytes"
    return RowFetchError(f"feature row of node {row} ({why}){more}")


def direct_fits(layout: Layout) -> bool:
    """Whether the layout's rows can be read with O_DIRECT: a 4 KiB-aligned first row,
    rows a multiple of 512 bytes."""
    return layout.header % 4096 == 0 and layout.row_bytes % 512 == 0


def open_rows(table: RowTable, direct: bool) -> list[int]:
    """The table's files opened for reading, with O_DIRECT when asked and the layout allows
    it (direct_fits)."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct and direct_fits(table.layout) else 0)
    return [os.open(p, flags) for p in table.paths]


def close_all(fds: list[int]) -> None:
    """Close every descriptor of ``fds`` (-1: a file left unopened)."""
    for fd in fds:
        if fd >= 0:
            os.close(fd)
