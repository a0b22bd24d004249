"""util-linux's libblkid through ctypes: the low-level probe of ``blkid -p`` and ``wipefs``
(superblocks, partition tables), for the write guard (core/guard.py)."""

from __future__ import annotations

import ctypes
import errno as errnos
import functools
from dataclasses import dataclass

from gpufio.native import libc

SONAME = "libblkid.so.1"
# libblkid's flags (blkid.h): what the superblocks chain reports, and that a superblock
# with a bad checksum is reported too (it is still someone's data)
_SUBLKS_TYPE, _SUBLKS_USAGE, _SUBLKS_BADCSUM = 1 << 5, 1 << 7, 1 << 10
_AMBIVALENT = -2


@dataclass(frozen=True)
class Found:
    """What one probe found: libblkid's PTTYPE, TYPE and USAGE values (None: not found),
    and whether more than one superblock was there (the first is named)."""

    pttype: str | None
    fstype: str | None
    usage: str | None
    ambivalent: bool


@functools.cache
def library() -> ctypes.CDLL | None:
    """libblkid with its functions typed, or None where it cannot be loaded."""
    lib = libc.load(SONAME)
    if lib is None:
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    for name, res, args in (
            ("blkid_new_probe", p, []),
            ("blkid_free_probe", None, [p]),
            ("blkid_probe_set_device", i, [p, i, ctypes.c_int64, ctypes.c_int64]),
            ("blkid_probe_enable_superblocks", i, [p, i]),
            ("blkid_probe_set_superblocks_flags", i, [p, i]),
            ("blkid_probe_enable_partitions", i, [p, i]),
            ("blkid_do_safeprobe", i, [p]),
            ("blkid_do_fullprobe", i, [p]),
            ("blkid_probe_lookup_value", i,
             [p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _value(lib: ctypes.CDLL, pr: int, name: str) -> str | None:
    data = ctypes.c_char_p()
    if lib.blkid_probe_lookup_value(pr, name.encode(), ctypes.byref(data), None) != 0:
        return None
    return (data.value or b"").decode(errors="replace")


def probe(lib: ctypes.CDLL, fd: int) -> Found:
    """What libblkid finds on the open file or device ``fd``, superblocks and partition
    tables, as ``blkid -p`` probes it; OSError where it cannot probe."""
    pr = lib.blkid_new_probe()
    if not pr:
        raise OSError(errnos.ENOMEM, "libblkid cannot make a probe")
    try:
        if lib.blkid_probe_set_device(pr, fd, 0, 0) != 0:
            raise OSError(libc.errno() or errnos.EIO, "libblkid cannot probe it")
        lib.blkid_probe_enable_superblocks(pr, 1)
        lib.blkid_probe_set_superblocks_flags(pr, _SUBLKS_TYPE | _SUBLKS_USAGE | _SUBLKS_BADCSUM)
        lib.blkid_probe_enable_partitions(pr, 1)
        rc = lib.blkid_do_safeprobe(pr)
        ambivalent = rc == _AMBIVALENT
        if ambivalent:
            rc = lib.blkid_do_fullprobe(pr)
        if rc < 0:
            raise OSError(libc.errno() or errnos.EIO, "libblkid's probe failed")
        return Found(_value(lib, pr, "PTTYPE"), _value(lib, pr, "TYPE"),
                     _value(lib, pr, "USAGE"), ambivalent)
    finally:
        lib.blkid_free_probe(pr)
