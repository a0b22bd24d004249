"""The contract between gpufio's Python side and its CUDA kernels, stated once.

Shared constants (control words, slot states, bench flags, histogram and errno sizes, the
pattern's golden ratio) are defined here and handed to NVRTC as macros (``defines``), so the
kernels never carry their own copy. Each descriptor struct a host builds for a kernel is one
field list here (``build`` fills it by name); tests/io/gio/test_gio_contract.py checks every list
against its C struct, field for field.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np

from gpufio.core import pattern
from gpufio.core.stats import PLAT_NR
from gpufio.io.nvme import passthru, spec

# words of the queue's control array in GPU memory (kernels/gio_queue.cuh, enum Control)
CONTROL = ("C_STOP", "C_ABORT", "C_MEASURING", "C_REQUESTERS", "C_AGENTS", "C_GEN",
           "C_BAD_SLOT")
CONTROL_WORDS = 8  # the array's length: room for the words above
# a request slot's states, in order (enum SlotState)
SLOT_STATES = ("FREE", "CLAIMED", "READY", "SUBMITTED", "DONE")
# the block benchmark's flags (enum BenchFlags)
BENCH_FLAGS = {"B_RANDOM": 1, "B_FILE_RANDOM": 2, "B_LAND_GPU": 4, "B_VERIFY": 8,
               "B_CONTINUE": 16, "B_WRITE": 32, "B_NOP": 64}
# sizes and values both sides use
CONSTANTS = {
    "PLAT_NR": PLAT_NR,            # fio's latency histogram buckets
    "ERRNO_SLOTS": spec.STATUS_CODES,  # per-target error counters: errnos, NVMe statuses
    "BAD_KEEP": 8,                 # bad (target, offset) pairs kept
    "GIO_EINVAL": errno.EINVAL,    # a read longer than its slot
    "GIO_EBUSY": errno.EBUSY,      # a post the queue refused
    "GIO_WRITE_BIT": 1 << 31,      # in a slot's len_fd: the request writes
}

# descriptor structs, in their C field order; every field is 8 bytes
GIO_QUEUE = ("nrings", "depth", "state", "res", "off", "len_fd", "landing", "slot_bytes",
             "control", "ring_stats")
GIO_BENCH = ("fds", "starts", "nblocks", "ntargets", "bs", "flags", "seed", "budget", "claim",
             "dst", "nthreads", "pat_seed", "magic", "block_bytes", "header_words", "live",
             "hist", "lat", "lat_sq", "tstats", "errs", "bad")
GIO_CACHE = ("pages", "nslots", "page16", "map", "ctl", "key", "hand")
# the backends' rings, each agent's second argument: one io_uring ring (kernels/gio_agent.cu)
URING_RING = ("sqes", "sq_head", "sq_tail", "sq_flags", "cqes", "cq_head", "cq_tail", "entries",
              "sqe_head", "ns")
# one NVMe I/O queue pair (kernels/nvme_queue.cuh)
NVME_RING = ("sqes", "cqes", "entries", "sq_db", "cq_db", "delta", "prp_lists", "ns",
             "progress")
STRUCTS = {"UringRing": URING_RING, "GioQueue": GIO_QUEUE, "GioBench": GIO_BENCH,
           "GioCache": GIO_CACHE, "NvmeRing": NVME_RING}


def _enum(names: tuple[str, ...] | dict[str, int]) -> str:
    items = names.items() if isinstance(names, dict) else ((n, i) for i, n in enumerate(names))
    return ",".join(f"{n}={v}" for n, v in items)


def defines() -> tuple[str, ...]:
    """NVRTC options that give every kernel the shared constants."""
    return (f"-DGIO_CONTROL_WORDS={_enum(CONTROL)}", f"-DGIO_SLOT_STATES={_enum(SLOT_STATES)}",
            f"-DGIO_BENCH_FLAGS={_enum(BENCH_FLAGS)}",
            f"-DPATTERN_GOLDEN={int(pattern.GOLDEN)}ULL", f"-DPATTERN_M1={int(pattern.M1)}ULL",
            f"-DPATTERN_M2={int(pattern.M2)}ULL",
            *(f"-D{k}={v}" for k, v in CONSTANTS.items()), *passthru.defines(),
            *spec.defines())


def build(fields: tuple[str, ...], values: dict[str, Any]) -> np.ndarray:
    """The descriptor's words in the struct's order; every field must be given, once."""
    missing, extra = set(fields) - set(values), set(values) - set(fields)
    if missing or extra:
        raise ValueError(f"descriptor fields: missing {sorted(missing)}, unknown {sorted(extra)}")
    return np.array([int(values[f]) for f in fields], np.uint64)


def index(word: str) -> int:
    """A control word's index in the control array."""
    return CONTROL.index(word)
