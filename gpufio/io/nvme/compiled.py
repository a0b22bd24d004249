"""gpufio's compiled software NVMe controller (controller.c): the protocol of
io/nvme_model.py served by ``threads`` poller threads in C, from one of three backends:

- ``none``: every command completes without moving data (PRPs still walked and checked):
  the queue mechanism's ceiling (not "null": that word names an engine);
- ``ram``: the backing file memory-mapped; reads copy into the landing pages, writes out
  of them;
- ``file``: the backing file read and written with pread/pwrite (buffered), as the model.

It runs in a process of its own exactly as the model does (io/nvme_model.ModelProcess with
``serve`` = ``server(threads, backend)``), so the host driver, the CPU driver of the model
and the GPU agents drive it unchanged. Built by core/native.py; ``available()`` is False
where there is no C compiler.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gpufio.core import native

SOURCES = (Path(__file__).with_name("controller.c"),)
BACKENDS = ("none", "ram", "file")
FAULT_DTYPE = np.dtype([("slba", "<i8"), ("status", "<i8"), ("drop", "<i8"), ("times", "<i8")])


def _library() -> ctypes.CDLL | None:
    lib = native.library("nvme_controller", SOURCES)
    if lib is not None and not hasattr(lib, "_gpufio_typed"):
        fn = lib.gnc_serve
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        fn.restype = ctypes.c_int64
        lib._gpufio_typed = True
    return lib


def available() -> bool:
    """Whether the compiled controller is built (now, where it was not) and loads."""
    return _library() is not None


def serve(path: str, backing: str, lba_shift: int, faults: Sequence, *, threads: int = 1,
          backend: str = "ram") -> None:
    """Serve the shared file ``path``'s queues from ``backing`` until its stop word is set
    (the model's ``serve``, compiled); the call lets go of the interpreter lock."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled NVMe controller needs a C compiler (cc) and "
                           "GPUFIO_NATIVE unset")
    table = np.array([(f.slba, f.status, int(f.drop), f.times) for f in faults], FAULT_DTYPE)
    rc = lib.gnc_serve(path.encode(), str(backing).encode(), lba_shift, threads,
                       BACKENDS.index(backend), table.ctypes.data if len(table) else None,
                       len(table))
    if rc:
        raise OSError(-rc, f"compiled NVMe controller: serving {backing} through {path}")


def server(threads: int, backend: str) -> Callable[..., None]:
    """``serve`` with its threads and backend bound: what io/nvme_model.ModelProcess runs in
    the controller's process (picklable, for a spawned process)."""
    if backend not in BACKENDS:
        raise ValueError(f"compiled NVMe controller: backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    return functools.partial(serve, threads=max(1, threads), backend=backend)
