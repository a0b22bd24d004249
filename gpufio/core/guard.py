"""The write guard: gpufio writes only where no one's data can be lost.

fio's libcufile engine once deleted its users' data files (fio #1213); a benchmark that writes
must never be the tool that destroys a filesystem. A job may write to:

- a file that carries gpufio's pattern header (gpufio made it), or any other file when the
  job says ``overwrite = true``;
- a block device only when the job names that very device in ``write_device`` (by any of
  its names: an NVMe multipath head and its paths, or one shared namespace seen through
  several controllers, are one device, found by ``device_identity``), and the
  device holds no partition table, filesystem, LVM, RAID, crypt or swap signature (the magic
  numbers below, checked here rather than trusted to a library that may be missing), is not
  mounted, holds no partitions, has no holders (device-mapper, md) under any of its names,
  and opens with O_EXCL.

Read-only files and mounts are refused too. Every refusal is one line naming the target and
what was found.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.facts.device import read_text
from gpufio.facts.nvme import same_namespace

if TYPE_CHECKING:
    from gpufio.core.job import Job

# How much of a device's start the signatures need (btrfs' superblock sits at 64 KiB).
HEAD_BYTES = 128 << 10
# (offset, magic bytes, what it is)
_MAGICS: tuple[tuple[int, bytes, str], ...] = (
    (512, b"EFI PART", "a GPT partition table"),
    (4096, b"EFI PART", "a GPT partition table"),
    (1024 + 56, b"\x53\xef", "an ext2/3/4 filesystem superblock"),
    (0, b"XFSB", "an XFS filesystem"),
    (65536 + 64, b"_BHRfS_M", "a btrfs filesystem"),
    (3, b"NTFS    ", "an NTFS filesystem"),
    (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    (0, b"hsqs", "a squashfs filesystem"),
    (32769, b"CD001", "an ISO 9660 filesystem"),
    (4096, b"\xfc\x4e\x2b\xa9", "a Linux RAID (md) member, superblock 1.2"),
    (0, b"\xfc\x4e\x2b\xa9", "a Linux RAID (md) member, superblock 1.1"),
    (1024, b"\x10\x20\xf5\xf2", "an F2FS filesystem"),
) + tuple((512 * k, b"LABELONE", "an LVM physical volume") for k in range(4)) + tuple(
    (page - 10, magic, "a swap area") for page in (4096, 8192, 16384, 65536)
    for magic in (b"SWAPSPACE2", b"SWAP-SPACE"))


def signatures(head: bytes, tail: bytes = b"") -> list[str]:
    """What the first bytes of a file or device (``head``, up to HEAD_BYTES) say it holds:
    partition tables, filesystems, volume labels; ``tail`` is its last 128 KiB (md RAID
    superblocks 0.90 and 1.0 live at the end). Empty: nothing recognised."""
    found = []
    for off, magic, what in _MAGICS:
        if head[off:off + len(magic)] == magic and what not in found:
            found.append(what)
    if len(head) >= 512 and head[510:512] == b"\x55\xaa" and not found:
        # an MBR (or a FAT boot sector, which carries the same signature)
        found.append("an MBR partition table or boot sector")
    md_magic = b"\xfc\x4e\x2b\xa9"
    if tail and md_magic in (tail[-65536:-65532], tail[-8192:-8188]):
        found.append("a Linux RAID (md) member, superblock 0.90/1.0")
    return found


def _read_ends(fd: int, size: int) -> tuple[bytes, bytes]:
    head = os.pread(fd, HEAD_BYTES, 0)
    tail = os.pread(fd, HEAD_BYTES, max(size - HEAD_BYTES, 0)) if size > HEAD_BYTES else b""
    return head, tail


def _check_mount(path: str) -> None:
    try:
        vfs = os.statvfs(path)
    except OSError:
        return
    if vfs.f_flag & os.ST_RDONLY:
        raise BadInput(f"target {path}: lies on a read-only mount; gpufio cannot write to it")


def _mounted_number(number: str) -> str | None:
    """The mount point of the block device numbered ``number`` ("major:minor"), if mounted."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == number:
            return fields[4]
    return None


def _swapped(path: str) -> bool:
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return False
    real = os.path.realpath(path)
    return any(line.split()[0] == real for line in lines if line.split())


def check_file(path: str, *, overwrite: bool) -> None:
    """BadInput unless the job may write to the regular file ``path``."""
    _check_mount(path)
    if not os.access(path, os.W_OK):
        raise BadInput(f"target {path}: is not writable (permission denied or read-only)")
    try:
        with open(path, "rb", buffering=0) as f:
            head, tail = _read_ends(f.fileno(), os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise BadInput(f"target {path}: cannot read it to check it before writing: "
                       f"{e.strerror}") from None
    if pattern.read_seed(head[:pattern.BLOCK]) is not None or overwrite:
        return
    found = signatures(head, tail)
    what = f"holds {found[0]}" if found else "does not carry gpufio's pattern"
    raise BadInput(f"target {path}: {what}; gpufio writes only to files it made, unless the "
                   "job says overwrite = true (the file's data is then lost)")


def device_identity(path: str, sys_block: Path = Path("/sys/block")) -> tuple[str, list[Path]]:
    """What block device ``path`` is to the guard: a key that every name of one device shares
    (an NVMe namespace's wwid: a multipath head and its paths, or a shared namespace seen
    through each controller when native multipath is off; else the device number) and the
    sysfs directories of all those names."""
    rdev = os.stat(path).st_rdev
    number = f"{os.major(rdev)}:{os.minor(rdev)}"
    node = Path(f"/sys/dev/block/{number}")
    if not node.exists():
        return number, []
    disk = sys_block / node.resolve().name
    if not disk.exists():  # a partition: /sys/block lists whole disks only
        return number, [node.resolve()]
    members = same_namespace(disk, sys_block)
    wwid = read_text(disk / "wwid") if disk.name.startswith("nvme") else None
    return (f"wwid {wwid}" if wwid else number), members


def _confirmed_is(confirmed: str | None, path: str, key: str) -> bool:
    """Whether write_device ``confirmed`` names the device ``path`` is (any of its names)."""
    if confirmed is None:
        return False
    if os.path.realpath(confirmed) == os.path.realpath(path):
        return True
    try:
        return stat.S_ISBLK(os.stat(confirmed).st_mode) and device_identity(confirmed)[0] == key
    except OSError:
        return False


def _check_in_use(path: str, members: list[Path]) -> None:
    """BadInput if any name of the device is mounted, swap, held or partitioned."""
    for disk in members:
        number = read_text(disk / "dev") or ""
        where = _mounted_number(number)
        through = "" if os.path.basename(os.path.realpath(path)) == disk.name \
            else f" (through {disk.name}, the same device)"
        if where:
            raise BadInput(f"target {path}: is mounted on {where}{through}; gpufio never writes "
                           "to a mounted device")
        if _swapped(f"/dev/{disk.name}"):
            raise BadInput(f"target {path}: is in use as swap{through}; gpufio never writes "
                           "to it")
        holders = sorted(p.name for p in (disk / "holders").glob("*"))
        if holders:
            raise BadInput(f"target {path}: is held by {', '.join(holders)}{through} "
                           "(device-mapper, LVM or RAID); gpufio never writes under them")
        parts = sorted(p.name for p in disk.glob(f"{disk.name}*") if (p / "partition").exists())
        if parts:
            raise BadInput(f"target {path}: has partitions ({', '.join(parts)}){through}; "
                           "gpufio writes only to a device that holds none")


def check_device(path: str, *, confirmed: str | None) -> None:
    """BadInput naming what makes block device ``path`` unsafe to write, if anything;
    ``confirmed`` is the job's write_device, which must name this device (by any of its
    names: a multipath head and its paths are one device). The checks read it through an
    O_EXCL descriptor, which the kernel refuses while anyone holds it."""
    real = os.path.realpath(path)
    key, members = device_identity(real)
    if not _confirmed_is(confirmed, real, key):
        raise BadInput(f"target {path}: is a block device, and writing destroys what it "
                       f"holds; confirm with write_device = \"{path}\"")
    if not members:  # no sysfs entry: the key is the device number
        where = _mounted_number(key)
        if where:
            raise BadInput(f"target {path}: is mounted on {where}; gpufio never writes to a "
                           "mounted device")
    _check_in_use(path, members)
    try:
        fd = os.open(real, os.O_RDWR | os.O_EXCL)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise BadInput(f"target {path}: is in use (O_EXCL open: device busy); gpufio "
                           "never writes to a device someone holds") from None
        raise BadInput(f"target {path}: cannot open for writing: {e.strerror}") from None
    try:
        if not stat.S_ISBLK(os.fstat(fd).st_mode):
            raise BadInput(f"target {path}: is not a block device")
        head, tail = _read_ends(fd, os.lseek(fd, 0, os.SEEK_END))
        found = signatures(head, tail)
        if found:
            raise BadInput(f"target {path}: holds {found[0]}; gpufio never writes over it "
                           "(wipe it yourself first, e.g. wipefs -a, if the data may go)")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class WriteConsent:
    """What a job that writes has said about its targets: overwrite, write_device."""

    overwrite: bool
    device: str | None

    @classmethod
    def of(cls, job: "Job") -> "WriteConsent | None":
        """The consent of a job that writes (its I/O or its preconditioning), else None."""
        if not job.writes and job.precondition == "none":
            return None
        return cls(job.overwrite, job.write_device)

    def check(self, path: str, is_block: bool) -> None:
        """BadInput unless the job may write to ``path`` (see the module's rules)."""
        if is_block:
            check_device(path, confirmed=self.device)
        else:
            check_file(path, overwrite=self.overwrite)
