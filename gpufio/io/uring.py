"""io_uring through raw system calls: ring setup, memory, SQE/CQE batches, registration.

No compiled helper and no binding: the three system calls and the structs they take
(native/uring.py), numpy views for the rings, so that a batch of SQEs is written with a
handful of vectorised stores. The layer is shared by every engine that uses io_uring,
including the GPU-initiated one, so the rules that keep a ring healthy live here and nowhere
else:

- ring memory may be mapped from the kernel or supplied by the caller
  (IORING_SETUP_NO_MMAP, Linux 6.5+): page-aligned, zero-filled anonymous memory that a GPU
  producer can register with CUDA;
- never more I/Os in flight than the CQ holds (``space``): overflowed CQEs stay in the kernel
  until io_uring_enter(GETEVENTS), which a GPU producer never calls;
- with SQPOLL, a sleeping poll thread (IORING_SQ_NEED_WAKEUP) is woken after publishing.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.facts.host import io_uring_disabled, kernel_version
from gpufio.native import libc, memory
from gpufio.native import uring as sys_uring
from gpufio.native.uring import Params

# the one call made per batch: straight to libc, without sys_uring.enter's frame
_syscall, SYS_ENTER = libc.syscall, sys_uring.SYS_ENTER

SETUP_IOPOLL = 1 << 0
SETUP_SQPOLL = 1 << 1
SETUP_SQ_AFF = 1 << 2
SETUP_CQSIZE = 1 << 3
SETUP_ATTACH_WQ = 1 << 5
SETUP_COOP_TASKRUN = 1 << 8
SETUP_TASKRUN_FLAG = 1 << 9
SETUP_SQE128 = 1 << 10
SETUP_CQE32 = 1 << 11
SETUP_SINGLE_ISSUER = 1 << 12
SETUP_DEFER_TASKRUN = 1 << 13
SETUP_NO_MMAP = 1 << 14
SETUP_NO_SQARRAY = 1 << 16

ENTER_GETEVENTS = 1 << 0
ENTER_SQ_WAKEUP = 1 << 1
ENTER_EXT_ARG = 1 << 3

SQ_NEED_WAKEUP = 1 << 0
SQ_CQ_OVERFLOW = 1 << 1
SQ_TASKRUN = 1 << 2  # completions wait for the submitter's next call (TASKRUN_FLAG)
# the counters of a ring's /proc/<pid>/fdinfo that say where its SQEs stand, kernel-side
KERNEL_VIEW = ("SqHead", "SqTail", "CachedSqHead", "CqHead", "CqTail", "CachedCqTail",
               "SQEs", "CQEs")

OP_NOP, OP_READ_FIXED, OP_WRITE_FIXED, OP_POLL_ADD, OP_READ, OP_WRITE = 0, 4, 5, 6, 22, 23
POLLIN = 0x1
# the user_data of the wake poll's completion (io_uring_params' slots never reach it)
WAKE_UD = (1 << 64) - 1
SQE_FIXED_FILE = 1 << 0
SQE_ASYNC = 1 << 4  # run in the kernel's io-wq workers, not inline in the submitter

REGISTER_BUFFERS, REGISTER_FILES = 0, 2

OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000

MAX_ENTRIES = 32768


def sq_entries(iodepth: int, ring_entries: int, where: str = "") -> int:
    """The SQ size for ``iodepth`` reads in flight (``ring_entries``, or iodepth when 0);
    BadInput, prefixed with ``where``, when the reads do not fit or io_uring allows no
    such ring."""
    if not ring_entries and iodepth > MAX_ENTRIES:
        raise BadInput(f"{where}key 'iodepth': {iodepth} is above the largest io_uring ring "
                       f"({MAX_ENTRIES} entries)")
    entries = ring_entries or iodepth
    if iodepth > entries:
        raise BadInput(f"{where}key 'iodepth': {iodepth} reads in flight do not fit a ring of "
                       f"ring_entries = {entries}")
    if entries > MAX_ENTRIES:
        raise BadInput(f"{where}key 'ring_entries': {entries} is more than io_uring's "
                       f"{MAX_ENTRIES}")
    return entries


FEATURES = ("single_mmap", "nodrop", "submit_stable", "rw_cur_pos", "cur_personality",
            "fast_poll", "poll_32bits", "sqpoll_nonfixed", "ext_arg", "native_workers",
            "rsrc_tags", "cqe_skip", "linked_file", "reg_reg_ring", "recvsend_bundle",
            "min_timeout", "rw_attr", "no_iowait")

SQE_DTYPE = np.dtype({
    "names": ["opcode", "flags", "ioprio", "fd", "off", "addr", "len", "rw_flags", "user_data",
              "buf_index", "personality", "splice_fd_in", "addr3", "pad2"],
    "formats": ["u1", "u1", "<u2", "<i4", "<u8", "<u8", "<u4", "<u4", "<u8", "<u2", "<u2",
                "<i4", "<u8", "<u8"],
    "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32, 40, 42, 44, 48, 56],
    "itemsize": 64})
CQE_DTYPE = np.dtype({"names": ["user_data", "res", "flags"], "formats": ["<u8", "<i4", "<u4"],
                      "offsets": [0, 8, 12], "itemsize": 16})

class UringError(Exception):
    """io_uring is missing, disabled, or refused a request; the message says which and why."""


def _need(flag_name: str, version: tuple[int, int]) -> str:
    have = ".".join(map(str, kernel_version()))
    return f"io_uring {flag_name} needs Linux >= {version[0]}.{version[1]} (this kernel is {have})"


def _setup_error(err: int, flags: int) -> UringError:
    disabled = io_uring_disabled()
    if err == errno.ENOSYS:
        return UringError("io_uring is not available in this kernel (io_uring_setup: ENOSYS)")
    if err == errno.EPERM and disabled:
        return UringError(f"io_uring is disabled here (kernel.io_uring_disabled = {disabled})")
    if err == errno.EINVAL:
        if flags & SETUP_NO_MMAP and kernel_version() < (6, 5):
            return UringError(_need("NO_MMAP (caller-supplied ring memory)", (6, 5)))
        if flags & SETUP_NO_SQARRAY and kernel_version() < (6, 6):
            return UringError(_need("NO_SQARRAY", (6, 6)))
        if flags & SETUP_SQE128 and kernel_version() < (5, 19):
            return UringError(_need("SQE128/CQE32 (NVMe passthrough)", (5, 19)))
    return UringError(f"io_uring_setup failed: {errno.errorcode.get(err, err)} "
                      f"({os.strerror(err)})")


# Before Linux 6.10 ("io_uring: use vmap() for ring mapping") the kernel took NO_MMAP ring
# memory only as one page or physically contiguous pages; gpufio's is plain anonymous pages
NO_MMAP_ANY_SIZE = (6, 10)
RINGS_HEADER_BYTES = 64  # struct io_rings up to its CQE array


def check_user_memory_size(sq_n: int, cq_n: int, sqarray: bool, big: bool = False) -> None:
    """UringError when caller-supplied (NO_MMAP) ring memory of these sizes needs more than
    one page on a kernel that only takes one page (or physically contiguous ones); ``big``:
    128-byte SQEs and 32-byte CQEs."""
    if kernel_version() >= NO_MMAP_ANY_SIZE:
        return
    sqe_bytes = sq_n * SQE_DTYPE.itemsize * (1 + big)
    ring_bytes = RINGS_HEADER_BYTES + cq_n * CQE_DTYPE.itemsize * (1 + big) + \
        (sq_n * 4 if sqarray else 0)
    if max(sqe_bytes, ring_bytes) > mmap.PAGESIZE:
        raise UringError(
            f"{_need('NO_MMAP rings over one page', NO_MMAP_ANY_SIZE)}: {sq_n} SQ and {cq_n} "
            f"CQ entries take {sqe_bytes} and {ring_bytes} bytes; at most {64 >> big} SQ "
            f"entries (iodepth <= {64 >> big} per ring) fit one page here")


def _anon(size: int) -> mmap.mmap:
    """Page-aligned, zero-filled anonymous memory (the kernel gives zeroed pages)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _page_round(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


@dataclass(frozen=True)
class Region:
    """A block of ring memory: its address and length, e.g. for cudaHostRegister."""

    addr: int
    size: int


class Ring:
    """One io_uring instance with numpy views over its SQ, CQ, SQEs and CQEs.

    Single-producer, single-consumer from the caller's side: one thread pushes and reaps.
    """

    def __init__(self, entries: int, *, cq_entries: int | None = None, sqpoll: bool = False,
                 sq_thread_idle_ms: int = 1000, sq_thread_cpu: int | None = None,
                 user_memory: bool = False, no_sqarray: bool = False,
                 single_issuer: bool = False, attach_to: int | None = None,
                 big: bool = False, iopoll: bool = False) -> None:
        """``attach_to``: the descriptor of an SQPOLL ring whose kernel thread (and io-wq)
        this SQPOLL ring shares (IORING_SETUP_ATTACH_WQ) instead of starting its own.
        ``big``: 128-byte SQEs and 32-byte CQEs (IORING_SETUP_SQE128 | CQE32), what NVMe
        passthrough commands need; ``iopoll``: completions are polled from the device
        (IORING_SETUP_IOPOLL, fio's hipri: O_DIRECT reads and writes on a queue that polls,
        nothing else), found only by waiting in ``submit``."""
        if not 1 <= entries <= MAX_ENTRIES:
            raise UringError(f"ring entries must be 1..{MAX_ENTRIES}, got {entries}")
        p = Params()
        flags = (SETUP_SQPOLL if sqpoll else 0) | (SETUP_NO_SQARRAY if no_sqarray else 0) \
            | (SETUP_IOPOLL if iopoll else 0)
        if not sqpoll:
            # As fio: completions need no IPI into the submitter (COOP_TASKRUN); without it
            # every io-wq completion interrupts the submitting thread. A ring with one
            # submitting thread may also defer that work until it reaps (DEFER_TASKRUN).
            # TASKRUN_FLAG: the SQ ring's flags say when completions wait for this thread's
            # next enter, so a loop can look before it sleeps
            flags |= SETUP_COOP_TASKRUN | SETUP_TASKRUN_FLAG
            if single_issuer:
                flags |= SETUP_SINGLE_ISSUER | SETUP_DEFER_TASKRUN
        if sqpoll:
            p.sq_thread_idle = sq_thread_idle_ms
            if sq_thread_cpu is not None:
                flags |= SETUP_SQ_AFF
                p.sq_thread_cpu = sq_thread_cpu
            if attach_to is not None:
                flags |= SETUP_ATTACH_WQ
                p.wq_fd = attach_to
        if big:
            flags |= SETUP_SQE128 | SETUP_CQE32
        self.sqe_bytes = SQE_DTYPE.itemsize * (1 + big)
        self.cqe_bytes = CQE_DTYPE.itemsize * (1 + big)
        if cq_entries is not None:
            flags |= SETUP_CQSIZE
            p.cq_entries = cq_entries
        self._maps: list[mmap.mmap] = []
        if user_memory:
            flags |= SETUP_NO_MMAP
            sq_n = 1 << (entries - 1).bit_length()
            cq_n = 1 << ((cq_entries or 2 * sq_n) - 1).bit_length()
            check_user_memory_size(sq_n, cq_n, sqarray=not no_sqarray, big=big)
            sqe_mem = _anon(_page_round(sq_n * self.sqe_bytes))
            ring_mem = _anon(_page_round(4096 + cq_n * self.cqe_bytes + sq_n * 4))
            self._maps += [sqe_mem, ring_mem]
            p.sq_off.user_addr = memory.address_of(sqe_mem)
            p.cq_off.user_addr = memory.address_of(ring_mem)
        fd, err = -1, 0
        for fallback in (0, SETUP_SINGLE_ISSUER | SETUP_DEFER_TASKRUN,
                         SETUP_COOP_TASKRUN | SETUP_TASKRUN_FLAG):
            flags &= ~fallback  # kernels before 5.19 / 6.1 lack the task-run flags
            p.flags = flags
            fd = sys_uring.setup(entries, p)
            err = -fd if fd < 0 else 0
            if fd >= 0 or err != errno.EINVAL:
                break
        if fd < 0:
            self._unmap()
            raise _setup_error(err, flags)
        self.fd = fd
        self.params = p
        self.flags = flags
        self.sq_entries, self.cq_entries = p.sq_entries, p.cq_entries
        self.features = {name for bit, name in enumerate(FEATURES) if p.features >> bit & 1}
        try:
            self._map_rings(user_memory)
        except BaseException:
            self.close()
            raise
        self._sq_mask = self.sq_entries - 1
        self._cq_mask = self.cq_entries - 1
        self._tail = self._sq_tail.value
        self._cq_head_local = self._cq_head.value
        self._unsubmitted = 0
        self.inflight = 0
        self._armed = 0  # the wake poll, in flight but not one of the caller's I/Os
        self.woken = False
        self._timeout_ns = 0
        self._ext = sys_uring.WaitArg()

    def _map_rings(self, user_memory: bool) -> None:
        p = self.params
        sq, cq = p.sq_off, p.cq_off
        if user_memory:
            sqe_mem, ring_mem = self._maps
            sq_base = cq_base = memory.address_of(ring_mem)
            sqe_base = memory.address_of(sqe_mem)
        else:
            sq_size = sq.array + self.sq_entries * 4
            cq_size = cq.cqes + self.cq_entries * self.cqe_bytes
            if "single_mmap" in self.features:
                sq_size = cq_size = max(sq_size, cq_size)
            ring = mmap.mmap(self.fd, sq_size, mmap.MAP_SHARED | mmap.MAP_POPULATE,
                             offset=OFF_SQ_RING)
            self._maps.append(ring)
            cq_map = ring
            if "single_mmap" not in self.features:
                cq_map = mmap.mmap(self.fd, cq_size, mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                   offset=OFF_CQ_RING)
                self._maps.append(cq_map)
            sqes = mmap.mmap(self.fd, self.sq_entries * self.sqe_bytes,
                             mmap.MAP_SHARED | mmap.MAP_POPULATE, offset=OFF_SQES)
            self._maps.append(sqes)
            sq_base, cq_base, sqe_base = map(memory.address_of, (ring, cq_map, sqes))
        self._sq_head = memory.u32_at(sq_base + sq.head)
        self._sq_tail = memory.u32_at(sq_base + sq.tail)
        self._sq_flags = memory.u32_at(sq_base + sq.flags)
        self._sq_dropped = memory.u32_at(sq_base + sq.dropped)
        self._cq_head = memory.u32_at(cq_base + cq.head)
        self._cq_tail = memory.u32_at(cq_base + cq.tail)
        self._cq_overflow = memory.u32_at(cq_base + cq.overflow)
        sqe_w, cqe_w = self.sqe_bytes // 8, self.cqe_bytes // 8
        self.sqes = memory.array_at(sqe_base, np.uint64, self.sq_entries * sqe_w).reshape(
            self.sq_entries, sqe_w)
        self.cqes = memory.array_at(cq_base + cq.cqes, np.uint64,
                                    self.cq_entries * cqe_w).reshape(self.cq_entries, cqe_w)
        self._cqe_res = self.cqes.view(np.int32)[:, 2]
        self._sq_array = None
        if not self.flags & SETUP_NO_SQARRAY:
            array = memory.array_at(sq_base + sq.array, np.uint32, self.sq_entries)
            array[:] = np.arange(self.sq_entries, dtype=np.uint32)
            self._sq_array = array
        self.regions = ([Region(sqe_base, len(self._maps[0])), Region(cq_base, len(self._maps[1]))]
                        if user_memory else [])
        self.ring_words = {"sq_head": sq_base + sq.head, "sq_tail": sq_base + sq.tail,
                           "sq_array": sq_base + sq.array if self._sq_array is not None else 0,
                           "sq_flags": sq_base + sq.flags, "cq_head": cq_base + cq.head,
                           "cq_tail": cq_base + cq.tail, "sqes": sqe_base,
                           "cqes": cq_base + cq.cqes}

    @property
    def iopoll(self) -> bool:
        """Whether completions are polled (IORING_SETUP_IOPOLL): no poll of a descriptor
        can be armed on such a ring, and a wait spins on the device."""
        return bool(self.flags & SETUP_IOPOLL)

    @property
    def sqpoll(self) -> bool:
        """Whether a kernel thread polls this ring's SQ."""
        return bool(self.flags & SETUP_SQPOLL)

    def local_heads(self) -> tuple[int, int]:
        """(SQ tail, CQ head) as this side has them: where a loop in other code takes over."""
        return self._tail, self._cq_head_local

    def arm_wake(self, fd: int) -> None:
        """Keep a poll of ``fd`` (an eventfd) in flight, so that a wait for completions also
        ends when ``fd`` becomes readable: its completion (user_data WAKE_UD) sets ``woken``
        and is not reaped as an I/O. Call before any I/O is pushed; SQE row 0 is free for
        the caller again when this returns."""
        words = np.zeros((1, 8), np.uint64)
        words[0, 0] = np.uint64(OP_POLL_ADD) | (np.uint64(fd & 0xFFFFFFFF) << np.uint64(32))
        words[0, 3] = np.uint64(POLLIN) << np.uint64(32)  # poll32_events
        words[0, 4] = np.uint64(WAKE_UD)
        self.push(words)
        self.inflight -= 1
        self._armed = 1
        self.submit()
        while self._sq_head.value != self._tail:  # an SQPOLL thread takes it on its own time
            os.sched_yield()

    @property
    def sq_flags(self) -> int:
        """IORING_SQ_* flags the kernel sets (NEED_WAKEUP, CQ_OVERFLOW)."""
        return self._sq_flags.value

    def state(self) -> dict[str, int]:
        """Heads, tails, flags and in-flight count: what a hang diagnostic prints."""
        return {"sq_head": self._sq_head.value, "sq_tail": self._sq_tail.value,
                "cq_head": self._cq_head.value, "cq_tail": self._cq_tail.value,
                "sq_flags": self.sq_flags, "sq_dropped": self._sq_dropped.value,
                "cq_overflow": self._cq_overflow.value, "inflight": self.inflight}

    def kernel_view(self) -> dict[str, int]:
        """The kernel's own counters of this ring (/proc/self/fdinfo: SqHead, CachedSqHead,
        CqTail, SQEs, ...), for a stall report; {} where it shows none."""
        try:
            with open(f"/proc/self/fdinfo/{self.fd}") as f:
                text = f.read()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in KERNEL_VIEW and value.strip().lstrip("-").isdigit():
                out[key] = int(value)
        return out

    def space(self) -> int:
        """How many SQEs may be pushed now: free SQ slots, capped so the CQ can never overflow."""
        sq_free = self.sq_entries - ((self._tail - self._sq_head.value) & 0xFFFFFFFF)
        return max(min(sq_free, self.cq_entries - self.inflight - self._armed), 0)

    def push(self, words: np.ndarray) -> None:
        """Write SQEs (rows of 8 little-endian u64 words, see ``sqe_words``) and publish them."""
        self._publish(self.sqes, words)

    def _publish(self, dest: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` at the SQ tail of ``dest`` (the SQE rows), wrapping around, then
        move the tail; refuses more than ``space()`` allows."""
        k = len(values)
        if k > self.space():
            raise UringError(f"push of {k} SQEs exceeds the ring's space ({self.space()}): "
                             "more in flight than the CQ holds would overflow it")
        start = self._tail & self._sq_mask
        first = min(k, self.sq_entries - start)
        dest[start:start + first] = values[:first]
        if first < k:
            dest[:k - first] = values[first:]
        self._tail = (self._tail + k) & 0xFFFFFFFF
        self._sq_tail.value = self._tail  # x86 stores are ordered: entries land before the tail
        self._unsubmitted += k
        self.inflight += k

    def enter(self, to_submit: int, min_complete: int, flags: int,
              timeout_ns: int | None = None) -> int:
        """io_uring_enter; returns its result (0 on timeout) or raises UringError.

        EINTR is retried. With ``timeout_ns`` a wait for completions gives up after that
        long (IORING_ENTER_EXT_ARG), so no caller can block forever on a stuck device.
        """
        arg = argsz = 0
        if timeout_ns is not None and flags & ENTER_GETEVENTS:
            if timeout_ns != self._timeout_ns:
                self._ext.set(timeout_ns)
                self._timeout_ns = timeout_ns
            arg, argsz, flags = self._ext.address, self._ext.size, flags | ENTER_EXT_ARG
        while True:
            rc = _syscall(SYS_ENTER, self.fd, to_submit, min_complete, flags, arg, argsz)
            if rc >= 0:
                return rc
            err = libc.errno()
            if err == errno.ETIME:
                return 0
            if err != errno.EINTR:
                raise UringError(f"io_uring_enter failed: {errno.errorcode.get(err, err)}")

    def submit(self, wait: int = 0, timeout_ns: int | None = None) -> None:
        """Hand pushed SQEs to the kernel and optionally wait for ``wait`` completions."""
        if self.flags & SETUP_SQPOLL:
            flags = ENTER_SQ_WAKEUP if self.sq_flags & SQ_NEED_WAKEUP else 0
            self._unsubmitted = 0
            if wait:
                flags |= ENTER_GETEVENTS
            if flags:
                self.enter(0, wait, flags, timeout_ns)
            return
        n, self._unsubmitted = self._unsubmitted, 0
        if n or wait:
            # a DEFER_TASKRUN ring posts completions only when its submitter asks for events
            events = wait or self.flags & SETUP_DEFER_TASKRUN
            self.enter(n, wait, ENTER_GETEVENTS if events else 0, timeout_ns)

    def reap(self) -> tuple[np.ndarray, np.ndarray]:
        """All available completions as (user_data u64, res int32) arrays; frees their CQ slots."""
        head = self._cq_head_local
        n = (self._cq_tail.value - head) & 0xFFFFFFFF
        if n == 0:
            if self.sq_flags & SQ_CQ_OVERFLOW:
                raise UringError(f"CQ overflowed: {self.state()}")
            return _EMPTY_U64, _EMPTY_I32
        start = head & self._cq_mask
        end = start + n
        if end <= self.cq_entries:
            ud, res = self.cqes[start:end, 0].copy(), self._cqe_res[start:end].copy()
        else:
            wrap = end - self.cq_entries
            ud = np.concatenate((self.cqes[start:, 0], self.cqes[:wrap, 0]))
            res = np.concatenate((self._cqe_res[start:], self._cqe_res[:wrap]))
        self._cq_head_local = (head + n) & 0xFFFFFFFF
        self._cq_head.value = self._cq_head_local
        if self._armed and not self.woken:
            mine = ud != np.uint64(WAKE_UD)
            if not mine.all():
                self.woken = True
                ud, res = ud[mine], res[mine]
                n = len(ud)
        self.inflight -= n
        return ud, res

    def register_files(self, fds: list[int]) -> None:
        """Register descriptors so SQEs can name them by index (IOSQE_FIXED_FILE)."""
        arr = np.asarray(fds, np.int32)
        self._register(REGISTER_FILES, arr.ctypes.data, len(fds), "files")

    def register_buffers(self, regions: list[Region]) -> None:
        """Register buffers so READ_FIXED can skip per-I/O page pinning."""
        arr = np.array([(r.addr, r.size) for r in regions], sys_uring.IOVEC)
        self._register(REGISTER_BUFFERS, arr.ctypes.data, len(regions), "buffers")

    def sq_thread_times(self) -> tuple[int, int, int] | None:
        """(SQPOLL thread id, its CPU time, the part of it spent on work) in microseconds,
        from the ring's fdinfo (Linux 6.13+; None before, or without SQPOLL). An SQPOLL
        thread spins while it waits for entries: the difference is that spinning."""
        try:
            with open(f"/proc/self/fdinfo/{self.fd}") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            pid = int(fields["SqThread"])
            total, work = int(fields["SqTotalTime"]), int(fields["SqWorkTime"])
        except (OSError, KeyError, ValueError):
            return None
        return (pid, total, work) if pid > 0 else None

    def _register(self, opcode: int, arg: int, n: int, what: str) -> None:
        rc = sys_uring.register(self.fd, opcode, arg, n)
        if rc < 0:
            err = -rc
            raise UringError(f"io_uring_register {what} failed: {errno.errorcode.get(err, err)} "
                             f"({os.strerror(err)})")

    def _unmap(self) -> None:
        for m in self._maps:
            m.close()
        self._maps = []

    def close(self) -> None:
        """Close the ring (the kernel cancels anything in flight) and release its memory."""
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1
        self.sqes = self.cqes = self._cqe_res = None
        self._unmap()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sq_thread_times(rings: Iterable[Ring]) -> dict[int, tuple[int, int]]:
    """{SQPOLL thread id: (CPU time, work time)} in microseconds for the threads behind
    ``rings``, one entry per thread however many of them it serves; empty where the kernel
    does not say."""
    return {t[0]: t[1:] for r in rings if (t := r.sq_thread_times())}


def busy_shares(before: dict[int, tuple[int, int]],
                after: dict[int, tuple[int, int]]) -> list[float]:
    """Each SQPOLL thread's share of its CPU time between two ``sq_thread_times`` readings
    that went to work rather than to spinning on an empty ring. The kernel derives both
    clocks from the thread's tick-sampled system time: a thread whose CPU time did not move
    between the readings is left out, and a share is capped at 1."""
    shares = []
    for pid, (total, work) in sorted(after.items()):
        t0, w0 = before.get(pid, (0, 0))
        if total > t0:
            shares.append(round(min((work - w0) / (total - t0), 1.0), 3))
    return shares


class SqThreadShare:
    """The working share of the SQPOLL threads behind ``rings`` over a run's measured phase:
    ``begin`` when it starts, ``shares`` at its end gives one share per thread for the result's
    engine facts (``sq_thread_busy``), and then ``cpu_s`` what each thread cost: its CPU
    seconds over the phase, spinning included (``sq_thread_cpu_s``). An SQPOLL thread's CPU
    time is a whole core whether it works or spins, so the share is what tells a busy thread
    from an idle one, and the count of ``cpu_s`` how many threads ran."""

    def __init__(self, rings: list[Ring]) -> None:
        self._rings = rings
        self._before: dict[int, tuple[int, int]] | None = None
        self._noted = False
        self.cpu_s: list[float] = []

    @property
    def begun(self) -> bool:
        return self._before is not None

    def begin(self) -> None:
        self._before = sq_thread_times(self._rings)

    def shares(self) -> list[float]:
        """The threads' shares, once (empty if the measured phase never began, or on a
        second call): the caller notes them as the worker's ``sq_thread_busy``."""
        if self._before is None or self._noted:
            return []
        self._noted = True
        after = sq_thread_times(self._rings)
        self.cpu_s = [round((total - self._before.get(pid, (0, 0))[0]) / 1e6, 3)
                      for pid, (total, _) in sorted(after.items())]
        return busy_shares(self._before, after)

    def facts(self) -> dict[str, list[float]]:
        """``sq_thread_busy`` and ``sq_thread_cpu_s`` for the result's engine facts, once
        (empty lists before the measured phase began, or on a second call)."""
        busy = self.shares()
        return {"sq_thread_busy": busy, "sq_thread_cpu_s": self.cpu_s if busy else []}


_EMPTY_U64 = np.empty(0, np.uint64)
_EMPTY_I32 = np.empty(0, np.int32)


def sqe_words(*, opcode: int, sqe_flags: int | np.ndarray, fd: np.ndarray, off: np.ndarray,
              addr: np.ndarray, length: int | np.ndarray, user_data: np.ndarray,
              buf_index: int = 0) -> np.ndarray:
    """Rows of 8 u64 words, one SQE each, for reads or writes (the opcode says which);
    every other field is zero."""
    k = len(off)
    words = np.zeros((k, 8), dtype=np.uint64)
    fd32 = np.asarray(fd, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    words[:, 0] = np.uint64(opcode) | (np.asarray(sqe_flags, dtype=np.uint64) << np.uint64(8)) \
        | (fd32 << np.uint64(32))
    words[:, 1] = off
    words[:, 2] = addr
    words[:, 3] = length
    words[:, 4] = user_data
    words[:, 5] = buf_index
    return words


@lru_cache(maxsize=1)
def probe() -> dict[str, Any]:
    """What io_uring offers here, found by creating tiny rings (cached per process)."""
    facts: dict[str, Any] = {"kernel": ".".join(map(str, kernel_version())),
                             "io_uring_disabled": io_uring_disabled()}
    try:
        with Ring(2) as r:
            facts["available"] = True
            facts["features"] = sorted(r.features)
    except UringError as e:
        return {**facts, "available": False, "reason": str(e)}
    for name, kwargs in (("sqpoll", {"sqpoll": True}), ("no_mmap", {"user_memory": True}),
                         ("no_sqarray", {"no_sqarray": True}), ("big", {"big": True})):
        try:
            with Ring(2, **kwargs):
                facts[name] = True
        except UringError as e:
            facts[name] = False
            facts[f"{name}_reason"] = str(e)
    return facts
