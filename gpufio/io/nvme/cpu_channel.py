"""The CPU's queue-pair channel: requests (core/requests.Channel) as NVMe commands written
by the CPU into one I/O queue pair of a job's controller (io/nvme/session.Shared), for
hosts without a GPU: the block loop, the GNN row gather and every loop written over
channels run on it unchanged. Results name it ``SUBMITTER``."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.requests import HOST, Channel, ChannelSpec, drain
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme.session import Shared, slot_bytes
from gpufio.io.nvme.vfio import Memory
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled, Watchdog
from gpufio.native import memory

SUBMITTER = "cpu-stand-in"


class CpuChannel(Channel):
    """The CPU's queue-pair channel: requests as the 64-byte commands of io/nvme/spec.py
    written into a queue pair of the controller (io/nvme/pcie_vfio.QueuePair: SQ at the
    tail, one SQ doorbell per batch; completions by phase tag, one CQ head doorbell per reap),
    PRP lists for transfers over two pages, an NVMe Flush of each namespace for ``sync``.

    Data lands only in memory the IOMMU maps for the controller. A loop that hands its one
    buffer region (``spec.region``: the block loop's slots) has it mapped once, so the
    controller moves the bytes in place, as io_uring's fixed buffers. Any other buffer (the
    GNN gather's landing rows, which move as they grow; a mover's pieces of shards) goes
    through slots of the channel's own mapped memory, copied on submit (writes) and on
    reap (reads): mapping each batch's buffers would cost a map and an unmap ioctl, with
    their IOTLB flushes, per batch."""

    def __init__(self, spec: ChannelSpec, *, job: str, key: str, nsids: np.ndarray,
                 pairs: int, opener: Callable[[], Any] | None = None,
                 facts: dict[str, Any] | None = None) -> None:
        """A queue pair of the controller ``key`` (session.Shared: brought up for ``pairs``
        channels by the first; ``opener`` its session where gpufio starts the controller,
        else the drive at PCI address ``key`` is taken) for requests to namespaces
        ``nsids`` (one per file); ``job`` names the job in refusals, ``facts`` join the
        channel's."""
        super().__init__(spec)
        if spec.memory != HOST:
            raise BadInput(f"job '{job}': the CPU queue-pair channel moves host memory only")
        depth = spec.depth
        self._nsid = np.asarray(nsids, np.uint32)
        self._shared, self.pair = Shared.acquire(key, spec.writes, pairs, depth + 1, opener)
        self._mapped: Memory | None = None
        self._bounce: Memory | None = None
        self._lists: Memory | None = None
        try:
            self._shared.check_transfer(job, spec.largest)
            if spec.largest > nq.PAGE * nq.PRP_PER_PAGE:
                raise BadInput(f"job '{job}': transfers of {spec.largest} bytes need a "
                               "chained PRP list, which the CPU queue-pair channel does not "
                               "build")
            self._shift = self._shared.lba_shifts(self._nsid)
            device = self._shared.session.device
            assert device is not None
            self._device = device
            self._slot = slot_bytes(spec.largest)
            if spec.region is not None and device.maps_host_memory:
                lo = spec.region[0] - spec.region[0] % nq.PAGE
                self._mapped = device.memory(sum(spec.region) - lo, lo)
            else:
                self._bounce = device.memory(depth * self._slot)
            if spec.largest > nq.PAGE:  # more than two pages: a PRP list page per slot
                self._lists = device.memory(depth * nq.PAGE)
        except BaseException:
            self.close()
            raise
        self._free = np.arange(depth, dtype=np.int64)
        self._tag = np.zeros(depth, np.int64)
        self._len = np.zeros(depth, np.int64)
        self._addr = np.zeros(depth, np.uint64)
        self._write = np.zeros(depth, bool)
        self._refused: list[tuple[np.ndarray, np.ndarray]] = []  # completions never sent
        self.facts = {"iodepth": depth, "submitter": SUBMITTER, **(facts or {}),
                      "queue": self.pair.qid,
                      "buffers": "mapped" if self._mapped is not None else "bounced"}

    @property
    def inflight(self) -> int:
        return self.spec.depth - len(self._free) + sum(len(t) for t, _ in self._refused)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(len(off), self.room())
        if k <= 0:
            return 0
        tgt = np.asarray(tgt[:k], np.int64)
        off = np.asarray(off[:k], np.int64)
        length = np.asarray(length[:k], np.int64)
        addr = np.asarray(addr[:k], np.uint64)
        tag = np.asarray(tag[:k], np.int64)
        wr = np.asarray(write, bool)
        wr = np.full(k, bool(wr)) if wr.ndim == 0 else wr[:k]
        lba = np.int64(1) << self._shift[tgt].astype(np.int64)
        bad = ((off | length) & (lba - 1)).astype(bool) | (length <= 0)
        if bad.any():  # not whole logical blocks: the controller cannot move them
            self._refused.append((tag[bad], np.full(int(bad.sum()), -errno.EINVAL, np.int64)))
            ok = ~bad
            tgt, off, length, addr, tag, wr = tgt[ok], off[ok], length[ok], addr[ok], tag[ok], wr[ok]
        n = len(off)
        if n:
            slots, self._free = self._free[:n], self._free[n:]
            dma = self._dma(slots, addr, length, wr)
            prp1, prp2 = self._prps(slots, dma, length)
            self._tag[slots], self._len[slots] = tag, length
            self._addr[slots], self._write[slots] = addr, wr
            self.pair.submit(nq.io_commands(
                write=wr, nsid=self._nsid[tgt], lba_shift=self._shift[tgt], off=off,
                length=length, cid=slots, prp1=prp1, prp2=prp2))
        return k

    def _dma(self, slots: np.ndarray, addr: np.ndarray, length: np.ndarray,
             write: np.ndarray) -> np.ndarray:
        """The bus addresses the requests' data is at: in the mapped region, or in the
        bounce slots (a write's bytes copied there first)."""
        if self._mapped is not None:
            lo, hi = self._mapped.addr, self._mapped.addr + self._mapped.size
            if ((addr < lo) | (addr + length.astype(np.uint64) > hi)).any():
                raise ValueError("a request's buffer lies outside the channel's region")
            return addr - np.uint64(lo) + np.uint64(self._mapped.iova)
        assert self._bounce is not None
        at = slots.astype(np.uint64) * np.uint64(self._slot)
        for i in np.flatnonzero(write):
            memory.memmove(self._bounce.addr + int(at[i]), int(addr[i]), int(length[i]))
        return at + np.uint64(self._bounce.iova)

    def _prps(self, slots: np.ndarray, dma: np.ndarray, length: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """PRP1 and PRP2 of each request: the second page, or the slot's PRP list page
        (written here) for a transfer over two pages (io/nvme/spec.prp_pointers)."""
        prp2 = np.zeros(len(dma), np.uint64)
        for i in range(len(dma)):
            list_iova = self._lists.iova + int(slots[i]) * nq.PAGE if self._lists else 0
            _, prp2[i], entries = nq.prp_pointers(int(dma[i]), int(length[i]), list_iova)
            if len(entries):
                assert self._lists is not None and self._lists.map is not None
                np.frombuffer(self._lists.map, "<u8", len(entries),
                              int(slots[i]) * nq.PAGE)[:] = entries
        return dma, prp2

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        if self._refused:
            tags, res = (np.concatenate(x) for x in zip(*self._refused))
            self._refused = []
            return tags, res
        clock = time.perf_counter_ns
        deadline = None if wait_ns is None else clock() + wait_ns
        while True:  # polled: the CPU reads the CQ's phase tags, as a GPU thread would
            cids, status = self.pair.reap()
            if len(cids) or deadline is None or clock() >= deadline or not self.inflight:
                break
            os.sched_yield()
        res = nq.result(status, self._len[cids]).astype(np.int64)
        if self._bounce is not None:  # reads land in the slots: hand them on
            for i in np.flatnonzero(~self._write[cids] & (res > 0)):
                memory.memmove(int(self._addr[cids[i]]),
                               self._bounce.addr + int(cids[i]) * self._slot, int(res[i]))
        self._free = np.concatenate((self._free, cids))
        return self._tag[cids], res

    def state(self) -> str:
        p = self.pair
        csts = p.bar.r32(nq.REG_CSTS)
        return (f"{self.inflight} NVMe commands in flight on queue {p.qid} of "
                f"{self._shared.bdf} (SQ tail {p.tail}, CQ head {p.head}, phase {p.phase}, "
                f"CSTS {csts:#x}{': fatal' if csts & nq.CSTS_CFS else ''})")

    def sync(self, fds: Sequence[int]) -> None:
        """An NVMe Flush of each namespace of the channel, one at a time with nothing else
        in flight (the loops sync once their writes are reaped; the Flush's cid is one no
        request slot has). A Flush that fails ends the job (RuntimeError naming it)."""
        pair, clock = self.pair, time.perf_counter_ns
        for nsid in sorted({int(n) for n in self._nsid}):
            pair.submit(nq.flush_command(nsid, self.spec.depth))
            dog = Watchdog(STALL_LIMIT_NS, clock())
            while True:
                cids, status = pair.reap()
                if len(cids):
                    break
                if dog.update(0, clock()):
                    raise Stalled(f"NVMe Flush of namespace {nsid} on queue {pair.qid} of "
                                  f"{self._shared.bdf}: no completion for "
                                  f"{STALL_LIMIT_NS / 1e9:g} s")
            res = int(nq.result(status, 0)[0])
            if res:
                raise RuntimeError(f"NVMe Flush of namespace {nsid} on {self._shared.bdf}: "
                                   f"{nq.error_name(-res)}")

    def close(self) -> None:
        """What is in flight lands (bounded), the memory is unmapped (the loop frees its
        region next), the pair goes back; the last user shuts the controller down."""
        shared = getattr(self, "_shared", None)
        if shared is None:
            return
        try:
            if hasattr(self, "_free"):
                self._refused = []
                drain(self, STALL_LIMIT_NS)
        finally:
            try:
                for mem in (self._mapped, self._bounce, self._lists):
                    if mem is not None:
                        self._device.forget(mem)
                self._mapped = self._bounce = self._lists = None
            finally:
                self._shared = None  # type: ignore[assignment]
                shared.give(self.pair)
