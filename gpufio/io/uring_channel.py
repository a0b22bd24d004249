"""io_uring as a Channel (core/requests): the one I/O primitive of every engine whose
requests go through a ring the CPU submits, so two engines share it without naming each
other."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpufio.core.requests import Channel, ChannelSpec, File, drain
from gpufio.io import uring
from gpufio.io.watchdog import ring_report


class UringChannel(Channel):
    """Requests through one io_uring ring of ``spec.depth`` entries, READ and WRITE with
    each request's own descriptor, address and length; ``sqe_flags`` on every entry (e.g.
    SQE_ASYNC, so io-wq workers run them in parallel)."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec, sqe_flags: int = 0) -> None:
        super().__init__(spec)
        self._fds = np.array([f.fd for f in files], dtype=np.int64)
        self._sqe_flags = sqe_flags
        self.ring = uring.Ring(spec.depth)
        self.facts = {"iodepth": spec.depth}

    @property
    def inflight(self) -> int:
        return self.ring.inflight

    def room(self) -> int:
        return min(self.ring.space(), super().room())

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(self.room(), len(off))
        if k:
            w = np.asarray(write, bool)
            opcode = (np.where(w[:k], uring.OP_WRITE, uring.OP_READ) if w.ndim
                      else (uring.OP_WRITE if w else uring.OP_READ))
            self.ring.push(uring.sqe_words(
                opcode=opcode, sqe_flags=self._sqe_flags, fd=self._fds[np.asarray(tgt[:k])],
                off=np.asarray(off[:k], dtype=np.uint64),
                addr=np.asarray(addr[:k], dtype=np.uint64),
                length=np.asarray(length[:k], dtype=np.int64),
                user_data=np.asarray(tag[:k]).astype(np.uint64)))
        return k

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        wait = wait_ns is not None and self.ring.inflight > 0
        self.ring.submit(wait=int(wait), timeout_ns=wait_ns if wait else None)
        ud, res = self.ring.reap()
        return ud.astype(np.int64), res.astype(np.int64)

    def state(self) -> str:
        return ring_report(self.ring, self._fds.tolist())

    def close(self) -> None:
        drain(self)
        self.ring.close()
