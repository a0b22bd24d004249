"""libc through ctypes: the system calls and functions gpufio makes itself (syscall(2) for
io_uring, prctl(2), statx(2)), each with its errno, and loading a shared library by name."""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

LIBC = ctypes.CDLL(None, use_errno=True)
syscall = LIBC.syscall
syscall.restype = ctypes.c_long
# syscall(2) is variadic: declaring every argument a C long makes ctypes widen each integer
# to 64 bits. Passed as 32-bit ints, the upper half of an argument register is undefined and
# io_uring_enter sees a garbage argsz (EINVAL). Pointers travel as addresses.
syscall.argtypes = [ctypes.c_long] * 7

_STATX_DIOALIGN = 0x2000
_AT_FDCWD = -100


class _Statx(ctypes.Structure):
    """struct statx up to the direct-I/O alignment fields (Linux 6.1+), padded to 256 bytes."""

    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("pad0", ctypes.c_uint8 * 144), ("dio_mem_align", ctypes.c_uint32),
                ("dio_offset_align", ctypes.c_uint32), ("pad1", ctypes.c_uint8 * 96)]


def errno() -> int:
    """The errno the last call through this layer left (ctypes keeps it per thread)."""
    return ctypes.get_errno()


def load(name: str) -> ctypes.CDLL | None:
    """The shared library ``name`` (a soname or a path), its errno kept; None where it
    cannot be loaded."""
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def prctl(option: int, arg: int) -> int:
    """prctl(option, arg, 0, 0, 0)."""
    return LIBC.prctl(option, arg, 0, 0, 0)


def dio_alignment(path: str) -> tuple[int, int] | None:
    """(memory, offset) alignment O_DIRECT needs on ``path``, from statx; None if unknown
    (no statx in this libc, or a kernel or filesystem that does not report it)."""
    if not _has_statx():
        return None
    buf = _Statx()
    rc = LIBC.statx(_AT_FDCWD, os.fsencode(path), 0, _STATX_DIOALIGN, ctypes.byref(buf))
    if rc != 0 or not buf.mask & _STATX_DIOALIGN or buf.dio_offset_align == 0:
        return None
    return buf.dio_mem_align, buf.dio_offset_align


@lru_cache(maxsize=1)
def _has_statx() -> bool:
    return hasattr(LIBC, "statx")
