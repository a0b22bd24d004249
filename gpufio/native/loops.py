"""io/loops.c's binding through ctypes: its structs (struct gf_loop, struct gf_out), its
entry points typed, and the by-reference arguments one loop passes on every call
(io/loops.py drives it)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from gpufio.native import build

ENTRY_POINTS = ("gf_null", "gf_psync", "gf_uring")
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class Loop(ctypes.Structure):
    """struct gf_loop (loops.c): every field 64 bits, in its order."""

    _fields_ = [("depth", _I64), ("bs", _I64), ("stop", _P), ("fds", _P), ("bufs", _P),
                ("seeds", _P), ("magic", ctypes.c_uint64), ("halt_on_error", _I64),
                ("nop", _I64), ("ring_fd", _I64),
                *[(n, _P) for n in ("sq_head", "sq_tail", "sq_array", "sq_flags", "cq_head",
                                    "cq_tail", "sqes", "cqes")],
                ("sq_entries", _I64), ("cq_mask", _I64), ("sqpoll", _I64),
                ("word0", ctypes.c_uint64 * 2), ("stop_ud", ctypes.c_uint64), ("wait_ns", _I64),
                ("batch_submit", _I64), ("spin_ns", _I64),
                ("nvme", _I64), ("nsids", _P), ("lba_shifts", _P),
                ("sqe_flags", ctypes.c_uint64), ("cmd_flags", ctypes.c_uint64),
                *[(n, _I64) for n in ("sq_tail_local", "cq_head_local", "inflight", "nfree",
                                      "status", "unsubmitted", "spin_skip", "spin_misses",
                                      "slat_sum", "slat_n", "unsubmitted_stamps")],
                *[(n, _P) for n in ("free_slots", "t_issue", "slot_tgt", "slot_write")]]


class Out(ctypes.Structure):
    """struct gf_out: where a call leaves its completions (addresses of the arrays)."""

    _fields_ = [("lat", _P), ("tgt", _P), ("res", _P), ("write", _P)]


def library(sources: tuple[Path, ...], headers: tuple[Path, ...] = (),
            options: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The loops built from ``sources`` (build.library, with the ``headers`` they include
    and the compiler's ``options``), their entry points typed; None where nothing is
    built."""
    args = [ctypes.POINTER(Loop), _P, _P, _P, _P, _I64, _I64, ctypes.POINTER(Out), _P]
    return build.typed(build.library("loops", sources, headers, options),
                       {name: (args, _I64) for name in ENTRY_POINTS})


def references(loop: Loop, out: Out) -> tuple[Any, Any, Any, Any]:
    """(loop, out, consumed, consumed's reference): what each call of one loop passes by
    reference, made once; ``consumed.value`` is how many I/Os the last call took."""
    consumed = _I64(0)
    return ctypes.byref(loop), ctypes.byref(out), consumed, ctypes.byref(consumed)
