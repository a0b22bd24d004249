"""NVMe I/O commands in io_uring passthrough entries, for the CPU and the GPU.

A passthrough entry is a 128-byte SQE (IORING_SETUP_SQE128) whose opcode is
IORING_OP_URING_CMD, whose ``cmd_op`` is NVME_URING_CMD_IO and whose last 80 bytes carry
``struct nvme_uring_cmd`` (linux/nvme_ioctl.h): the NVMe command the kernel hands to the
namespace's queue without the block layer. That struct is the 64-byte NVMe command of
io/nvme/spec.py with the kernel's names: ``addr`` where PRP1 is, ``metadata_len`` and
``data_len`` where PRP2 is, the command identifier reserved (the kernel sets it), and
``timeout_ms`` after it. So ``build`` writes the io_uring header and places the one
command encoder's entry (spec.io_commands) at byte 48; the CUDA builder
(kernels/nvme_cmd.cuh, ``nvme_uring_sqe``) does the same with nvme_cmd, and gets the
header's offsets and widths as NVRTC macros (``defines``). tests/io/nvme/test_passthru.py
checks the layout against the kernel's headers and every builder against the others.

Its completion (a 32-byte CQE, IORING_SETUP_CQE32) carries 0, the NVMe status (positive:
status code type << 8 | status code, with the More and Do-Not-Retry bits above), or -errno
from the kernel; ``result`` turns it into gpufio's bytes-or-negative-code convention with
the one status decoder, spec.status_result.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.facts import nvme_generic
from gpufio.io.nvme import spec

if TYPE_CHECKING:
    from gpufio.facts.system import Host

OP_URING_CMD = 46  # IORING_OP_URING_CMD (Linux 5.19)
URING_CMD_FIXED = 1 << 0  # IORING_URING_CMD_FIXED: addr lies in registered buffer buf_index
SQE_BYTES, CQE_BYTES = 128, 32
CMD_BYTES = 72  # sizeof(struct nvme_uring_cmd)


def _ioc(direction: int, kind: str, nr: int, size: int) -> int:
    """Linux's _IOC(dir, type, nr, size) on x86-64 and arm64."""
    return direction << 30 | size << 16 | ord(kind) << 8 | nr


NVME_URING_CMD_IO = _ioc(3, "N", 0x80, CMD_BYTES)  # _IOWR('N', 0x80, struct nvme_uring_cmd)

CMD_OFFSET = 48  # where struct nvme_uring_cmd, the NVMe command, starts in the SQE
# (field, byte offset, bytes) of the io_uring fields of a 128-byte URING_CMD SQE
HEADER_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("opcode", 0, 1), ("flags", 1, 1), ("ioprio", 2, 2), ("fd", 4, 4),
    ("cmd_op", 8, 4), ("uring_cmd_flags", 28, 4), ("user_data", 32, 8), ("buf_index", 40, 2),
)
# the kernel's names for the NVMe command's fields that struct nvme_uring_cmd renames; cid
# is its rsvd1 and PRP2 its metadata_len and data_len
_KERNEL_NAMES = {"opcode": "nvme_opcode", "flags": "nvme_flags", "mptr": "metadata",
                 "prp1": "addr"}
# the whole entry as the kernel's structs name it (unlisted bytes are 0): the header, then
# spec.SQE_FIELDS at CMD_OFFSET
SQE128_FIELDS: tuple[tuple[str, int, int], ...] = (
    *HEADER_FIELDS,
    *((_KERNEL_NAMES.get(name, name), CMD_OFFSET + off, size)
      for name, off, size in spec.SQE_FIELDS if name not in ("cid", "prp2")),
    ("metadata_len", CMD_OFFSET + 32, 4), ("data_len", CMD_OFFSET + 36, 4),
    ("timeout_ms", CMD_OFFSET + spec.SQE_BYTES, 4),
)

_KIND = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}
SQE128_DTYPE = np.dtype({"names": [f for f, _, _ in SQE128_FIELDS],
                         "formats": [_KIND[n] for _, _, n in SQE128_FIELDS],
                         "offsets": [o for _, o, _ in SQE128_FIELDS], "itemsize": SQE_BYTES})

def defines() -> tuple[str, ...]:
    """NVRTC options that give the CUDA builder the io_uring header's layout: PT_OFF_<field>
    and PT_BITS_<field> for every header field, the opcode and the command's place."""
    out = [f"-DPT_{kind}_{name.upper()}={value}" for name, off, size in HEADER_FIELDS
           for kind, value in (("OFF", off), ("BITS", 8 * size))]
    return (*out, f"-DPT_OP_URING_CMD={OP_URING_CMD}",
            f"-DPT_NVME_URING_CMD_IO={NVME_URING_CMD_IO}u", f"-DPT_CMD_OFFSET={CMD_OFFSET}",
            f"-DPT_SQE_BYTES={SQE_BYTES}", f"-DPT_CQE_BYTES={CQE_BYTES}")


def entries(words: np.ndarray) -> np.ndarray:
    """Rows of 16 u64 words (a ring's SQE128 array, or a copy) seen as passthrough SQEs:
    fields set by name write straight into them."""
    return words.view(SQE128_DTYPE).reshape(len(words))


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
    # the NVMe command: addr where PRP1 is, data_len in PRP2's upper half, cid reserved
    cmd = spec.io_commands(write=write, nsid=nsid, lba_shift=lba_shift, off=off,
                           length=length, cid=0, prp1=addr,
                           prp2=np.asarray(length, np.uint64) << np.uint64(32))
    words[:, CMD_OFFSET // 8:(CMD_OFFSET + spec.SQE_BYTES) // 8] = \
        cmd.view(np.uint64).reshape(len(cmd), spec.SQE_BYTES // 8)
    return words


def result(res: np.ndarray, length: int | np.ndarray) -> np.ndarray:
    """A passthrough CQE's ``res`` as gpufio's result: -errno as given, else the NVMe
    status it carries through spec.status_result (``length`` bytes for 0)."""
    res = np.asarray(res, np.int64)
    return np.where(res < 0, res, spec.status_result(res, length)).astype(np.int32)


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
