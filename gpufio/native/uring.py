"""io_uring's structs and its three system calls through ctypes (io/uring.py drives the
rings over them): io_uring_setup, io_uring_enter and io_uring_register, each returning the
kernel's result or -errno, as the raw system call does."""

from __future__ import annotations

import ctypes

import numpy as np

from gpufio.native import libc

SYS_SETUP, SYS_ENTER, SYS_REGISTER = 425, 426, 427
_U32 = ctypes.c_uint32
# struct iovec, for registering buffers
IOVEC = np.dtype({"names": ["base", "len"], "formats": ["<u8", "<u8"], "itemsize": 16})


class SqOffsets(ctypes.Structure):
    """struct io_sqring_offsets (40 bytes)."""

    _fields_ = [(n, _U32) for n in ("head", "tail", "ring_mask", "ring_entries", "flags",
                                    "dropped", "array", "resv1")] + [("user_addr", ctypes.c_uint64)]


class CqOffsets(ctypes.Structure):
    """struct io_cqring_offsets (40 bytes)."""

    _fields_ = [(n, _U32) for n in ("head", "tail", "ring_mask", "ring_entries", "overflow",
                                    "cqes", "flags", "resv1")] + [("user_addr", ctypes.c_uint64)]


class Params(ctypes.Structure):
    """struct io_uring_params (120 bytes)."""

    _fields_ = [(n, _U32) for n in ("sq_entries", "cq_entries", "flags", "sq_thread_cpu",
                                    "sq_thread_idle", "features", "wq_fd")] + [
        ("resv", _U32 * 3), ("sq_off", SqOffsets), ("cq_off", CqOffsets)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64)]


class GeteventsArg(ctypes.Structure):
    """struct io_uring_getevents_arg: lets io_uring_enter wait with a timeout."""

    _fields_ = [("sigmask", ctypes.c_uint64), ("sigmask_sz", _U32), ("min_wait_usec", _U32),
                ("ts", ctypes.c_uint64)]


class WaitArg:
    """One ring's getevents argument with its timespec (IORING_ENTER_EXT_ARG): ``address``
    and ``size`` go to ``enter``; ``set`` changes the timeout it carries."""

    size = ctypes.sizeof(GeteventsArg)

    def __init__(self) -> None:
        self._ts = _Timespec()
        self._arg = GeteventsArg(0, 0, 0, ctypes.addressof(self._ts))
        self.address = ctypes.addressof(self._arg)

    def set(self, timeout_ns: int) -> None:
        self._ts.tv_sec, self._ts.tv_nsec = divmod(timeout_ns, 1_000_000_000)


def setup(entries: int, params: Params) -> int:
    """io_uring_setup: the ring's descriptor, or -errno."""
    fd = libc.syscall(SYS_SETUP, entries, ctypes.addressof(params), 0, 0, 0, 0)
    return fd if fd >= 0 else -libc.errno()


def enter(fd: int, to_submit: int, min_complete: int, flags: int, arg: int, argsz: int) -> int:
    """io_uring_enter: its result, or -errno."""
    rc = libc.syscall(SYS_ENTER, fd, to_submit, min_complete, flags, arg, argsz)
    return rc if rc >= 0 else -libc.errno()


def register(fd: int, opcode: int, arg: int, n: int) -> int:
    """io_uring_register with ``arg`` an address of ``n`` entries: its result, or -errno."""
    rc = libc.syscall(SYS_REGISTER, fd, opcode, arg, n, 0, 0)
    return rc if rc >= 0 else -libc.errno()
