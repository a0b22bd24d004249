"""NVMe queues as the controller sees them: the 64-byte submission entry, the 16-byte
completion entry and the controller registers, defined once for every user-space NVMe path.

BaM's mechanism is a driver that writes these entries into a controller's own queues and
rings its doorbells. gpufio has three writers of them that must agree byte for byte: the
host driver over vfio-pci (admin commands, and the CPU stand-in of the I/O path), the CUDA
builder (GPU threads filling SQ slots; it gets every field's offset and width as NVRTC macros
from ``defines``) and the software controller in the tests (which reads them as a drive
would). The I/O command's fields (opcode, nsid, starting LBA in cdw10/cdw11, block count less
one in cdw12) are NVMe's, the same values io/nvme/passthru.py puts into a passthrough entry; the
data pointer here is PRP1/PRP2 (NVMe base specification 2.0, 4.1 and 4.3) instead of the
kernel's ``addr``/``data_len``.
"""

from __future__ import annotations

import errno

import numpy as np

SQE_BYTES, CQE_BYTES = 64, 16
NVME_FLUSH, NVME_WRITE, NVME_READ = 0x00, 0x01, 0x02  # NVM command set I/O opcodes

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

# (field, byte offset, bytes) of a submission queue entry (common command format)
SQE_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("opcode", 0, 1), ("flags", 1, 1), ("cid", 2, 2), ("nsid", 4, 4), ("cdw2", 8, 4),
    ("cdw3", 12, 4), ("mptr", 16, 8), ("prp1", 24, 8), ("prp2", 32, 8), ("cdw10", 40, 4),
    ("cdw11", 44, 4), ("cdw12", 48, 4), ("cdw13", 52, 4), ("cdw14", 56, 4), ("cdw15", 60, 4),
)
# (field, byte offset, bytes) of a completion queue entry; ``status`` holds the phase tag in
# bit 0, the status code in bits 1-8, the status code type in bits 9-11, More and DNR above
CQE_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("result", 0, 4), ("rsvd", 4, 4), ("sq_head", 8, 2), ("sq_id", 10, 2), ("cid", 12, 2),
    ("status", 14, 2),
)

# Controller registers (byte offsets in BAR0) and the doorbells that follow them
REG_CAP, REG_VS, REG_CC, REG_CSTS = 0x0, 0x8, 0x14, 0x1C
REG_AQA, REG_ASQ, REG_ACQ = 0x24, 0x28, 0x30
DOORBELLS = 0x1000

# Admin command opcodes
ADMIN_CREATE_SQ, ADMIN_CREATE_CQ, ADMIN_IDENTIFY = 0x01, 0x05, 0x06
ADMIN_DELETE_SQ, ADMIN_DELETE_CQ, ADMIN_SET_FEATURES = 0x00, 0x04, 0x09
FEATURE_NUM_QUEUES = 0x07

PAGE = 4096  # the memory page size gpufio enables controllers with (CC.MPS = 0)
PRP_PER_PAGE = PAGE // 8  # entries of one PRP list page; the last chains to the next page

# CC and CSTS bits: enable with 64-byte SQEs (IOSQES 6), 16-byte CQEs (IOCQES 4), the NVM
# command set, MPS 0; shutdown notification "normal" and its status "complete"
CC_EN, CC_SHN_NORMAL, CC_ENABLE = 1, 1 << 14, (4 << 20) | (6 << 16) | 1
CSTS_RDY, CSTS_CFS, CSTS_SHST_MASK, CSTS_SHST_DONE = 1, 2, 3 << 2, 2 << 2
# Identify CNS values: a namespace, the controller, the active namespace list
CNS_NAMESPACE, CNS_CONTROLLER, CNS_ACTIVE_NSIDS = 0, 1, 2
# the generic status codes a controller returns most
SC_INVALID_OPCODE, SC_INVALID_FIELD, SC_DATA_TRANSFER = 0x01, 0x02, 0x04
SC_INTERNAL, SC_ABORT_REQUESTED, SC_PRP_OFFSET, SC_LBA_RANGE = 0x06, 0x07, 0x13, 0x80
SC_INVALID_QID, SC_INVALID_QSIZE = 0x101, 0x102  # command specific (SCT 1)

_KIND = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def _dtype(fields: tuple[tuple[str, int, int], ...], size: int) -> np.dtype:
    return np.dtype({"names": [f for f, _, _ in fields],
                     "formats": [_KIND[n] for _, _, n in fields],
                     "offsets": [o for _, o, _ in fields], "itemsize": size})


SQE_DTYPE = _dtype(SQE_FIELDS, SQE_BYTES)
CQE_DTYPE = _dtype(CQE_FIELDS, CQE_BYTES)


def doorbell(qid: int, completion: bool, dstrd: int = 0) -> int:
    """BAR0 offset of queue ``qid``'s SQ tail (or CQ head) doorbell; ``dstrd`` is CAP.DSTRD."""
    return DOORBELLS + (2 * qid + int(completion)) * (4 << dstrd)


def cap_fields(cap: int) -> dict[str, int]:
    """The fields of CAP gpufio uses: MQES+1 (the deepest queue), CQR (contiguous queues
    required), TO (ready timeout, 500 ms units), DSTRD (doorbell stride), MPSMIN."""
    return {"max_depth": (cap & 0xFFFF) + 1, "cqr": (cap >> 16) & 1, "timeout": (cap >> 24) & 0xFF,
            "dstrd": (cap >> 32) & 0xF, "mpsmin": PAGE << ((cap >> 48) & 0xF)}


def admin_command(opcode: int, cid: int, *, nsid: int = 0, prp1: int = 0, cdw10: int = 0,
                  cdw11: int = 0) -> np.ndarray:
    """An admin submission entry (Identify, Create/Delete I/O SQ or CQ, Set Features)."""
    e = np.zeros(1, SQE_DTYPE)
    e["opcode"], e["cid"], e["nsid"], e["prp1"] = opcode, cid, nsid, prp1
    e["cdw10"], e["cdw11"] = cdw10, cdw11
    return e


def identify(cid: int, cns: int, buf: int, nsid: int = 0) -> np.ndarray:
    """Identify (``cns``: CNS_*) into the 4 KiB page at ``buf``."""
    return admin_command(ADMIN_IDENTIFY, cid, nsid=nsid, prp1=buf, cdw10=cns)


def set_queue_count(cid: int, pairs: int) -> np.ndarray:
    """Set Features, Number of Queues: ``pairs`` I/O SQs and CQs (zero-based in the
    command); the completion's result says how many the controller grants (likewise)."""
    n = pairs - 1
    return admin_command(ADMIN_SET_FEATURES, cid, cdw10=FEATURE_NUM_QUEUES, cdw11=n << 16 | n)


def create_cq(cid: int, qid: int, depth: int, buf: int) -> np.ndarray:
    """Create I/O Completion Queue ``qid`` of ``depth`` entries at ``buf``, physically
    contiguous (PC), interrupts off (IEN 0): gpufio polls its phase bits."""
    return admin_command(ADMIN_CREATE_CQ, cid, prp1=buf, cdw10=(depth - 1) << 16 | qid,
                         cdw11=0x1)


def create_sq(cid: int, qid: int, depth: int, buf: int, cqid: int) -> np.ndarray:
    """Create I/O Submission Queue ``qid`` of ``depth`` entries at ``buf``, contiguous,
    completing into CQ ``cqid``."""
    return admin_command(ADMIN_CREATE_SQ, cid, prp1=buf, cdw10=(depth - 1) << 16 | qid,
                         cdw11=cqid << 16 | 0x1)


def delete_queue(cid: int, qid: int, completion: bool) -> np.ndarray:
    """Delete I/O SQ (or CQ where ``completion``) ``qid``."""
    return admin_command(ADMIN_DELETE_CQ if completion else ADMIN_DELETE_SQ, cid, cdw10=qid)


def parse_controller(page: bytes) -> dict[str, object]:
    """The Identify Controller fields gpufio reports: model, serial, firmware, the number of
    namespaces (NN) and MDTS (the largest transfer, in units of the minimum page; 0 none)."""
    def text(a: int, b: int) -> str:
        return page[a:b].decode("ascii", "replace").strip(" \0")

    return {"serial": text(4, 24), "model": text(24, 64), "firmware": text(64, 72),
            "mdts": page[77], "namespaces": int.from_bytes(page[516:520], "little")}


def parse_namespace(page: bytes) -> dict[str, int]:
    """Identify Namespace: its size in blocks (NSZE) and its block size (the LBA format
    FLBAS selects)."""
    flbas = page[26] & 0xF
    return {"blocks": int.from_bytes(page[0:8], "little"),
            "lba_bytes": 1 << page[128 + 4 * flbas + 2]}


def prp_pointers(addr: int, length: int, list_addr: int) -> tuple[int, int, np.ndarray]:
    """(PRP1, PRP2, PRP list) of a transfer of ``length`` bytes at bus address ``addr``:
    PRP1 the first page (it may start inside it), PRP2 the second page when the transfer
    touches two, else ``list_addr``, where the returned entries (one per further page, page
    aligned) must be written. One list page holds PRP_PER_PAGE entries; gpufio refuses
    longer transfers before they get here (prp_count)."""
    rest = np.array(prp_pages(addr, length)[1:], np.uint64)
    pages = len(rest) + 1
    if pages <= 1:
        return addr, 0, rest[:0]
    if pages == 2:
        return addr, int(rest[0]), rest[:0]
    if pages - 1 > PRP_PER_PAGE:
        raise ValueError(f"a transfer of {length} bytes needs a chained PRP list")
    return addr, list_addr, rest


def prp_count(addr: int, length: int) -> int:
    """How many memory pages a transfer of ``length`` bytes at ``addr`` touches: one PRP
    entry each; more than two need a PRP list (PRP2 then points to it)."""
    first = PAGE - addr % PAGE
    return 1 if length <= first else 1 + -(-(length - first) // PAGE)


def io_commands(*, write: bool | np.ndarray, nsid: int | np.ndarray,
                lba_shift: int | np.ndarray, off: np.ndarray, length: int | np.ndarray,
                cid: int | np.ndarray, prp1: int | np.ndarray, prp2: int | np.ndarray,
                flush: bool | np.ndarray = False) -> np.ndarray:
    """The one encoder of NVMe I/O commands (io/nvme/passthru.py wraps the same entries in
    io_uring's; kernels/nvme_cmd.cuh is its CUDA twin): submission entries, one per I/O,
    a read (or write where ``write``) of ``length`` bytes at byte ``off`` of namespace
    ``nsid`` (blocks of 1 << ``lba_shift`` bytes), data at PRP1/PRP2, command identifier
    ``cid``; where ``flush``, a Flush of the namespace (no data, no LBA)."""
    off = np.atleast_1d(np.asarray(off, np.uint64))
    e = np.zeros(len(off), SQE_DTYPE)
    shift = np.asarray(lba_shift, np.uint64)
    flush = np.asarray(flush, bool)
    io = ~flush
    slba = off >> shift
    e["opcode"] = np.where(flush, NVME_FLUSH, np.where(write, NVME_WRITE, NVME_READ))
    e["cid"] = cid
    e["nsid"] = nsid
    e["prp1"] = np.where(io, np.asarray(prp1, np.uint64), 0)
    e["prp2"] = np.where(io, np.asarray(prp2, np.uint64), 0)
    e["cdw10"] = np.where(io, slba & np.uint64(0xFFFFFFFF), 0)
    e["cdw11"] = np.where(io, slba >> np.uint64(32), 0)
    blocks = np.atleast_1d(np.asarray(length, np.uint64)) >> shift
    e["cdw12"] = np.where(io, (blocks - np.uint64(1)) & np.uint64(0xFFFFFFFF), 0)
    return e


def flush_command(nsid: int, cid: int) -> np.ndarray:
    """A Flush of namespace ``nsid``."""
    return io_commands(write=False, nsid=nsid, lba_shift=0, off=0, length=0, cid=cid, prp1=0,
                       prp2=0, flush=True)


def cqe_status(status: int, phase: int) -> int:
    """A completion's status word: ``status`` (SCT << 8 | SC) above the phase tag."""
    return (status & STATUS_MASK) << 1 | (phase & 1)


def prp_pages(addr: int, length: int) -> list[int]:
    """The PRP entries of a transfer of ``length`` bytes at bus address ``addr``: the first
    (which may start inside its page), then one page-aligned address per further page."""
    first = addr - addr % PAGE
    return [addr] + [first + PAGE * i for i in range(1, prp_count(addr, length))]


def status_of(cqe_status: np.ndarray) -> np.ndarray:
    """A completion's status (SCT << 8 | SC), without the phase tag, More and DNR."""
    return (np.asarray(cqe_status, np.int64) >> 1) & STATUS_MASK


def status_result(status: np.ndarray, length: int | np.ndarray) -> np.ndarray:
    """The one status decoder (kernels/nvme_cmd.cuh's nvme_result is its CUDA twin): an NVMe
    status (SCT << 8 | SC, More and DNR above, ignored) as gpufio's result: ``length``
    bytes where it is 0, else -(NVME_STATUS_BASE + status), which ``error_name`` names."""
    st = np.asarray(status, np.int64) & STATUS_MASK
    return np.where(st == 0, length, -(NVME_STATUS_BASE + st)).astype(np.int32)


def result(cqe_status: np.ndarray, length: int | np.ndarray) -> np.ndarray:
    """gpufio's result of completions by their status field (the phase tag in bit 0)."""
    return status_result(np.asarray(cqe_status, np.int64) >> 1, length)


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


def defines() -> tuple[str, ...]:
    """NVRTC options giving the CUDA builder the layout: NQ_OFF_<field>/NQ_BITS_<field> for
    the SQ and CQ entries (NQ_SQ_*, NQ_CQ_*), their sizes and the doorbell base."""
    out = [f"-DNQ_{side}_{kind}_{name.upper()}={value}"
           for side, fields in (("SQ", SQE_FIELDS), ("CQ", CQE_FIELDS))
           for name, off, size in fields for kind, value in (("OFF", off), ("BITS", 8 * size))]
    return (*out, f"-DNQ_SQE_BYTES={SQE_BYTES}", f"-DNQ_CQE_BYTES={CQE_BYTES}",
            f"-DNQ_DOORBELLS={DOORBELLS}", f"-DNQ_PAGE={PAGE}",
            f"-DNQ_PRP_PER_PAGE={PRP_PER_PAGE}", f"-DNQ_NVME_READ={NVME_READ}",
            f"-DNQ_NVME_WRITE={NVME_WRITE}", f"-DNQ_NVME_FLUSH={NVME_FLUSH}",
            f"-DNQ_STATUS_BASE={NVME_STATUS_BASE}", f"-DNQ_STATUS_MASK={STATUS_MASK}")
