"""The checkpoint mover, written once above the engines over their channel (core/requests).

The shards are cut into pieces (core/tensors.pieces) and each save or restore is one batch
of requests through the job's engine's channel: straight from and into the shards where the
channel takes the memory they live in (host shards on a host channel, GPU shards on a GPU
channel); GPU shards over a host channel through two page-locked rounds of pieces, each
round's copies on their own stream overlapping the other round's I/O. A piece that does not
move whole fails the phase naming shard, file and byte (core/tensors.piece_error).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gpufio.core.job import Job
from gpufio.core.requests import GPU, HOST, ChannelSpec, File, RequestFailed
from gpufio.core.tensors import Extent, TensorIOError, TensorRequest, piece_error, pieces
from gpufio.io import gpu
from gpufio.io.watchdog import Stalled
from gpufio.loops.steps import move_all

# pinned memory of one round of pieces: enough pieces to keep the queue full across a
# round's end, capped so large chunks do not pin GBs
ROUND_BYTES = 256 << 20


class ChannelMover:
    """core/tensors.Mover through ``engine``'s channel over the opened ``files``, for
    shards in ``xp``'s memory (NumPy: host, CuPy: the job's GPU). ``facts`` are the
    channel's, with the piece size (and the pieces a pinned round holds); ``mode`` the
    engine's mode where its channel names one."""

    def __init__(self, engine: Any, job: Job, files: Sequence[File], extents: Sequence[Extent],
                 xp: Any, request: TensorRequest) -> None:
        cap = engine.capability
        self.pieces = pieces(extents, request.chunk)
        self._extents, self._paths = list(extents), [f.path for f in files]
        self._fds = [f.fd for f in files]
        file_of = np.array([e.file for e in extents], dtype=np.int64)
        self._tgt = file_of[self.pieces[:, 0]]
        on_gpu = xp is not np
        memory = GPU if on_gpu and GPU in cap.memory else HOST
        self._staged = on_gpu and memory == HOST
        self.page_cache = cap.page_cache or not request.direct
        self.channel = engine.channel(job, files, ChannelSpec(request.iodepth, memory,
                                                              request.chunk, writes=True))
        self.facts: dict[str, Any] = {"chunk": request.chunk, **self.channel.facts}
        self.mode = self.channel.facts.get("mode")
        self._chunk = request.chunk
        self._bufs: list[Any] = []
        self._stream: Any = None
        if self._staged:
            try:
                self._cp = gpu.use(job.gpu)
                self._per = max(request.iodepth,
                                min(4 * request.iodepth, ROUND_BYTES // request.chunk))
                self._bufs = [gpu.PinnedBuffer(self._per * request.chunk) for _ in range(2)]
                self._stream = self._cp.cuda.Stream(non_blocking=True)
            except BaseException:
                self.close()
                raise
            self.facts["round_pieces"] = self._per

    def _move(self, write: bool, addrs: np.ndarray, rows: slice = slice(None)) -> int:
        """Pieces ``rows`` written from (read into) ``addrs``; the first completion's
        perf_counter_ns, or TensorIOError naming shard and file."""
        p = self.pieces[rows]
        what = "save" if write else "restore"
        try:
            return move_all(self.channel, self._tgt[rows], p[:, 2], p[:, 3], addrs, write)
        except RequestFailed as e:
            raise piece_error(what, self._extents, self._paths, p[e.index], e.res) from None
        except Stalled as e:
            raise TensorIOError(f"{what}: {e}") from None

    def _straight(self, tensors: Sequence[Any], write: bool) -> int:
        """Every piece straight from (into) its shard."""
        base = np.array([t.ctypes.data if isinstance(t, np.ndarray) else t.data.ptr
                         for t in tensors], dtype=np.uint64)
        addrs = base[self.pieces[:, 0]] + self.pieces[:, 1].astype(np.uint64)
        return self._move(write, addrs)

    def save(self, tensors: Sequence[Any]) -> int:
        return self._staged_save(tensors) if self._staged else self._straight(tensors, True)

    def sync(self) -> None:
        self.channel.sync(self._fds)

    def restore(self, tensors: Sequence[Any]) -> int:
        return (self._staged_restore(tensors) if self._staged
                else self._straight(tensors, False))

    # GPU shards over a host channel: two pinned rounds of pieces

    def _rounds(self) -> list[slice]:
        n = len(self.pieces)
        return [slice(lo, min(lo + self._per, n)) for lo in range(0, n, self._per)]

    def _slots(self, buf: int, rows: slice) -> np.ndarray:
        k = len(self.pieces[rows])
        return np.uint64(self._bufs[buf].addr) + np.arange(k, dtype=np.uint64) * np.uint64(self._chunk)

    def _copy(self, tensors: Sequence[Any], rows: slice, buf: int, down: bool) -> None:
        """Queue the copies of pieces ``rows`` between the shards and pinned round ``buf``."""
        runtime = self._cp.cuda.runtime
        kind = runtime.memcpyDeviceToHost if down else runtime.memcpyHostToDevice
        host = self._bufs[buf].addr
        for j, (e, at, _, n) in enumerate(self.pieces[rows].tolist()):
            dev, slot = tensors[e].data.ptr + at, host + j * self._chunk
            runtime.memcpyAsync(slot if down else dev, dev if down else slot, n, kind,
                                self._stream.ptr)

    def _staged_save(self, tensors: Sequence[Any]) -> int:
        """Round r+1 copied down while round r is written."""
        rounds, first = self._rounds(), 0
        if rounds:
            self._copy(tensors, rounds[0], 0, down=True)
        for r, rows in enumerate(rounds):
            self._stream.synchronize()  # round r is down; round r+1's slots are free
            if r + 1 < len(rounds):
                self._copy(tensors, rounds[r + 1], (r + 1) % 2, down=True)
            done = self._move(True, self._slots(r % 2, rows), rows)
            first = first or done
        self._stream.synchronize()
        return first

    def _staged_restore(self, tensors: Sequence[Any]) -> int:
        """Round r+1 read while round r is copied up."""
        rounds, first = self._rounds(), 0
        for r, rows in enumerate(rounds):
            if r == 0:
                first = self._move(False, self._slots(0, rows), rows)
            self._copy(tensors, rows, r % 2, down=False)
            if r + 1 < len(rounds):
                self._move(False, self._slots((r + 1) % 2, rounds[r + 1]), rounds[r + 1])
            self._stream.synchronize()  # round r is up; its slots take round r+2
        return first

    def close(self) -> None:
        """Release the channel and the pinned rounds; the files are the workload's."""
        if self._stream is not None:
            self._stream.synchronize()
        self.channel.close()
        for b in self._bufs:
            b.close()
        self._bufs = []
