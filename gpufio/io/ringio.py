"""A list of pieces (descriptor, file offset, host address, length) moved through one
io_uring ring, as many in flight as the ring holds: the loop the row fetch and the tensor
save and restore of the CPU-submitted paths share.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from gpufio.core.tensors import Extent, TensorIOError, TensorRequest, piece_error, pieces
from gpufio.io import uring
from gpufio.io.watchdog import ring_report

if TYPE_CHECKING:
    from gpufio.core.targets import Target

# a batch of pieces with no completion for this long is stuck (a wedged drive or mount)
WAIT_NS = 10_000_000_000


class PieceFailed(RuntimeError):
    """Piece ``index`` came back with ``res`` (-errno, or fewer bytes than asked)."""

    def __init__(self, index: int, res: int) -> None:
        super().__init__(f"piece {index}: {res}")
        self.index, self.res = index, res


class PiecesStuck(RuntimeError):
    """No piece completed for WAIT_NS; the message holds the ring's state."""


def move_pieces(ring: uring.Ring, opcode: int, fds: np.ndarray, offs: np.ndarray,
                addrs: np.ndarray, lens: np.ndarray, sqe_flags: int = 0) -> int:
    """Issue every piece with ``opcode`` (OP_READ or OP_WRITE) and wait until all are
    complete; returns the perf_counter_ns at which the first completed. PieceFailed for a
    piece that did not move whole, PiecesStuck when nothing completes."""
    n = len(offs)
    lens = np.asarray(lens, dtype=np.int64)
    pushed = done = first = 0
    while done < n:
        k = min(ring.space(), n - pushed)
        if k:
            ring.push(uring.sqe_words(
                opcode=opcode, sqe_flags=sqe_flags, fd=fds[pushed:pushed + k],
                off=np.asarray(offs[pushed:pushed + k], dtype=np.uint64),
                addr=np.asarray(addrs[pushed:pushed + k], dtype=np.uint64),
                length=lens[pushed:pushed + k],
                user_data=np.arange(pushed, pushed + k, dtype=np.uint64)))
            pushed += k
        ring.submit(wait=1, timeout_ns=WAIT_NS)
        ud, res = ring.reap()
        if not len(ud):
            if ring.inflight:
                raise PiecesStuck(f"no I/O completed in {WAIT_NS / 1e9:g} s: "
                                  f"{ring_report(ring, fds)}")
            continue
        first = first or time.perf_counter_ns()
        idx = ud.astype(np.int64)
        bad = np.flatnonzero(res != lens[idx])
        if len(bad):
            _drain(ring)
            raise PieceFailed(int(idx[bad[0]]), int(res[bad[0]]))
        done += len(ud)
    return first


def _drain(ring: uring.Ring) -> None:
    """Wait for the pieces still in flight, so none lands in memory the caller frees."""
    while ring.inflight:
        ring.submit(wait=1, timeout_ns=WAIT_NS)
        if not len(ring.reap()[0]):
            return


class RingPieces:
    """A checkpoint's extents cut into pieces (core/tensors.pieces) and one ring of
    ``request.iodepth`` to move them between the files and host memory."""

    def __init__(self, files: list["Target"], extents: list[Extent], request: TensorRequest,
                 sqe_flags: int = 0) -> None:
        self.pieces = pieces(extents, request.chunk)
        self.fds = [f.fd for f in files]
        self._paths = [f.path for f in files]
        self._extents, self._sqe_flags = extents, sqe_flags
        file_of = np.array([e.file for e in extents], dtype=np.int64)
        self._piece_fds = np.array(self.fds, dtype=np.int64)[file_of[self.pieces[:, 0]]]
        self.ring = uring.Ring(request.iodepth)

    def move(self, write: bool, addrs: np.ndarray, rows: slice = slice(None)) -> int:
        """Write (or read) the pieces ``rows`` from (into) host addresses ``addrs``; the
        first completion's perf_counter_ns, or TensorIOError naming shard and file."""
        p = self.pieces[rows]
        what = "save" if write else "restore"
        try:
            return move_pieces(self.ring, uring.OP_WRITE if write else uring.OP_READ,
                               self._piece_fds[rows], p[:, 2], addrs, p[:, 3], self._sqe_flags)
        except PieceFailed as e:
            raise piece_error(what, self._extents, self._paths, p[e.index], e.res) from None
        except PiecesStuck as e:
            raise TensorIOError(f"{what}: {e}") from None

    def close(self) -> None:
        self.ring.close()
