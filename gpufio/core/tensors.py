"""Tensors saved to files and restored from them: what a checkpointing workload asks of an
engine, defined below both so neither names the other.

A model state is a list of shards (tensors). Each shard lies in one file as one extent; the
workload lays the files out and opens them, and moves them through the job's engine's
channel (loops/tensors; where it finds shards: ``Engine.tensor_support``). The
mover writes every shard's bytes to its extent (``save``), makes them durable (``sync``) and
reads them back into other memory (``restore``), in pieces of the job's block size.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

# every shard starts on and is padded to a 4 KiB boundary: what O_DIRECT needs of offsets,
# lengths and buffers on any drive gpufio meets, and the data pattern's block
ALIGN = 4096


@dataclass(frozen=True)
class Extent:
    """Shard ``shard``'s ``nbytes`` lie in file ``file`` (an index into the open files)
    from byte ``offset`` on."""

    shard: int
    file: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class TensorRequest:
    """How a mover moves the shards: pieces of ``chunk`` bytes, ``iodepth`` of them in
    flight where the path has a queue, O_DIRECT when ``direct``."""

    chunk: int
    iodepth: int
    direct: bool


@dataclass(frozen=True)
class TensorSupport:
    """Where the mover over an engine's channel finds the shards: in host memory
    (``device = "cpu"``), in GPU memory, or both (``Engine.tensor_support``)."""

    host: bool = True
    gpu: bool = True


class TensorIOError(RuntimeError):
    """A piece of a shard could not be moved whole (the job fails, naming shard and file)."""


class Mover(Protocol):
    """A checkpoint's mover (the channel's, or the naive one). ``save`` and ``restore`` take one 1-D uint8
    array per extent, in extent order (NumPy for host memory, CuPy for GPU memory), move
    every byte and return the ``time.perf_counter_ns`` at which the first piece completed."""

    facts: dict[str, Any]
    page_cache: bool

    def save(self, tensors: Sequence[Any]) -> int: ...

    def sync(self) -> None: ...

    def restore(self, tensors: Sequence[Any]) -> int: ...

    def close(self) -> None: ...


def pieces(extents: Sequence[Extent], chunk: int) -> np.ndarray:
    """Every extent cut into pieces of at most ``chunk`` bytes, as rows of (extent index,
    byte in the tensor, byte in the file, length), int64. Each file's pieces stay in file
    order, and the files take turns: the pieces in flight at any moment spread over every
    file, so a second drive (or a second file on a filesystem that serialises writes to
    one) works from the start, not after the first one's shards."""
    rows = []
    for i, e in enumerate(extents):
        starts = np.arange(0, e.nbytes, chunk, dtype=np.int64)
        lens = np.minimum(chunk, e.nbytes - starts)
        rows.append(np.stack([np.full(len(starts), i, np.int64), starts, e.offset + starts,
                              lens], axis=1))
    if not rows:
        return np.empty((0, 4), np.int64)
    out = np.concatenate(rows)
    file_of = np.array([e.file for e in extents], dtype=np.int64)[out[:, 0]]
    # a piece's turn: how many pieces of its own file come before it
    order = np.lexsort((out[:, 2], file_of))
    turn = np.empty(len(out), np.int64)
    sorted_files = file_of[order]
    starts_of_file = np.searchsorted(sorted_files, sorted_files, side="left")
    turn[order] = np.arange(len(out)) - starts_of_file
    return out[np.lexsort((file_of, turn))]


def piece_error(what: str, extents: Sequence[Extent], paths: Sequence[str],
                piece: Sequence[int], res: int) -> TensorIOError:
    """The one-line failure of ``piece`` (a row of ``pieces``) whose I/O returned ``res``
    (-errno, or a byte count short of the piece)."""
    ext = extents[int(piece[0])]
    why = (errno.errorcode.get(-res, str(-res)) if res < 0
           else f"{res} of {int(piece[3])} bytes")
    return TensorIOError(f"{what} of shard {ext.shard}: {paths[ext.file]} at byte "
                         f"{int(piece[2])}: {why}")
