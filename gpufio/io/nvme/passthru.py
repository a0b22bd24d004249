"""NVMe I/O commands in io_uring passthrough entries, defined once for the CPU and the GPU.

A passthrough entry is a 128-byte SQE (IORING_SETUP_SQE128) whose opcode is
IORING_OP_URING_CMD, whose ``cmd_op`` is NVME_URING_CMD_IO and whose last 80 bytes carry
``struct nvme_uring_cmd`` (linux/nvme_ioctl.h): the NVMe command the kernel hands to the
namespace's queue without the block layer. ``SQE128_FIELDS`` is the one layout: the CPU
builder (``build``) makes a numpy dtype of it, and the CUDA builder (kernels/gio_queue.cuh,
``pt_sqe``) gets every field's offset and width as NVRTC macros (``defines``), so the two can
only disagree if a test catches it (tests/test_nvme_cmd.py against the C headers, and the
GPU test that compares their bytes).

A read or write of ``length`` bytes at byte ``off`` of a namespace with ``lba`` byte blocks
is the NVMe command: opcode 0x02 (read) or 0x01 (write), nsid, cdw10/cdw11 = the starting
LBA (low, high 32 bits), cdw12 = the number of blocks minus one, addr/data_len = the buffer.
Its completion (a 32-byte CQE, IORING_SETUP_CQE32) carries 0, the NVMe status (positive:
status code type << 8 | status code, with the More and Do-Not-Retry bits above), or -errno
from the kernel; ``result`` turns it into gpufio's bytes-or-negative-code convention.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.facts import nvme_generic

if TYPE_CHECKING:
    from gpufio.facts.system import Host

OP_URING_CMD = 46  # IORING_OP_URING_CMD (Linux 5.19)
URING_CMD_FIXED = 1 << 0  # IORING_URING_CMD_FIXED: addr lies in registered buffer buf_index
SQE_BYTES, CQE_BYTES = 128, 32

NVME_FLUSH, NVME_WRITE, NVME_READ = 0x00, 0x01, 0x02
CMD_BYTES = 72  # sizeof(struct nvme_uring_cmd)


def _ioc(direction: int, kind: str, nr: int, size: int) -> int:
    """Linux's _IOC(dir, type, nr, size) on x86-64 and arm64."""
    return direction << 30 | size << 16 | ord(kind) << 8 | nr


NVME_URING_CMD_IO = _ioc(3, "N", 0x80, CMD_BYTES)  # _IOWR('N', 0x80, struct nvme_uring_cmd)

# (field, byte offset, bytes) of a 128-byte URING_CMD SQE carrying an NVMe I/O command; the
# nvme_ fields are struct nvme_uring_cmd at the SQE's cmd area (byte 48). Unlisted bytes are 0.
SQE128_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("opcode", 0, 1), ("flags", 1, 1), ("ioprio", 2, 2), ("fd", 4, 4),
    ("cmd_op", 8, 4), ("uring_cmd_flags", 28, 4), ("user_data", 32, 8), ("buf_index", 40, 2),
    ("nvme_opcode", 48, 1), ("nvme_flags", 49, 1), ("nsid", 52, 4), ("metadata", 64, 8),
    ("addr", 72, 8), ("metadata_len", 80, 4), ("data_len", 84, 4), ("cdw10", 88, 4),
    ("cdw11", 92, 4), ("cdw12", 96, 4), ("cdw13", 100, 4), ("timeout_ms", 112, 4),
)
CMD_OFFSET = 48  # where struct nvme_uring_cmd starts in the SQE

_KIND = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}
SQE128_DTYPE = np.dtype({"names": [f for f, _, _ in SQE128_FIELDS],
                         "formats": [_KIND[n] for _, _, n in SQE128_FIELDS],
                         "offsets": [o for _, o, _ in SQE128_FIELDS], "itemsize": SQE_BYTES})

# gpufio's result code of an I/O the drive failed: NVME_STATUS_BASE + (SCT << 8 | SC), above
# every errno (Linux's MAX_ERRNO is 4095), so results keep errnos and NVMe statuses apart
NVME_STATUS_BASE = 4096
STATUS_MASK = 0x7FF  # status code type and status code; More and DNR say nothing of the cause
STATUS_CODES = NVME_STATUS_BASE + STATUS_MASK + 1  # how many result codes there can be

# NVMe base specification, status codes by (status code type, status code): the common ones
_STATUS_NAMES = {
    (0, 0x01): "invalid command opcode", (0, 0x02): "invalid field in command",
    (0, 0x04): "data transfer error", (0, 0x06): "internal error",
    (0, 0x07): "command abort requested", (0, 0x0B): "invalid namespace or format",
    (0, 0x80): "LBA out of range", (0, 0x81): "capacity exceeded",
    (0, 0x82): "namespace not ready", (2, 0x80): "write fault",
    (2, 0x81): "unrecovered read error", (2, 0x82): "end-to-end guard check error",
    (2, 0x85): "compare failure", (2, 0x86): "access denied",
}
_TYPES = {0: "generic", 1: "command specific", 2: "media and data integrity", 3: "path"}


def defines() -> tuple[str, ...]:
    """NVRTC options that give the CUDA builder the layout: PT_OFF_<field> and PT_BITS_<field>
    for every field, the constants of a read, and the status convention."""
    out = [f"-DPT_{kind}_{name.upper()}={value}" for name, off, size in SQE128_FIELDS
           for kind, value in (("OFF", off), ("BITS", 8 * size))]
    return (*out, f"-DPT_OP_URING_CMD={OP_URING_CMD}",
            f"-DPT_NVME_URING_CMD_IO={NVME_URING_CMD_IO}u", f"-DPT_NVME_READ={NVME_READ}",
            f"-DPT_NVME_WRITE={NVME_WRITE}", f"-DPT_SQE_BYTES={SQE_BYTES}",
            f"-DPT_CQE_BYTES={CQE_BYTES}", f"-DPT_STATUS_BASE={NVME_STATUS_BASE}",
            f"-DPT_STATUS_MASK={STATUS_MASK}")


def entries(words: np.ndarray) -> np.ndarray:
    """Rows of 16 u64 words (a ring's SQE128 array, or a copy) seen as passthrough SQEs:
    fields set by name write straight into them."""
    return words.view(SQE128_DTYPE).reshape(len(words))


def set_io(e: np.ndarray, *, write: bool | np.ndarray, off: np.ndarray,
           lba_shift: int | np.ndarray, length: int | np.ndarray) -> None:
    """The fields of entries ``e`` that change from one I/O to the next: the NVMe opcode,
    the starting LBA (cdw10, cdw11) and the block count less one (cdw12) of ``length``
    bytes at byte ``off`` on blocks of 1 << ``lba_shift`` bytes; data_len."""
    off = np.asarray(off, np.uint64)
    shift = np.asarray(lba_shift, np.uint64)
    slba = off >> shift
    e["nvme_opcode"] = np.where(write, NVME_WRITE, NVME_READ)
    e["cdw10"] = slba & np.uint64(0xFFFFFFFF)
    e["cdw11"] = slba >> np.uint64(32)
    e["cdw12"] = (np.asarray(length, np.uint64) >> shift) - np.uint64(1)
    e["data_len"] = length


def build(*, write: bool | np.ndarray, fd: int | np.ndarray, nsid: int | np.ndarray,
          lba_shift: int | np.ndarray, off: np.ndarray, length: int | np.ndarray,
          addr: np.ndarray, user_data: np.ndarray, sqe_flags: int = 0,
          fixed_buffer: int | None = None) -> np.ndarray:
    """Rows of 16 little-endian u64 words, one passthrough SQE each: an NVMe read (or write
    where ``write``) of ``length`` bytes at byte ``off`` of namespace ``nsid`` (blocks of
    1 << ``lba_shift`` bytes; both offset and length whole blocks), to or from ``addr``.
    ``fixed_buffer``: the registered buffer ``addr`` lies in (IORING_URING_CMD_FIXED)."""
    words = np.zeros((len(off), SQE_BYTES // 8), np.uint64)
    e = entries(words)
    e["opcode"] = OP_URING_CMD
    e["flags"] = sqe_flags
    e["fd"] = np.asarray(fd, np.int64).astype(np.uint32)
    e["cmd_op"] = NVME_URING_CMD_IO
    e["user_data"] = user_data
    if fixed_buffer is not None:
        e["uring_cmd_flags"] = URING_CMD_FIXED
        e["buf_index"] = fixed_buffer
    e["nsid"] = nsid
    e["addr"] = addr
    set_io(e, write=write, off=off, lba_shift=lba_shift, length=length)
    return words


def result(res: np.ndarray, length: int | np.ndarray) -> np.ndarray:
    """A passthrough CQE's ``res`` as gpufio's result: ``length`` bytes where the command
    succeeded (0), -(NVME_STATUS_BASE + status) where the drive failed it, -errno as given."""
    res = np.asarray(res, np.int64)
    return np.where(res == 0, length, np.where(res > 0, -(NVME_STATUS_BASE + (res & STATUS_MASK)),
                                               res)).astype(np.int32)


def error_name(code: int) -> str:
    """What a (positive) result code of a failed I/O means: the errno's name, or the NVMe
    status the drive returned (``NVMe status 0x281: media and data integrity, unrecovered
    read error``)."""
    if code < NVME_STATUS_BASE:
        return errno.errorcode.get(code, "?")
    status = code - NVME_STATUS_BASE
    sct, sc = status >> 8 & 7, status & 0xFF
    what = _STATUS_NAMES.get((sct, sc), f"status code {sc:#04x}")
    return f"NVMe status {status:#05x}: {_TYPES.get(sct, f'type {sct}')}, {what}"


PASSTHROUGH_KERNEL = (5, 19)  # IORING_OP_URING_CMD, SQE128/CQE32, NVME_URING_CMD_IO
POLLED_KERNEL = (6, 1)        # polled passthrough completions (IORING_URING_CMD_POLLED)
UNPRIVILEGED_KERNEL = (6, 2)  # passthrough I/O by a user who may open the char device


def refusal(path: str, err: int) -> str | None:
    """What a probe read's -errno says about passthrough on ``path``, when it refuses it."""
    why = {errno.EOPNOTSUPP: "the kernel or device takes no NVMe passthrough commands "
                             f"(Linux >= {PASSTHROUGH_KERNEL[0]}.{PASSTHROUGH_KERNEL[1]} "
                             "with the nvme driver)",
           errno.EINVAL: "the kernel does not know IORING_OP_URING_CMD / NVME_URING_CMD_IO "
                         f"(Linux >= {PASSTHROUGH_KERNEL[0]}.{PASSTHROUGH_KERNEL[1]})",
           errno.EACCES: "permission denied: NVMe passthrough needs CAP_SYS_ADMIN before "
                         f"Linux {UNPRIVILEGED_KERNEL[0]}.{UNPRIVILEGED_KERNEL[1]}",
           errno.EPERM: "not permitted: NVMe passthrough needs CAP_SYS_ADMIN before "
                        f"Linux {UNPRIVILEGED_KERNEL[0]}.{UNPRIVILEGED_KERNEL[1]}"}.get(err)
    return f"target {path}: NVMe passthrough refused: {why}" if why else None


def passthrough_checks(host: Host, area: str) -> list[Check]:
    """What NVMe passthrough needs of this host: the kernel, io_uring, generic devices and
    the right to use them (for every engine that sends NVMe commands)."""
    kernel = host.kernel_version()
    devices = nvme_generic.generic_devices(str(host.path("/dev")))
    usable = [d for d in devices if os.access(d, os.R_OK)]
    root = os.geteuid() == 0
    need = ".".join(map(str, PASSTHROUGH_KERNEL))
    out = [verdict(area, "passthrough kernel", kernel >= PASSTHROUGH_KERNEL,
                   host.kernel_release(), f"NVMe passthrough through io_uring needs Linux "
                   f">= {need} (IORING_OP_URING_CMD, SQE128/CQE32)", bad="fail"),
           verdict(area, "generic devices", bool(devices), ", ".join(devices) or "none in /dev",
                   "no /dev/ngXnY: no NVMe namespace here, or a kernel before 5.13")]
    if devices:
        privileged = root or kernel >= UNPRIVILEGED_KERNEL
        out.append(verdict(area, "passthrough permission", bool(usable) and privileged,
                           f"readable: {', '.join(usable) or 'none'}; "
                           f"{'root' if root else 'not root'}",
                           "run as root, or give the user read access to /dev/ngXnY (Linux "
                           ">= 6.2 lets such a user send reads; writes need write access)"))
    return out
