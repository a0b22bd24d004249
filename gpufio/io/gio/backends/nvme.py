"""The NVMe backend of GPU-initiated I/O: GPU threads driving NVMe queue pairs (BaM's).

A host driver (vfio-pci on a real controller, or the software controller of
io/nvme/model.py) brings the controller up and creates the I/O queue pairs; it hands them
over here with its memory (io/nvme/controller.Memory). ``NvmeQueues`` then owns what the GPU
needs: a request queue (io/gio/queue.RequestQueue, the GioQueue of kernels/gio_queue.cuh,
so every kernel of the request API runs on it unchanged), landing slots and their PRP
lists in the controller's DMA-mapped host memory, one agent warp per pair
(kernels/nvme_agent.cu); the doorbell path and the stall report are its own.

Doorbells go one of two ways, named in every result (``mode``):
- ``direct``: agents store the SQ tail and CQ head into BAR0's doorbells, which the GPU
  reaches because the BAR mapping is registered with CUDA as I/O memory.
- ``relay``: agents store them into words of host memory; one CPU thread (``Relay``) copies
  each changed word into its doorbell register, one MMIO write per queue per pass however
  many tails the GPU published meanwhile. The fallback where the BAR cannot be registered
  (NVIDIA's driver may refuse it on recent kernels).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np

from gpufio.core.checks import OK, WARN, Check, verdict
from gpufio.core.errors import BadInput
from gpufio.io import gpu, kernels
from gpufio.io.nvme import spec as nq
from gpufio.io.gio import contract
from gpufio.io.nvme.controller import Memory, QueuePair
from gpufio.io.gio.queue import RequestQueue, refuse_serialised
from gpufio.io.kernels import Kernel

MODES = ("direct", "relay")
MAX_SLOT_BYTES = nq.PAGE * (nq.PRP_PER_PAGE + 1)  # one PRP list page per slot
RELAY_IDLE_SPINS = 1000
# cudaHostRegisterPortable | Mapped | IoMemory: BaM's cudaHostRegisterIoMemory of a BAR
IO_MEMORY_FLAGS = 1 | 2 | 4
FLUSH_KIND = 2  # nvme_io.cu's NVME_FLUSH
UNSET = -(1 << 31)


class Relay:
    """The doorbell relay: one CPU thread copying the tails and heads the GPU publishes in
    host memory (``words``: SQ tail, CQ head per pair) into the controller's doorbells."""

    def __init__(self, mem: Memory, pairs: Sequence[QueuePair],
                 words: np.ndarray) -> None:
        self.mem, self.words = mem, words
        self.doorbells = [db for p in pairs for db in (p.sq_db, p.cq_db)]
        self.passes = self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="doorbell-relay")
        self._thread.start()

    def _loop(self) -> None:
        last = self.words.copy()
        idle = 0
        while not self._stop.is_set():
            now = self.words.copy()
            changed = np.flatnonzero(now != last)
            for i in changed:  # one write per doorbell per pass: the batching
                self.mem.set_reg(self.doorbells[i], int(now[i]))
            self.passes += 1
            self.writes += len(changed)
            last = now
            idle = 0 if len(changed) else idle + 1
            if idle > RELAY_IDLE_SPINS:
                time.sleep(50e-6)
            elif not len(changed):
                time.sleep(0)  # let the runner's thread have the interpreter

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class NvmeQueues(RequestQueue):
    """``len(pairs)`` NVMe queue pairs driven by GPU agent warps, ``depth`` request slots of
    ``slot_bytes`` each per pair (depth < every pair's entries), for namespace ``nsid`` of
    1 << ``lba_shift`` byte blocks, or, with ``namespaces`` > 1, namespaces 1 to
    ``namespaces``, which kernels name as files 0 to ``namespaces`` - 1 (a table striped
    over the controller's namespaces). ``mode``: "direct" or "relay" (MODES)."""

    def __init__(self, mem: Memory, pairs: Sequence[QueuePair], *, depth: int,
                 slot_bytes: int, nsid: int, lba_shift: int, mode: str,
                 namespaces: int = 1) -> None:
        refuse_serialised("GPU-driven NVMe queues")
        if mode not in MODES:
            raise ValueError(f"doorbell mode {mode!r}: one of {', '.join(MODES)}")
        for p in pairs:
            if not 1 <= depth < p.entries:
                raise ValueError(f"queue pair {p.qid}: {p.entries} entries take at most "
                                 f"{p.entries - 1} slots, not {depth}")
        if slot_bytes % nq.PAGE or not 0 < slot_bytes <= MAX_SLOT_BYTES:
            raise ValueError(f"slot bytes {slot_bytes}: whole pages, at most {MAX_SLOT_BYTES}")
        bar = mem.bar_address() if mode == "direct" else None
        if mode == "direct" and bar is None:
            raise ValueError("direct doorbells: BAR0 is not registered with CUDA as I/O memory")
        super().__init__(len(pairs), depth)
        self.mem, self.pairs, self.mode = mem, list(pairs), mode
        self.slot_bytes = slot_bytes
        slots = self.nrings * depth
        # landing slots and their PRP lists in one allocation: one bus-address offset
        block, iova = mem.alloc(slots * (slot_bytes + nq.PAGE))
        host = block.ctypes.data
        self.landing = host
        lists = block[slots * slot_bytes:].view("<u8").reshape(slots, nq.PRP_PER_PAGE)
        pages = slot_bytes // nq.PAGE
        for s in range(slots):  # pages 1.. of each slot; used for transfers over two pages
            lists[s, :pages - 1] = iova + s * slot_bytes + nq.PAGE * np.arange(1, pages)
        words, _ = mem.alloc(8 * 4 * self.nrings + 8 * self.nrings)
        self.progress = words[:32 * self.nrings].view("<u8").reshape(self.nrings, 4)
        self.relay_words = words[32 * self.nrings:].view("<u4")
        relay = self.relay_words.ctypes.data
        rings = [{"sqes": p.sq.ctypes.data, "cqes": p.cq.ctypes.data,
                  "entries": p.entries | p.entries << 32,
                  "sq_db": bar + p.sq_db if bar else relay + 8 * r,
                  "cq_db": bar + p.cq_db if bar else relay + 8 * r + 4,
                  "delta": (iova - host) % (1 << 64),
                  "prp_lists": host + slots * slot_bytes + r * depth * nq.PAGE,
                  "ns": nsid | lba_shift << 32,
                  "progress": self.progress.ctypes.data + 32 * r}
                 for r, p in enumerate(self.pairs)]
        self._agent = kernels.function(Kernel.NVME_AGENT)
        # what the request kernels pass as a request's file: 0 sends it to the one namespace
        # of the queues (nsid); another number is the namespace itself (nvme_agent.cu)
        self.file_refs = (np.zeros(1, np.int32) if namespaces == 1
                          else np.arange(1, namespaces + 1, dtype=np.int32))
        self.relay: Relay | None = None
        self._arrays(np.concatenate([contract.build(contract.NVME_RING, r) for r in rings]),
                     slot_bytes)

    def _launch(self) -> None:
        self._agent(*self.agent_grid(), (self.descriptor, self._dev["rings"]),
                    stream=self.agent_stream)

    def _before_start(self) -> None:
        """Relayed doorbells: the CPU thread that rings them runs before the agents do."""
        if self.mode == "relay" and self.relay is None:
            self.relay = Relay(self.mem, self.pairs, self.relay_words)

    def completed(self) -> int:
        return int(self.progress[:, 1].sum())

    def report(self, stall_ns: int) -> str:
        """Where every pair stands, and which side holds its commands."""
        parts = []
        for r, p in enumerate(self.pairs):
            sub, done, tail, cq = (int(x) for x in self.progress[r])
            bell = self.mem.reg(p.sq_db)
            if sub == done:
                who = "nothing outstanding"
            elif bell != tail:
                who = (f"held by the doorbell path: the GPU published tail {tail}, the "
                       f"controller's doorbell says {bell}")
            else:
                who = (f"held by the controller: it was rung to tail {tail} and completed "
                       f"{done} of {sub} commands")
            parts.append(f"queue {p.qid}: submitted {sub}, completed {done}, CQ head "
                         f"{cq & 0xFFFFFFFF}; {who}")
        csts = self.mem.reg(nq.REG_CSTS)
        fatal = "; the controller reports a fatal status (CSTS.CFS)" \
            if csts & nq.CSTS_CFS else ""
        return (f"NVMe queues ({self.mode} doorbells): no command completed for "
                f"{stall_ns / 1e9:g} s; {'; '.join(parts)}{fatal}{self.mem.ended()}; slots "
                f"{self.slot_counts()}")

    def flush(self, stall_ns: int) -> int:
        """One NVMe Flush through the agents (a request of write with length 0, from one GPU
        thread): the request API's result, 0 or -(NVME_STATUS_BASE + status)."""
        cp = self._cp
        fn = kernels.function(Kernel.NVME_REQUESTS)  # before the agents run
        res, row = cp.full(1, UNSET, cp.int32), cp.zeros(16, cp.uint8)
        off, length = cp.zeros(1, cp.uint64), cp.zeros(1, cp.uint32)
        kind = cp.full(1, FLUSH_KIND, cp.uint8)
        stream = cp.cuda.Stream(non_blocking=True)
        self.start(1, keep=(res, row, off, length, kind))
        fn((1,), (1,), (self.descriptor, np.uint64(1), off, length, kind, row, np.uint64(1),
                        np.int32(0), res), stream=stream)
        self.wait((stream,), stall_ns)
        return int(res.get()[0])

    def close(self) -> None:
        """Stop the relay; GPU memory goes unless a kernel never stopped (then it is kept
        for good and the GPU marked unusable, as UringQueue does)."""
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.wedged("an NVMe queue agent never stopped"):  # what it may write into stays
            return
        self._dev, self._kept, self._launch_kept = {}, [], ()


class RegisteredModel:
    """The software controller's shared memory (io/nvme/model.Memory) registered with CUDA
    and mapped into the GPU, as controller.Memory: its BAR page registered too, so direct
    doorbells work (on a real controller that is the I/O-memory registration)."""

    def __init__(self, mem: Any) -> None:
        self._mem = mem
        gpu.register_host(mem.addr, mem.size, mapped=True)
        self.alloc, self.set_reg, self.reg, self.ended = mem.alloc, mem.set_reg, mem.reg, \
            mem.ended

    def bar_address(self) -> int | None:
        return self._mem.addr

    def close(self) -> None:
        gpu.unregister_host(self._mem.addr)


class RegisteredGuest:
    """QEMU's guest RAM (io/nvme/qemu.QemuNvme), where the controller's queues, PRP lists
    and landing slots all live, registered with CUDA and mapped into the GPU, as
    controller.Memory. BAR0 is reached over qtest only: relayed doorbells, each a qtest
    register write."""

    def __init__(self, guest: Any) -> None:
        self._guest = guest
        self._addr = guest.ram.ctypes.data
        gpu.register_host(self._addr, len(guest.ram), mapped=True)
        self.set_reg, self.reg = guest.device.bar0.w32, guest.device.bar0.r32

    def alloc(self, nbytes: int) -> tuple[np.ndarray, int]:
        buf = self._guest.device.memory(nbytes)
        return buf.map, buf.iova

    def bar_address(self) -> int | None:
        return None

    def ended(self) -> str:
        return self._guest.ended()

    def close(self) -> None:
        gpu.unregister_host(self._addr)


def register_io_memory(addr: int, size: int) -> str | None:
    """Register ``size`` bytes of a BAR mapping at ``addr`` with CUDA as I/O memory
    (CU_MEMHOSTREGISTER_IOMEMORY), so GPU threads may store to it; None once registered,
    else why not (CUDA's error: NVIDIA's driver refuses on kernels without follow_pfn)."""
    import cupy

    try:
        cupy.cuda.runtime.hostRegister(addr, size, IO_MEMORY_FLAGS)
    except cupy.cuda.runtime.CUDARuntimeError as e:
        return str(e)
    return None


class RegisteredVfio:
    """A controller over vfio-pci (io/nvme/pcie_vfio.Session's device) as controller.Memory: its
    DMA-mapped host memory registered with CUDA and mapped into the GPU, the queue pairs'
    memory too (``adopt``); BAR0 registered as I/O memory where ``direct`` is asked
    (BadInput naming CUDA's refusal otherwise)."""

    def __init__(self, device: Any, direct: bool) -> None:
        self._device, self._bar = device, device.bar0
        self._registered: list[int] = []
        self._bar_ok = False
        if direct:
            why = register_io_memory(self._bar.base, self._bar.size)
            if why is not None:
                raise BadInput(f"controller {device.bdf}: direct doorbells need BAR0 "
                               f"registered with CUDA as I/O memory, which failed ({why}); "
                               "use doorbells = \"relay\"")
            self._bar_ok = True
            self._registered.append(self._bar.base)

    def _register(self, addr: int, size: int) -> None:
        gpu.register_host(addr, size, mapped=True)
        self._registered.append(addr)

    def adopt(self, pair: QueuePair) -> None:
        """Register a queue pair's SQ and CQ (each its own DMA mapping) for the agents."""
        for ring in (pair.sq, pair.cq):
            self._register(ring.ctypes.data, -(-ring.nbytes // nq.PAGE) * nq.PAGE)

    def alloc(self, nbytes: int) -> tuple[np.ndarray, int]:
        m = self._device.memory(nbytes)
        self._register(m.addr, m.size)
        return np.frombuffer(m.map, np.uint8, nbytes), m.iova

    def set_reg(self, off: int, value: int) -> None:
        self._bar.w32(off, value)

    def reg(self, off: int) -> int:
        return self._bar.r32(off)

    def bar_address(self) -> int | None:
        return self._bar.base if self._bar_ok else None

    def ended(self) -> str:
        return ""  # a drive that stops answering shows in CSTS, which the report reads

    def close(self) -> None:
        """Unregister everything (before the device unmaps it)."""
        for addr in reversed(self._registered):
            gpu.unregister_host(addr)
        self._registered = []


def shared_memory(shared: Any, direct: bool) -> Memory:
    """A job's controller (io/nvme/session.Shared) as GPU threads take it, made by its first
    GPU worker and attached to it (closed before the controller goes): QEMU's guest RAM,
    which holds it all; else the vfio device's memory with every pair's rings registered,
    BAR0 as I/O memory where ``direct``."""
    def register() -> Memory:
        if shared.emulated:
            return RegisteredGuest(shared.session.qemu)
        registered = RegisteredVfio(shared.session.device, direct)
        for p in shared.pairs:
            registered.adopt(p)
        return registered

    return shared.attach(register)


def model_memory(model: Any) -> Memory:
    """A job's software controller (io/nvme/session.Model) as GPU threads take it: its
    shared file registered once, attached to it."""
    return model.attach(lambda: RegisteredModel(model.served.mem))


def io_memory_probe() -> str | None:
    """Whether CUDA takes CU_MEMHOSTREGISTER_IOMEMORY here: tried on a software controller's
    BAR page (a tmpfs page, as the model's), registered then unregistered. None when it
    took it, else CUDA's refusal. A real BAR mapping can still be refused where a tmpfs page
    is not (NVIDIA's driver resolves a BAR's pages through follow_pfn)."""
    import shutil

    import cupy

    from gpufio.io.nvme import model

    where = model.shared_directory()
    try:
        mem = model.Memory(f"{where}/probe.shm", 0, create=True)
        try:
            why = register_io_memory(mem.addr, model.BAR_BYTES)
            if why is None:
                cupy.cuda.runtime.hostUnregister(mem.addr)
            return why
        finally:
            mem.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)


def gpu_doctor_checks(area: str, relays: list[tuple[str, int]], cpus: int,
                      gpu_missing: str | None) -> list[Check]:
    """What the GPU side needs: whether CUDA registers I/O memory (direct doorbells; probed
    unless ``gpu_missing`` says why not), and the relay's cost, one CPU thread per worker
    for each (job name, workers) of ``relays``."""
    if gpu_missing:
        out = [Check(area, "BAR as CUDA I/O memory", WARN, f"not probed: {gpu_missing}",
                     "direct doorbells need a GPU")]
    else:
        why = io_memory_probe()
        out = [verdict(area, "BAR as CUDA I/O memory", why is None,
                       "CU_MEMHOSTREGISTER_IOMEMORY taken on the software controller's BAR "
                       "page (a real BAR may still be refused)"
                       if why is None else f"refused on a tmpfs page: {why}",
                       "direct doorbells cannot work here; use doorbells = \"relay\"")]
    cost = ("one CPU thread per worker polls the GPU's published tails and heads and writes "
            "each changed doorbell once per pass (one MMIO write per queue per pass)")
    if not relays:
        out.append(Check(area, "doorbell relay", OK, cost, ""))
    for name, threads in relays:
        out.append(verdict(area, f"doorbell relay of job '{name}'", threads + 1 <= cpus,
                           f"{threads} relay threads on {cpus} CPUs: {cost}",
                           "each relay thread spins on a core: fewer numjobs, or direct "
                           "doorbells where CUDA registers the BAR"))
    return out
