"""io/nvme's C through ctypes: the drive rate model (drive_rate.c: struct gdr_drive,
gdr_init, gdr_admit), the compiled controller (controller.c: gnc_serve, its namespace paths
and drive models as pointer arrays) and the compiled CPU driver (driver.c: struct gnd_pair,
gnd_reads). Each library comes from build.library, its entry points typed once; the
sources, headers and options are the caller's (io/nvme/ knows where they are)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpufio.native import build

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64


class _Drive(ctypes.Structure):
    """struct gdr_drive (drive_rate.c): every field 64 bits, in its order."""

    _fields_ = [(n, _I64) for n in ("io_ps", "media_fs", "link_fs", "latency_ns", "next_io",
                                    "next_media", "next_link", "admitted")]


class _Pair(ctypes.Structure):
    """struct gnd_pair (driver.c): every field 64 bits, in its order."""

    _fields_ = [(n, _U64) for n in ("sq", "cq", "sq_db", "cq_db", "entries", "depth",
                                    "slots_iova", "slot_bytes", "bs", "lba_shift", "blocks",
                                    "seed", "nsid")]


PAIR_FIELDS = tuple(name for name, _ in _Pair._fields_)


def drive_library(sources: tuple[Path, ...]) -> ctypes.CDLL | None:
    """drive_rate.c built from ``sources`` and typed; None where nothing is built."""
    return build.typed(build.library("drive_rate", sources), {
        "gdr_init": ([ctypes.POINTER(_Drive), ctypes.c_double, ctypes.c_double,
                      ctypes.c_double, _I64], None),
        "gdr_admit": ([ctypes.POINTER(_Drive), _I64, _I64], _I64)})


class DriveState:
    """One struct gdr_drive, initialised by gdr_init; ``admit(now_ns, nbytes)`` is gdr_admit
    bound to it (the reference made once: a model admits every command it fetches),
    ``address`` is where a compiled controller is handed it."""

    def __init__(self, lib: ctypes.CDLL, iops: float, read_bw: float, link_bw: float,
                 latency_ns: int) -> None:
        self._struct = _Drive()
        ref = ctypes.byref(self._struct)
        lib.gdr_init(ref, iops, read_bw, link_bw, latency_ns)
        self.admit: Callable[[int, int], int] = functools.partial(lib.gdr_admit, ref)
        self.address = ctypes.addressof(self._struct)

    @property
    def admitted(self) -> int:
        """The commands admitted so far."""
        return int(self._struct.admitted)


def controller_library(sources: tuple[Path, ...]) -> ctypes.CDLL | None:
    """controller.c built from ``sources`` and typed; None where nothing is built."""
    return build.typed(build.library("nvme_controller", sources), {
        "gnc_serve": ([ctypes.c_char_p, _P, _I64, _I64, _I64, _I64, _P, _I64, _P], _I64)})


def serve(lib: ctypes.CDLL, path: str, namespaces: Sequence[str], lba_shift: int,
          threads: int, backend: int, faults: int | None, nfaults: int,
          drives: Sequence[DriveState]) -> int:
    """gnc_serve: the shared file ``path``'s queues served from the files ``namespaces``
    (1, 2 ...), each behind ``drives[i]`` where there are drives; ``faults``: the address of
    ``nfaults`` fault rows (or None). Its result: 0, or -errno."""
    names = [str(n).encode() for n in namespaces]
    paths = (ctypes.c_char_p * len(names))(*names)
    ptrs = (_P * len(drives))(*[d.address for d in drives]) if drives else None
    return lib.gnc_serve(path.encode(), paths, len(names), lba_shift, threads, backend,
                         faults, nfaults, ptrs)


def driver_library(sources: tuple[Path, ...], headers: tuple[Path, ...],
                   options: tuple[str, ...]) -> ctypes.CDLL | None:
    """driver.c built from ``sources`` (including ``headers``, with ``options``) and typed;
    None where nothing is built."""
    return build.typed(build.library("nvme_cpu_driver", sources, headers, options), {
        "gnd_reads": ([ctypes.POINTER(_Pair), _I64, _U64, _P], _I64)})


def pair_shares(pairs: Sequence[Mapping[str, int]], threads: int) -> list[ctypes.Array]:
    """The struct gnd_pair of each of ``pairs`` (their PAIR_FIELDS), dealt to ``threads``:
    thread t's share holds pairs t, t + threads, ... side by side, what gnd_reads(share,
    len(share), n, stop) drives."""
    structs = [_Pair(**p) for p in pairs]
    return [(_Pair * len(structs[t::threads]))(*structs[t::threads]) for t in range(threads)]
