"""Which bytes of a file its filesystem holds data for: the file's extents by FIEMAP (written,
or allocated but unwritten as fallocate leaves them), else SEEK_DATA/SEEK_HOLE, else the
blocks stat counts. A read of a hole or of an unwritten extent returns zeros without
touching the drive, so these bytes say how much of a read range reaches storage.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
_HEADER = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
_EXTENT_LAST = 0x1
_EXTENT_UNWRITTEN = 0x800
_BATCH = 256  # extents asked for per ioctl


@dataclass(frozen=True)
class Coverage:
    """What a byte range of a file holds: ``written`` bytes have data on the filesystem,
    ``unwritten`` are allocated without data (fallocate), ``holes`` have nothing (sparse);
    ``method`` says how it was found (fiemap, seek, st_blocks: an estimate over the whole
    file, since st_blocks places no byte)."""

    length: int
    written: int
    unwritten: int
    method: str

    @property
    def holes(self) -> int:
        """Bytes of the range with neither data nor an allocation."""
        return self.length - self.written - self.unwritten

    @property
    def backed(self) -> float:
        """The fraction of the range with data on the filesystem (1.0 for an empty range)."""
        return self.written / self.length if self.length else 1.0


def _fiemap(fd: int, start: int, end: int) -> tuple[int, int] | None:
    """(written, unwritten) bytes of [start, end) by FIEMAP; None where the filesystem
    has no FIEMAP (tmpfs, network filesystems)."""
    written = unwritten = 0
    pos = start
    while pos < end:
        buf = bytearray(_HEADER.size + _BATCH * _EXTENT.size)
        _HEADER.pack_into(buf, 0, pos, end - pos, 0, 0, _BATCH, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS):
                return None
            raise
        mapped = _HEADER.unpack_from(buf, 0)[3]
        if mapped == 0:
            break
        for i in range(mapped):
            logical, _, length, _, _, flags, *_ = _EXTENT.unpack_from(
                buf, _HEADER.size + i * _EXTENT.size)
            lo, hi = max(logical, pos), min(logical + length, end)
            if hi > lo:
                if flags & _EXTENT_UNWRITTEN:
                    unwritten += hi - lo
                else:
                    written += hi - lo
            last = flags & _EXTENT_LAST
        pos = max(pos, logical + length)
        if last:
            break
    return written, unwritten


def _seek(fd: int, start: int, end: int) -> int | None:
    """Bytes of [start, end) with data by SEEK_DATA/SEEK_HOLE (unwritten extents count as
    holes there); None where lseek knows neither."""
    written, pos = 0, start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past pos
                break
            if e.errno == errno.EINVAL:
                return None
            raise
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        written += hole - data
        pos = hole
    return written


def coverage(path: str, start: int = 0, length: int | None = None) -> Coverage:
    """What bytes [start, start + length) of the regular file ``path`` hold (``length``
    None: to its end; the range is cut at the end of the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        end = st.st_size if length is None else min(st.st_size, start + length)
        start = min(start, end)
        found = _fiemap(fd, start, end)
        if found is not None:
            return Coverage(end - start, found[0], found[1], "fiemap")
        written = _seek(fd, start, end)
        if written is not None:
            return Coverage(end - start, written, 0, "seek")
        share = min(1.0, st.st_blocks * 512 / st.st_size) if st.st_size else 1.0
        return Coverage(end - start, round((end - start) * share), 0, "st_blocks")
    finally:
        os.close(fd)
