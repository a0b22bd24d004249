"""A software NVMe controller over shared memory, and a CPU driver of its queues.

The controller's side of the queue protocol of the NVMe base specification (2.0, chapter 3
and 4): a BAR0-like register page (CAP, VS, CC, CSTS, AQA/ASQ/ACQ, doorbells from 0x1000),
an admin queue (Identify, Set Features: number of queues, Create and Delete I/O SQ/CQ), SQ
entries fetched when their tail doorbell moves, PRP1/PRP2 and PRP lists walked, data copied
from and to a backing file at the LBA, completions posted with phase tags and status codes,
CQ head doorbells honoured (a full CQ holds the SQ back), CC.EN cleared: a reset that drops
every I/O queue. Faults are injected per command (``Fault``: a status code, or a completion
never posted). Every entry comes from io/nvme/spec.py's layout, as the GPU builder's do.

It is test infrastructure and the bench's ceiling model: the GPU kernels and the CPU driver
(``Host``) run unchanged against it, whatever writes the doorbells. Memory is one file
(tmpfs) mapped by both processes: BAR0 first (``BAR_BYTES``), then "host memory" the
controller reaches by bus address (IOVA = ``IOVA_BASE`` + its offset there), where queues,
PRP lists and data buffers live. The model polls its doorbells (a memory write raises no
event); it is a Python loop, so its rate is far below a drive's, and it says so in results.
A drive model (io/nvme/drives.py) may stand in front of its backing file: each I/O command's
completion is then held until the model's rates and latency allow it.
"""

from __future__ import annotations

import heapq
import mmap
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpufio.core import processes
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme import drives
from gpufio.io.nvme.memory import carve
from gpufio.io.nvme.spec import NVME_FLUSH, NVME_READ, NVME_WRITE
from gpufio.io.watchdog import Stalled, Watchdog

BAR_BYTES = 0x2000
IOVA_BASE = 1 << 36  # bus addresses start here, so a zero or host pointer is never valid
MAX_QUEUES = 64      # I/O queue pairs the model offers (Set Features answers with it)
MQES = 4095          # CAP.MQES: the largest queue is 4096 entries
# The model's own words, in BAR0's command-set-specific range (0xF00-0xFFF), not NVMe's:
M_ALIVE, M_STOP, M_ERROR, M_FETCHED, M_COMPLETED = 0xF00, 0xF04, 0xF08, 0xF10, 0xF18
M_BUSY_NS = 0xF20    # the compiled pollers' ns in passes that did work (this model: 0)
IDLE_SPINS = 2000    # polls of an idle controller before it starts to back off
IDLE_MAX_S = 0.0005
WAIT_S = 10.0        # how long the CPU driver waits for the controller (readiness, admin)
SC_WRITE_FAULT = 0x280  # media and data integrity errors: Write Fault


class Memory:
    """The shared file mapped: BAR0 (``bar``: u32 words by byte offset) and host memory
    (``dma``), with a bump allocator of page-aligned buffers for the driver side."""

    def __init__(self, path: str, dma_bytes: int = 0, create: bool = False) -> None:
        if create:
            with open(path, "wb") as f:
                f.truncate(BAR_BYTES + dma_bytes)
        fd = os.open(path, os.O_RDWR)
        try:
            self.size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, self.size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.path = path
        self.all = np.frombuffer(self._map, np.uint8)
        self.addr = self.all.ctypes.data
        self.bar32 = self.all[:BAR_BYTES].view("<u4")
        self.dma = self.all[BAR_BYTES:]
        self._next = 0
        # the controller's process, in the driver's process (ModelProcess): its end is what
        # a stall report names first
        self.server: multiprocessing.process.BaseProcess | None = None

    def ended(self) -> str:
        """Why the controller cannot answer, where its process has ended; else ""."""
        code = None if self.server is None else self.server.exitcode
        if code is None:
            return ""
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"; the software controller's process has ended ({how})"

    def reg(self, off: int) -> int:
        return int(self.bar32[off // 4])

    def set_reg(self, off: int, value: int) -> None:
        self.bar32[off // 4] = value & 0xFFFFFFFF

    def reg64(self, off: int) -> int:
        return self.reg(off) | self.reg(off + 4) << 32

    def set_reg64(self, off: int, value: int) -> None:  # two halves, as a driver must
        self.set_reg(off, value)
        self.set_reg(off + 4, value >> 32)

    def alloc(self, nbytes: int) -> tuple[np.ndarray, int]:
        """``nbytes`` of host memory, page-aligned and zeroed: (view, IOVA)."""
        view, start = carve(self.dma, self._next, nbytes, "model memory")
        self._next = start + len(view)
        return view, IOVA_BASE + start

    def host_address(self, iova: int) -> int:
        """The process's address of bus address ``iova`` (what a GPU kernel is handed)."""
        return self.addr + BAR_BYTES + iova - IOVA_BASE

    def at(self, iova: int, nbytes: int) -> np.ndarray:
        """The bytes at bus address ``iova``; IndexError outside host memory (a DMA fault)."""
        start = iova - IOVA_BASE
        if start < 0 or start + nbytes > len(self.dma):
            raise IndexError(f"bus address {iova:#x}+{nbytes} outside host memory")
        return self.dma[start:start + nbytes]

    def close(self) -> None:
        """Unmap, unless views of the memory are still held (it then goes with the last)."""
        self.all = self.bar32 = self.dma = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:
            pass


@dataclass(frozen=True)
class Fault:
    """An injected fault: the ``times`` next commands starting at LBA ``slba`` (any I/O
    opcode; -1: Flush) complete with ``status`` (SCT << 8 | SC) without moving data, or,
    with ``drop``, are consumed and never completed."""

    slba: int
    status: int = 0
    drop: bool = False
    times: int = 1


@dataclass
class _Queue:
    base: int
    size: int
    cqid: int = 0     # an SQ's completion queue
    head: int = 0     # SQ: next entry to fetch; CQ: the host's head doorbell
    tail: int = 0     # CQ: next entry to post
    phase: int = 1
    held: int = 0     # CQ: entries kept for completions a drive model holds back


@dataclass
class Controller:
    """The controller's state machine over ``mem``; ``step`` does one pass of work."""

    mem: Memory
    backing: int          # file descriptor of the namespace's data
    lba_shift: int
    faults: list[Fault] = field(default_factory=list)
    sqs: dict[int, _Queue] = field(default_factory=dict)
    cqs: dict[int, _Queue] = field(default_factory=dict)
    enabled: bool = False
    fetched: int = 0
    completed: int = 0
    drive: str | None = None  # a drive model's key (io/nvme/drives.toml): its rates apply
    # namespaces 2, 3 ...: descriptors of their data, each a drive of its own (its own rate
    # model), as a table striped over several drives needs
    more: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.data = (self.backing, *self.more)  # namespace i + 1's data
        self.sizes = [os.fstat(fd).st_size >> self.lba_shift for fd in self.data]
        self.rates = [None if self.drive is None else
                      drives.DriveRate(drives.model(self.drive)) for _ in self.data]
        # completions the drive models hold, a heap: (due ns, order, CQ, SQ id, SQ head,
        # cid, (status, result)); each drive's due times rise, several drives' interleave
        self.held: list[tuple] = []
        self._left = [f.times for f in self.faults]
        m = self.mem
        m.set_reg64(nq.REG_CAP, MQES | 1 << 16 | 20 << 24 | 1 << 37)  # CQR, TO 10 s, NVM set
        m.set_reg(nq.REG_VS, 0x00010400)
        m.set_reg(nq.REG_CSTS, 0)

    def step(self) -> bool:
        """Follow CC, then fetch and execute what every SQ's doorbell offers; True if any
        work was done."""
        m = self.mem
        cc = m.reg(nq.REG_CC)
        if cc & nq.CC_EN and not self.enabled:
            aqa = m.reg(nq.REG_AQA)
            self.sqs = {0: _Queue(m.reg64(nq.REG_ASQ), (aqa & 0xFFF) + 1)}
            self.cqs = {0: _Queue(m.reg64(nq.REG_ACQ), (aqa >> 16 & 0xFFF) + 1)}
            self.enabled = True
            m.set_reg(nq.REG_CSTS, nq.CSTS_RDY)
            return True
        if not cc & nq.CC_EN and self.enabled:  # reset: every queue and its state goes
            self.sqs, self.cqs, self.enabled, self.held = {}, {}, False, []
            m.bar32[nq.DOORBELLS // 4:] = 0  # as every register, back to its reset value
            m.set_reg(nq.REG_CSTS, 0)
            return True
        csts = m.reg(nq.REG_CSTS)
        if self.enabled and cc & nq.CC_SHN_NORMAL and not csts & nq.CSTS_SHST_DONE:
            m.set_reg(nq.REG_CSTS, csts | nq.CSTS_SHST_DONE)  # an orderly shutdown: done
            return True
        if not self.enabled or csts & nq.CSTS_CFS:
            return False
        worked = self._release()
        for qid, cq in self.cqs.items():
            cq.head = m.reg(nq.doorbell(qid, True))
        for qid, sq in list(self.sqs.items()):
            if self.sqs.get(qid) is not sq:  # deleted by an admin command of this pass
                continue
            tail = m.reg(nq.doorbell(qid, False))
            if tail >= sq.size:
                return self._fatal(f"SQ {qid} tail doorbell {tail} >= its {sq.size} entries")
            cq = self.cqs[sq.cqid]
            while sq.head != tail and (cq.head - cq.tail - 1) % cq.size > cq.held:
                e = np.frombuffer(self.mem.at(sq.base + sq.head * nq.SQE_BYTES, nq.SQE_BYTES)
                                  .tobytes(), nq.SQE_DTYPE)[0]
                sq.head = (sq.head + 1) % sq.size
                self.fetched += 1
                posted = self._admin(e) if qid == 0 else self._io(e)
                if posted is not None and qid and self._rate(e) is not None:
                    self._hold(e, cq, qid, sq.head, posted)
                elif posted is not None:
                    self._post(cq, qid, sq.head, int(e["cid"]), *posted)
                worked = True
        if worked:
            m.bar32[M_FETCHED // 4:M_FETCHED // 4 + 2] = np.array([self.fetched], "<u8").view("<u4")
            m.bar32[M_COMPLETED // 4:M_COMPLETED // 4 + 2] = \
                np.array([self.completed], "<u8").view("<u4")
        return worked or bool(self.held)  # held completions: poll on, without backing off

    def _hold(self, e: np.void, cq: _Queue, sqid: int, sq_head: int,
              posted: tuple[int, int]) -> None:
        """Keep an I/O command's completion until the drive model's due time."""
        nbytes = 0 if int(e["opcode"]) == NVME_FLUSH else \
            ((int(e["cdw12"]) & 0xFFFF) + 1) << self.lba_shift
        due = self._rate(e).admit(time.monotonic_ns(), nbytes)
        heapq.heappush(self.held, (due, self.fetched, cq, sqid, sq_head, int(e["cid"]), posted))
        cq.held += 1

    def _rate(self, e: np.void) -> drives.DriveRate | None:
        """The rate model of the command's namespace (None: none, or no such namespace)."""
        nsid = int(e["nsid"])
        return self.rates[nsid - 1] if 1 <= nsid <= len(self.rates) else None

    def _release(self) -> bool:
        """Post the held completions now due, in order; True if any was."""
        now, n = time.monotonic_ns(), 0
        while self.held and self.held[0][0] <= now:
            _, _, cq, sqid, sq_head, cid, posted = heapq.heappop(self.held)
            cq.held -= 1
            if self.cqs.get(self.sqs[sqid].cqid if sqid in self.sqs else -1) is cq:
                self._post(cq, sqid, sq_head, cid, *posted)  # its queues still there
            n += 1
        return n > 0

    def _fatal(self, why: str) -> bool:
        """Controller Fatal Status, as a drive sets it (until a reset); ``why`` is kept for
        the host's diagnostic (``fatal``)."""
        self.mem.set_reg(nq.REG_CSTS, nq.CSTS_RDY | nq.CSTS_CFS)
        self.mem.set_reg(M_ERROR, 1)
        self.why = why
        return True

    def _post(self, cq: _Queue, sqid: int, sq_head: int, cid: int, status: int,
              result: int) -> None:
        e = np.zeros(1, nq.CQE_DTYPE)
        e["result"], e["sq_head"], e["sq_id"], e["cid"] = result, sq_head, sqid, cid
        e["status"] = nq.cqe_status(status, cq.phase)
        raw = e.view(np.uint8)
        slot = self.mem.at(cq.base + cq.tail * nq.CQE_BYTES, nq.CQE_BYTES)
        slot[:14] = raw[:14]
        slot[14:] = raw[14:]  # the phase tag last: the host takes the entry once it flips
        cq.tail += 1
        if cq.tail == cq.size:
            cq.tail, cq.phase = 0, cq.phase ^ 1
        self.completed += 1

    def _fault(self, slba: int) -> Fault | None:
        for i, f in enumerate(self.faults):
            if f.slba == slba and self._left[i] > 0:
                self._left[i] -= 1
                return f
        return None

    def _io(self, e: np.void) -> tuple[int, int] | None:
        op = int(e["opcode"])
        if op not in (NVME_READ, NVME_WRITE, NVME_FLUSH):
            return nq.SC_INVALID_OPCODE, 0
        nsid = int(e["nsid"])
        if not 1 <= nsid <= len(self.data):
            return 0x0B, 0  # invalid namespace or format
        fd, nblocks = self.data[nsid - 1], self.sizes[nsid - 1]
        slba = -1 if op == NVME_FLUSH else int(e["cdw10"]) | int(e["cdw11"]) << 32
        fault = self._fault(slba)
        if fault is not None:
            return None if fault.drop else (fault.status, 0)
        if op == NVME_FLUSH:
            os.fsync(fd)
            return 0, 0
        nlb = (int(e["cdw12"]) & 0xFFFF) + 1
        if slba + nlb > nblocks:
            return nq.SC_LBA_RANGE, 0
        nbytes = nlb << self.lba_shift
        try:
            chunks = self._prps(int(e["prp1"]), int(e["prp2"]), nbytes)
        except ValueError:
            return nq.SC_PRP_OFFSET, 0
        except IndexError:
            return nq.SC_DATA_TRANSFER, 0
        off = slba << self.lba_shift
        if op == NVME_READ:
            data = np.frombuffer(os.pread(fd, nbytes, off), np.uint8)
            done = 0
            for view in chunks:
                view[:] = data[done:done + len(view)]
                done += len(view)
        else:
            try:
                os.pwrite(fd, b"".join(v.tobytes() for v in chunks), off)
            except OSError:
                return SC_WRITE_FAULT, 0
        return 0, 0

    def _prps(self, prp1: int, prp2: int, nbytes: int) -> list[np.ndarray]:
        """The data buffer's pieces, by PRP1, PRP2 and the PRP lists PRP2 points to (each
        list page's last entry chains to the next when more pages follow)."""
        if prp1 % 4:
            raise ValueError("PRP1 not dword aligned")
        first = min(nbytes, nq.PAGE - prp1 % nq.PAGE)
        out = [self.mem.at(prp1, first)]
        left = nbytes - first
        if left == 0:
            return out
        if left <= nq.PAGE:
            entries = [prp2]
        else:
            entries, at = [], prp2
            need = -(-left // nq.PAGE)
            while len(entries) < need:
                if at % 8:
                    raise ValueError("PRP list pointer not qword aligned")
                room = nq.PAGE - at % nq.PAGE
                page = self.mem.at(at, room).view("<u8")
                if need - len(entries) <= len(page):
                    entries += [int(x) for x in page[:need - len(entries)]]
                else:
                    entries += [int(x) for x in page[:-1]]
                    at = int(page[-1])
        for addr in entries:
            if addr % nq.PAGE:
                raise ValueError("PRP entry not page aligned")
            n = min(left, nq.PAGE)
            out.append(self.mem.at(addr, n))
            left -= n
        return out

    def _admin(self, e: np.void) -> tuple[int, int]:
        op, c10, c11 = int(e["opcode"]), int(e["cdw10"]), int(e["cdw11"])
        qid, size = c10 & 0xFFFF, (c10 >> 16) + 1
        if op == nq.ADMIN_CREATE_CQ:
            if not 1 <= qid <= MAX_QUEUES or qid in self.cqs:
                return nq.SC_INVALID_QID, 0
            if not 2 <= size <= MQES + 1:
                return nq.SC_INVALID_QSIZE, 0
            self.cqs[qid] = _Queue(int(e["prp1"]), size)
            self.mem.set_reg(nq.doorbell(qid, True), 0)
            return 0, 0
        if op == nq.ADMIN_CREATE_SQ:
            cqid = c11 >> 16
            if not 1 <= qid <= MAX_QUEUES or qid in self.sqs or cqid not in self.cqs:
                return nq.SC_INVALID_QID, 0
            if not 2 <= size <= MQES + 1:
                return nq.SC_INVALID_QSIZE, 0
            self.sqs[qid] = _Queue(int(e["prp1"]), size, cqid)
            self.mem.set_reg(nq.doorbell(qid, False), 0)
            return 0, 0
        if op in (nq.ADMIN_DELETE_SQ, nq.ADMIN_DELETE_CQ):
            table = self.sqs if op == nq.ADMIN_DELETE_SQ else self.cqs
            if qid == 0 or qid not in table:
                return nq.SC_INVALID_QID, 0
            del table[qid]
            return 0, 0
        if op == nq.ADMIN_SET_FEATURES and c10 & 0xFF == nq.FEATURE_NUM_QUEUES:
            n = min(MAX_QUEUES, (c11 & 0xFFFF) + 1) - 1
            return 0, n | n << 16
        if op == nq.ADMIN_IDENTIFY:
            page = np.zeros(nq.PAGE, np.uint8)
            if c10 & 0xFF == 1:  # controller: serial, model
                page[4:24] = np.frombuffer(b"gpufio-model".ljust(20), np.uint8)
                page[24:64] = np.frombuffer(b"gpufio software NVMe controller".ljust(40),
                                            np.uint8)
                page[516:520] = np.frombuffer(np.uint32(len(self.data)).tobytes(),
                                              np.uint8)  # NN
            elif c10 & 0xFF == 0 and 1 <= int(e["nsid"]) <= len(self.data):
                blocks = self.sizes[int(e["nsid"]) - 1]  # namespace: size, one LBA format
                page[0:24] = np.frombuffer(np.array([blocks] * 3, "<u8").tobytes(), np.uint8)
                page[128:132] = np.frombuffer(np.uint32(self.lba_shift << 16).tobytes(),
                                              np.uint8)
            elif c10 & 0xFF == nq.CNS_ACTIVE_NSIDS:  # the namespaces past nsid
                ids = np.arange(max(int(e["nsid"]), 0) + 1, len(self.data) + 1, dtype="<u4")
                page[:4 * len(ids)] = ids.view(np.uint8)
            else:
                return nq.SC_INVALID_FIELD, 0
            try:
                for view, src in zip(self._prps(int(e["prp1"]), int(e["prp2"]), nq.PAGE),
                                     (page,)):
                    view[:] = src[:len(view)]
            except (ValueError, IndexError):
                return nq.SC_DATA_TRANSFER, 0
            return 0, 0
        return nq.SC_INVALID_OPCODE, 0


def serve(path: str, backing: str, lba_shift: int, faults: list[Fault],
          drive: str | None = None, namespaces: tuple[str, ...] = ()) -> None:
    """The controller process's loop: serve ``path``'s queues from the file ``backing``
    (namespace 1; ``namespaces``: the files of namespaces 2, 3 ...) until the stop word is
    set, each namespace at the rates of the drive model ``drive`` where one is named
    (``functools.partial(serve, drive=key)`` is ModelProcess's ``server``). Busy-polls
    while there is work, backs off (to IDLE_MAX_S) when there is none."""
    mem = Memory(path)
    fds: list[int] = []
    try:
        for name in (backing, *namespaces):
            try:
                fds.append(os.open(name, os.O_RDWR))
            except PermissionError:  # a read-only file (a dataset's features): writes fail
                fds.append(os.open(name, os.O_RDONLY))
        fd = fds[0]
        ctl = Controller(mem, fd, lba_shift, list(faults), drive=drive, more=tuple(fds[1:]))
        mem.set_reg(M_ALIVE, 1)
        idle = 0
        while not mem.reg(M_STOP):
            if ctl.step():
                idle = 0
                continue
            idle += 1
            if idle > IDLE_SPINS:
                time.sleep(min(IDLE_MAX_S, 1e-6 * (idle - IDLE_SPINS)))
    finally:
        for fd in fds:
            os.close(fd)
        mem.close()


def _wait(what: str, ready, timeout_s: float = WAIT_S) -> None:
    """Poll ``ready`` until true; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"NVMe model: {what} not within {timeout_s:g} s")
        time.sleep(0.0001)


class QueuePair:
    """One SQ and its CQ in host memory, driven from the CPU: entries in, doorbells rung,
    completions taken by their phase tags, the CQ head doorbell rung after them."""

    def __init__(self, mem: Memory, qid: int, entries: int) -> None:
        self.mem, self.qid, self.entries = mem, qid, entries
        sq, self.sq_iova = mem.alloc(entries * nq.SQE_BYTES)
        cq, self.cq_iova = mem.alloc(entries * nq.CQE_BYTES)
        self.sq, self.cq = sq.view(nq.SQE_DTYPE), cq.view(nq.CQE_DTYPE)
        self.sq_db, self.cq_db = nq.doorbell(qid, False), nq.doorbell(qid, True)
        self.tail = self.head = 0
        self.phase = 1

    def submit(self, entries: np.ndarray) -> None:
        """Write ``entries`` at the tail and ring the SQ doorbell once for all of them."""
        for e in entries:
            self.sq[self.tail] = e
            self.tail = (self.tail + 1) % self.entries
        self.mem.set_reg(nq.doorbell(self.qid, False), self.tail)

    def reap(self) -> np.ndarray:
        """The completions posted since the last call (the phase tag says which are new);
        the CQ head doorbell is rung once after them."""
        got = []
        while int(self.cq[self.head]["status"]) & 1 == self.phase:
            got.append(self.cq[self.head].copy())
            self.head += 1
            if self.head == self.entries:
                self.head, self.phase = 0, self.phase ^ 1
        if got:
            self.mem.set_reg(nq.doorbell(self.qid, True), self.head)
        return np.array(got, nq.CQE_DTYPE)

    def run(self, entries: np.ndarray, stall_ns: int, depth: int | None = None) -> np.ndarray:
        """Submit ``entries`` (at most ``depth`` outstanding, default: the queue's room) and
        return their completions in cid order; Stalled, naming the commands still
        outstanding, once none has completed for ``stall_ns``."""
        depth = min(depth or self.entries - 1, self.entries - 1)
        done: dict[int, np.void] = {}
        sent = 0
        dog = Watchdog(stall_ns, time.monotonic_ns())
        while len(done) < len(entries):
            room = depth - (sent - len(done))
            if room > 0 and sent < len(entries):
                self.submit(entries[sent:sent + room])
                sent += min(room, len(entries) - sent)
            for c in self.reap():
                done[int(c["cid"])] = c
            if dog.update(len(done), time.monotonic_ns()):
                missing = sorted(set(int(c) for c in entries["cid"][:sent]) - set(done))
                raise Stalled(f"NVMe queue {self.qid}: no completion for {stall_ns / 1e9:g} s "
                              f"with {len(missing)} commands outstanding (cids "
                              f"{missing[:8]}); SQ tail {self.tail}, CQ head {self.head}, "
                              f"controller fetched {self.mem.reg64(M_FETCHED)} and completed "
                              f"{self.mem.reg64(M_COMPLETED)} commands: held by the "
                              f"controller (consumed, never completed){self.mem.ended()}")
            if not done or len(done) < len(entries):
                time.sleep(0)
        return np.array([done[int(c)] for c in entries["cid"]], nq.CQE_DTYPE)


class Host:
    """The CPU's side of bring-up over ``mem``: enable the controller with an admin queue,
    send admin commands, create I/O queue pairs, reset. What the vfio host driver does to a
    real controller, here for the model (the tests, the bench, the GPU side's setup)."""

    def __init__(self, mem: Memory, admin_entries: int = 32) -> None:
        self.mem = mem
        _wait("the controller process", lambda: mem.reg(M_ALIVE) == 1)
        self.admin_entries = admin_entries
        self._cid = 0
        self._qids = 0  # the I/O queue ids create_pairs has handed out
        self.enable()

    def enable(self) -> None:
        """CC.EN with a fresh admin queue pair; waits for CSTS.RDY."""
        self.admin_q = QueuePair(self.mem, 0, self.admin_entries)
        n = self.admin_entries - 1
        self.mem.set_reg(nq.REG_AQA, n | n << 16)
        self.mem.set_reg64(nq.REG_ASQ, self.admin_q.sq_iova)
        self.mem.set_reg64(nq.REG_ACQ, self.admin_q.cq_iova)
        self.mem.set_reg(nq.REG_CC, nq.CC_ENABLE)
        _wait("CSTS.RDY after CC.EN", lambda: self.mem.reg(nq.REG_CSTS) & nq.CSTS_RDY)

    def reset(self) -> None:
        """CC.EN cleared: the controller drops every queue (commands in flight with them)."""
        self.mem.set_reg(nq.REG_CC, 0)
        _wait("CSTS.RDY cleared after the reset",
              lambda: not self.mem.reg(nq.REG_CSTS) & nq.CSTS_RDY)

    def admin(self, opcode: int, **fields: int) -> tuple[int, int]:
        """One admin command: (status, result dword)."""
        self._cid += 1
        cqe = self.admin_q.run(nq.admin_command(opcode, self._cid & 0xFFFF, **fields),
                               int(WAIT_S * 1e9))[0]
        return int(nq.status_of(cqe["status"])), int(cqe["result"])

    def create_pair(self, qid: int, entries: int) -> QueuePair:
        """I/O CQ ``qid`` then SQ ``qid`` on it, ``entries`` deep each (physically contiguous)."""
        pair = QueuePair(self.mem, qid, entries)
        for op, base, c11 in ((nq.ADMIN_CREATE_CQ, pair.cq_iova, 1),
                              (nq.ADMIN_CREATE_SQ, pair.sq_iova, qid << 16 | 1)):
            status, _ = self.admin(op, prp1=base, cdw10=(entries - 1) << 16 | qid, cdw11=c11)
            if status:
                raise RuntimeError(f"NVMe model: creating queue {qid} ({entries} entries): "
                                   f"status {status:#x}")
        return pair

    def create_pairs(self, count: int, depth: int) -> list[QueuePair]:
        """``count`` pairs of ``depth`` entries past those this method made before (qids
        from 1): io/nvme/controller.Controller, as the vfio host driver's."""
        first, self._qids = self._qids + 1, self._qids + count
        return [self.create_pair(q, depth) for q in range(first, first + count)]


STOP_S = 5.0


def _main(path: str, backing: str, lba_shift: int, faults: list[Fault],
          server: Callable[..., None]) -> None:
    processes.die_with_parent()
    processes.take_stop_signals()
    server(path, backing, lba_shift, faults)


class ModelProcess:
    """A controller serving ``backing`` (``lba_shift``: its LBA size) through a shared file in
    ``directory`` with ``dma_bytes`` of host memory; ``mem`` is this process's mapping of it.

    A process of its own (spawned, so it holds no CUDA state of the parent's; dying with
    the parent; deaf to the Ctrl-C and SIGTERM meant for the runner): a GPU kernel, the
    doorbell relay and the CPU driver only share memory with it, as they would with a
    drive's DMA. A context manager: leaving it stops the controller (SIGKILL if it does not
    stop). ``server`` is the loop the process runs (``serve``, this model; or another
    controller of the same protocol: io/nvme/compiled.server)."""

    def __init__(self, directory: str | Path, backing: str | Path, lba_shift: int = 9,
                 dma_bytes: int = 64 << 20, faults: list[Fault] = (),
                 server: Callable[..., None] | None = None) -> None:
        self.path = str(Path(directory) / "nvme-model.shm")
        self.mem = Memory(self.path, dma_bytes, create=True)
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_main, daemon=True, name="nvme-model",
                                 args=(self.path, str(backing), lba_shift, list(faults),
                                       server or serve))
        processes.start(self._proc)
        self.mem.server = self._proc

    def host(self, admin_entries: int = 32) -> Host:
        """The CPU driver, once the controller is up (it waits for it), enabled."""
        if not self._proc.is_alive():
            raise RuntimeError(f"NVMe model: the controller process died (exit code "
                               f"{self._proc.exitcode})")
        return Host(self.mem, admin_entries)

    def stop(self) -> None:
        if self._proc.pid is not None and self._proc.is_alive():
            self.mem.set_reg(M_STOP, 1)
            self._proc.join(STOP_S)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()

    def __enter__(self) -> "ModelProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shared_directory() -> str:
    """Where a model's shared file goes: tmpfs (/dev/shm) where there is one, so CUDA can
    pin and map it as it would a driver's DMA memory."""
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="gpufio-nvme-model-", dir=base)


class ServedFile:
    """A file served as namespace 1 of a software controller of its own: the process, its
    shared memory (``mem``, ``dma_bytes`` of host memory) and the CPU driver (``host``),
    enabled; ``close`` stops it and removes the shared file. ``server``: as ModelProcess's."""

    def __init__(self, backing: str, lba_shift: int, dma_bytes: int,
                 server: Callable[..., None] | None = None) -> None:
        import shutil

        self.where = shared_directory()
        try:
            self.process = ModelProcess(self.where, backing, lba_shift, dma_bytes,
                                        server=server)
            self.mem = self.process.mem
            self.host = self.process.host()
        except BaseException:
            if hasattr(self, "process"):
                self.process.stop()
            shutil.rmtree(self.where, ignore_errors=True)
            raise

    def close(self) -> None:
        import shutil

        self.process.stop()
        self.mem.close()
        shutil.rmtree(self.where, ignore_errors=True)
