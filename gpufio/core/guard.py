"""The write guard: gpufio writes only where no one's data can be lost.

fio's libcufile engine once deleted its users' data files (fio #1213); a benchmark that writes
must never be the tool that destroys a filesystem. A job may write to:

- a file that carries gpufio's pattern header (gpufio made it), or any other file when the
  job says ``overwrite = true``;
- a block device only when the job names that very device in ``write_device`` (the identity
  step: ``same_device``; by any of its names: an NVMe multipath head and its paths, or one
  shared namespace seen through several controllers, are one device, ``device_identity``), the
  device is not mounted, not swap, holds no partitions, has no
  holders (device-mapper, md, bcache) and opens with O_EXCL, and the signature probe finds
  nothing on it: util-linux's libblkid (the low-level probe of ``blkid -p`` and ``wipefs``,
  which knows every filesystem, RAID, LVM, crypt, cache and swap superblock and every
  partition table), then gpufio's own list of magic numbers, which also catches what libblkid
  passes over for a bad checksum (a damaged GPT is still someone's disk) and stands alone where
  libblkid.so.1 is missing.

Read-only files and mounts are refused too. Every refusal is one line naming the target and
what was found, in libblkid's names (``TYPE="vfat"``, ``PTTYPE="gpt"``).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.facts.device import read_text
from gpufio.facts.nvme import same_namespace
from gpufio.native import blkid

if TYPE_CHECKING:
    from gpufio.core.job import Job


@dataclass(frozen=True)
class Signature:
    """One thing a probe found: what kind of thing (words), and its name as libblkid gives
    it under ``key`` (TYPE for superblocks, PTTYPE for partition tables)."""

    kind: str
    key: str
    name: str

    def __str__(self) -> str:
        return f'{self.kind} ({self.key}="{self.name}")' if self.key else self.kind


def _fs(name: str) -> Signature:
    return Signature("a filesystem", "TYPE", name)


# libblkid's USAGE values, in words
_USAGE = {"filesystem": "a filesystem", "raid": "a RAID or volume-manager member",
          "crypto": "an encrypted volume", "other": "a device signature"}
_GPT = Signature("a partition table", "PTTYPE", "gpt")
_MD = Signature(_USAGE["raid"], "TYPE", "linux_raid_member")
_FAT = Signature("a filesystem", "TYPE", "vfat")

# The fallback where libblkid is missing. How much of a device's start the magics need
# (btrfs' superblock sits at 64 KiB), and (offset, magic bytes, what it is) in libblkid's names.
HEAD_BYTES = 128 << 10
_MAGICS: tuple[tuple[int, bytes, Signature], ...] = (
    (512, b"EFI PART", _GPT),
    (4096, b"EFI PART", _GPT),
    (1024 + 56, b"\x53\xef", _fs("ext2/ext3/ext4")),
    (0, b"XFSB", _fs("xfs")),
    (65536 + 64, b"_BHRfS_M", _fs("btrfs")),
    (3, b"NTFS    ", _fs("ntfs")),
    (3, b"EXFAT   ", _fs("exfat")),
    (54, b"FAT12   ", _FAT),
    (54, b"FAT16   ", _FAT),
    (82, b"FAT32   ", _FAT),
    (0, b"LUKS\xba\xbe", Signature(_USAGE["crypto"], "TYPE", "crypto_LUKS")),
    (0, b"hsqs", _fs("squashfs")),
    (32769, b"CD001", _fs("iso9660")),
    (4096, b"\xfc\x4e\x2b\xa9", _MD),  # md superblock 1.2
    (0, b"\xfc\x4e\x2b\xa9", _MD),  # md superblock 1.1
    (1024, b"\x10\x20\xf5\xf2", _fs("f2fs")),
    (1024 + 6, b"\x34\x34", _fs("nilfs2")),
    (32768, b"JFS1", _fs("jfs")),
    (32769, b"BEA01", _fs("udf")),
    (1024 + 24, b"\x5a\x4d", _fs("minix")),  # minix v3; v1 and v2 below
    # bcache's superblock at 4 KiB: checksum, offset and version, then the magic
    (4096 + 24, bytes.fromhex("c68573f64e1a45ca8265f57f48ba6d81"),
     Signature(_USAGE["other"], "TYPE", "bcache")),
) + tuple((512 * k, b"LABELONE", Signature(_USAGE["raid"], "TYPE", "LVM2_member"))
          for k in range(4)) + tuple(
    (page - 10, magic, Signature(_USAGE["other"], "TYPE", "swap"))
    for page in (4096, 8192, 16384, 65536) for magic in (b"SWAPSPACE2", b"SWAP-SPACE")) + tuple(
    (1024 + 16, magic, _fs("minix")) for magic in (b"\x7f\x13", b"\x8f\x13", b"\x68\x24",
                                                   b"\x78\x24"))


def signatures(head: bytes, tail: bytes = b"") -> list[Signature]:
    """What gpufio's own list finds in the first bytes of a file or device (``head``, up to
    HEAD_BYTES) and its last 128 KiB (``tail``: md superblocks 0.90 and 1.0 live at the
    end). Empty: nothing recognised."""
    found: list[Signature] = []
    for off, magic, what in _MAGICS:
        if head[off:off + len(magic)] == magic and what not in found:
            found.append(what)
    if len(head) >= 512 and head[510:512] == b"\x55\xaa" and not found:
        # a boot sector's mark without a FAT or NTFS behind it: an MBR
        found.append(Signature("a partition table", "PTTYPE", "dos"))
    md_magic = b"\xfc\x4e\x2b\xa9"
    if tail and md_magic in (tail[-65536:-65532], tail[-8192:-8188]) and _MD not in found:
        found.append(_MD)
    return found


def _read_ends(fd: int, size: int) -> tuple[bytes, bytes]:
    head = os.pread(fd, HEAD_BYTES, 0)
    tail = os.pread(fd, HEAD_BYTES, max(size - HEAD_BYTES, 0)) if size > HEAD_BYTES else b""
    return head, tail


LIBBLKID = blkid.SONAME


def _libblkid() -> Any:
    """util-linux's libblkid, or None where it cannot be loaded (native/blkid.py)."""
    return blkid.library()


def blkid_signatures(lib: Any, fd: int) -> list[Signature]:
    """What libblkid finds on the open file or device ``fd``, as ``blkid -p`` probes it:
    superblocks and partition tables. An ambivalent result (more than one superblock) is
    refused like any other, naming the first that libblkid finds."""
    got = blkid.probe(lib, fd)
    found = []
    if got.pttype:
        found.append(Signature("a partition table", "PTTYPE", got.pttype))
    if got.fstype:
        found.append(Signature(_USAGE.get(got.usage or "other", _USAGE["other"]), "TYPE",
                               got.fstype))
    if got.ambivalent:
        found.append(Signature("other superblocks (wipefs -n lists them)", "", ""))
    return found


def probe(fd: int) -> tuple[list[Signature], str]:
    """What the open file or device ``fd`` holds, and who found it: libblkid, then gpufio's
    own list. The own list is asked even where libblkid finds nothing: libblkid checks
    checksums, so a damaged superblock or GPT (bad CRC, a half-wiped header) passes it, and
    a device that still carries one is someone's data all the same."""
    lib = _libblkid()
    if lib is not None:
        found = blkid_signatures(lib, fd)
        if found:
            return found, "found by libblkid"
    head, tail = _read_ends(fd, os.lseek(fd, 0, os.SEEK_END))
    where = "libblkid reports nothing (a damaged signature)" if lib is not None \
        else f"no {LIBBLKID} here"
    return signatures(head, tail), f"found by gpufio's own list: {where}"


def _found(path: str, fd: int) -> str | None:
    """'holds ...' for what the probe finds on ``fd``, or None; BadInput if it cannot probe."""
    try:
        found, source = probe(fd)
    except OSError as e:
        raise BadInput(f"target {path}: cannot read it to check it before writing: "
                       f"{e.strerror}") from None
    if not found:
        return None
    return f"holds {' and '.join(map(str, found))}, {source}"


def _check_mount(path: str) -> None:
    try:
        vfs = os.statvfs(path)
    except OSError:
        return
    if vfs.f_flag & os.ST_RDONLY:
        raise BadInput(f"target {path}: lies on a read-only mount; gpufio cannot write to it")


def _mounted(want: str) -> str | None:
    """The mount point of the block device numbered ``want`` ("major:minor"), if mounted."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == want:
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
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise BadInput(f"target {path}: cannot read it to check it before writing: "
                       f"{e.strerror}") from None
    try:
        if overwrite or pattern.read_seed(os.pread(fd, pattern.BLOCK, 0)) is not None:
            return
        what = _found(path, fd) or "does not carry gpufio's pattern"
    finally:
        os.close(fd)
    raise BadInput(f"target {path}: {what}; gpufio writes only to files it made, unless the "
                   "job says overwrite = true (the file's data is then lost)")


def _device_number(path: str) -> int | None:
    """The device number of block device ``path``, None if it is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISBLK(st.st_mode) else None


def _numbered(rdev: int) -> str:
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def device_identity(path: str, sys_block: Path = Path("/sys/block")) -> tuple[str, list[Path]]:
    """What block device ``path`` is to the guard: a key that every name of one device shares
    (an NVMe namespace's wwid: a multipath head and its paths, or a shared namespace seen
    through each controller when native multipath is off; else the device number) and the
    sysfs directories of all those names."""
    number = _numbered(os.stat(path).st_rdev)
    node = Path(f"/sys/dev/block/{number}")
    if not node.exists():
        return number, []
    disk = sys_block / node.resolve().name
    if not disk.exists():  # a partition: /sys/block lists whole disks only
        return number, [node.resolve()]
    wwid = read_text(disk / "wwid") if disk.name.startswith("nvme") else None
    return (f"wwid {wwid}" if wwid else number), same_namespace(disk, sys_block)


def same_device(target: str, confirmed: str) -> bool:
    """Whether ``confirmed`` (a job's write_device) names the block device ``target``: the
    same device number whatever the path (a /dev/disk/by-id link names it too), or another
    name of the same device (an NVMe multipath head and its paths)."""
    rdev = _device_number(confirmed)
    if rdev is None or _device_number(target) is None:
        return False
    return rdev == _device_number(target) or \
        device_identity(confirmed)[0] == device_identity(target)[0]


def check_identity(path: str, confirmed: str | None) -> None:
    """The identity step: BadInput unless write_device (``confirmed``) names the block
    device ``path``, saying which device it names and which the target is."""
    if confirmed is None:
        raise BadInput(f"target {path}: is a block device, and writing destroys what it "
                       f"holds; confirm with write_device = \"{path}\"")
    if same_device(path, confirmed):
        return
    rdev, mine = _device_number(confirmed), _device_number(path)
    if rdev is not None:
        names = f"block device {_numbered(rdev)}"
    else:
        names = "no block device" if os.path.lexists(confirmed) else "nothing that exists"
    target = f"block device {_numbered(mine)}" if mine is not None else "a block device"
    raise BadInput(f"target {path}: write_device names {confirmed} ({names}), but the target "
                   f"is {path} ({target}); confirm with write_device = \"{path}\"")


def check_not_in_use(path: str) -> None:
    """BadInput if block device ``path``, under any of its names (a multipath head and its
    paths), is mounted, swap, partitioned or held by another device (device-mapper, md,
    bcache)."""
    real = os.path.realpath(path)
    members = device_identity(real)[1]
    number = _numbered(os.stat(real).st_rdev)
    check_names_free(path, members or [Path(f"/sys/dev/block/{number}")])


def check_names_free(path: str, members: list[Path]) -> None:
    """check_not_in_use over the sysfs directories ``members`` of every name of the device."""
    real = os.path.realpath(path)
    for disk in members:
        name = disk.resolve().name if disk.exists() else os.path.basename(real)
        through = "" if name == os.path.basename(real) else f" (through {name}, the same device)"
        where = _mounted(read_text(disk / "dev") or "")
        if where:
            raise BadInput(f"target {path}: is mounted on {where}{through}; gpufio never "
                           "writes to a mounted device")
        if _swapped(f"/dev/{name}"):
            raise BadInput(f"target {path}: is in use as swap{through}; gpufio never writes "
                           "to it")
        holders = sorted(p.name for p in (disk / "holders").glob("*")) if disk.exists() else []
        if holders:
            raise BadInput(f"target {path}: is held by {', '.join(holders)}{through} "
                           "(device-mapper, LVM, RAID or bcache); gpufio never writes under them")
        parts = sorted(p.name for p in disk.glob(f"{name}*") if (p / "partition").exists()) \
            if disk.exists() else []
        if parts:
            raise BadInput(f"target {path}: has partitions ({', '.join(parts)}){through}; "
                           "gpufio writes only to a device that holds none")


def check_signatures(path: str, fd: int) -> None:
    """The signature probe: BadInput naming what the device open on ``fd`` holds, if the
    probe recognises anything on it."""
    found = _found(path, fd)
    if found:
        raise BadInput(f"target {path}: {found}; gpufio never writes over it (wipe it "
                       "yourself first, e.g. wipefs -a, if the data may go)")


def check_device(path: str, *, confirmed: str | None) -> None:
    """BadInput naming what makes block device ``path`` unsafe to write, if anything;
    ``confirmed`` is the job's write_device, which must name this very device. The probe
    reads it through an O_EXCL descriptor, which the kernel refuses while anyone holds it."""
    check_identity(path, confirmed)
    check_not_in_use(path)
    try:
        fd = os.open(os.path.realpath(path), os.O_RDWR | os.O_EXCL)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise BadInput(f"target {path}: is in use (O_EXCL open: device busy); gpufio "
                           "never writes to a device someone holds") from None
        raise BadInput(f"target {path}: cannot open for writing: {e.strerror}") from None
    try:
        if not stat.S_ISBLK(os.fstat(fd).st_mode):
            raise BadInput(f"target {path}: is not a block device")
        check_signatures(path, fd)
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
