"""NVMe generic char devices (/dev/ngXnY): which namespace one is, and what passthrough needs.

The kernel gives every NVMe namespace a char device beside its block device (Linux 5.13+):
``ngXnY`` for ``nvmeXnY``, ``ngXcYnZ`` for a multipath path ``nvmeXcYnZ``, the same numbers
in both names. io_uring passthrough (IORING_OP_URING_CMD) works only on the char device; its
facts (namespace id, logical block size, size, poll queues) are the block device's, read
from sysfs, and the namespace id also from the descriptor (NVME_IOCTL_ID). Readings that are
missing give None: the caller says what that means for its job.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpufio.facts.device import read_int, read_text

SYS = Path("/sys")
_GENERIC = re.compile(r"ng(\d+(?:c\d+)?n\d+)")
_BLOCK = re.compile(r"nvme(\d+(?:c\d+)?n\d+)")
NVME_IOCTL_ID = 0x4E40  # _IO('N', 0x40): the descriptor's namespace id


@dataclass(frozen=True)
class Namespace:
    """An NVMe namespace as passthrough sees it: its char and block device, facts from sysfs."""

    generic: str          # /dev/ngXnY
    block: str            # /dev/nvmeXnY
    nsid: int | None
    lba_bytes: int | None
    size: int | None      # bytes
    poll_queues: bool     # the block queue polls (io_poll 1): nvme.poll_queues > 0
    max_bytes: int | None  # the largest transfer (max_hw_sectors_kb)


def _devnum(path: str) -> tuple[str, int] | None:
    """('char' or 'block', st_rdev) of a device node, None for anything else."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return "char", st.st_rdev
    if stat.S_ISBLK(st.st_mode):
        return "block", st.st_rdev
    return None


def _sys_dev(cls_dir: Path) -> str | None:
    return read_text(cls_dir / "dev")


def lookup(path: str, sys: Path = SYS) -> Namespace | None:
    """The namespace of an NVMe generic char device or NVMe namespace block device (its
    nodes in /dev), or None when ``path`` is neither; sysfs decides, not the name alone: a
    node's device number must be the one sysfs gives the name."""
    node = _devnum(path)
    if node is None:
        return None
    kind, rdev = node
    name = os.path.basename(os.path.realpath(path))
    want = f"{os.major(rdev)}:{os.minor(rdev)}"
    m = (_GENERIC if kind == "char" else _BLOCK).fullmatch(name)
    if m is None:
        return None
    suffix = m.group(1)
    gen_dir, blk_dir = sys / "class/nvme-generic" / f"ng{suffix}", sys / "block" / f"nvme{suffix}"
    if _sys_dev(gen_dir if kind == "char" else blk_dir) != want:
        return None
    if not gen_dir.exists() or not blk_dir.exists():
        return None
    dev = Path(os.path.dirname(os.path.realpath(path)))
    lba = read_int(blk_dir / "queue/logical_block_size")
    sectors = read_int(blk_dir / "size")
    max_kb = read_int(blk_dir / "queue/max_hw_sectors_kb")
    return Namespace(generic=str(dev / f"ng{suffix}"), block=str(dev / f"nvme{suffix}"),
                     nsid=read_int(blk_dir / "nsid"), lba_bytes=lba,
                     size=None if sectors is None else sectors * 512,
                     poll_queues=read_text(blk_dir / "queue/io_poll") == "1",
                     max_bytes=None if max_kb is None else max_kb << 10)


def namespace_id(fd: int) -> int:
    """The namespace id of an open NVMe char or block device (NVME_IOCTL_ID); OSError if the
    descriptor is no NVMe namespace."""
    return fcntl.ioctl(fd, NVME_IOCTL_ID)


def generic_devices(dev: str = "/dev") -> list[str]:
    """The NVMe generic char devices present, sorted."""
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted(os.path.join(dev, n) for n in names if _GENERIC.fullmatch(n))
