"""gpufio's compiled software NVMe controller (controller.c): the protocol of
io/nvme/model.py served by ``threads`` poller threads in C, from one of three backends:

- ``none``: every command completes without moving data (PRPs still walked and checked):
  the queue mechanism's ceiling;
- ``ram``: the backing file memory-mapped; reads copy into the landing pages, writes out
  of them;
- ``file``: the backing file read and written through an io_uring of each poller thread,
  at depth, with O_DIRECT where its file system and the transfer's alignment allow (not on
  tmpfs: buffered there, so from RAM): an emulated drive as fast as the storage under it.

It runs in a process of its own exactly as the model does (io/nvme/model.ModelProcess with
``serve`` = ``server(threads, backend)``), so the host driver, the CPU driver of the model
and the GPU agents drive it unchanged. ``namespaces`` are the files of namespaces 2, 3 ...
(a table striped over drives); with a ``drive`` model each namespace has its own rate model
(io/nvme/drives.py), which holds every I/O completion until its time. Built and bound by
native/nvme.py; ``available()`` is False where there is no C compiler. ``cpu_reads`` drives queue pairs from compiled CPU threads
(driver.c): the controller's own CPU-driven ceiling.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpufio.io.cuda import KERNELS
from gpufio.io.nvme import drives, model, passthru, spec
from gpufio.io.watchdog import Stalled
from gpufio.native import nvme as native

SOURCES = (Path(__file__).with_name("controller.c"), *drives.SOURCES)
BACKENDS = ("none", "ram", "file")
FAULT_DTYPE = np.dtype([("slba", "<i8"), ("status", "<i8"), ("drop", "<i8"), ("times", "<i8")])
MAX_NAMESPACES = 16  # controller.c's MAX_NS
M_ADMITTED = 0xF40  # BAR0: the commands each namespace's drive model admitted, 64 bits each


def _library() -> Any:
    return native.controller_library(SOURCES)


def available() -> bool:
    """Whether the compiled controller is built (now, where it was not) and loads."""
    return _library() is not None


def serve(path: str, backing: str, lba_shift: int, faults: Sequence, *, threads: int = 1,
          backend: str = "ram", drive: str | drives.DriveModel | None = None,
          namespaces: Sequence[str] = ()) -> None:
    """Serve the shared file ``path``'s queues from ``backing`` (namespace 1) and
    ``namespaces`` (2, 3 ...) until its stop word is set, each namespace behind a rate model
    of its own of ``drive`` (a drives.toml key or a model) where one is named (the model's
    ``serve``, compiled); the call lets go of the interpreter lock."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the compiled NVMe controller needs a C compiler (cc) and "
                           "GPUFIO_NATIVE unset")
    names = (backing, *namespaces)
    if len(names) > MAX_NAMESPACES:
        raise ValueError(f"compiled NVMe controller: {len(names)} namespaces; it serves at "
                         f"most {MAX_NAMESPACES}")
    m = drives.model(drive) if isinstance(drive, str) else drive
    rates = [drives.DriveRate(m).state for _ in names] if m is not None else []  # one each
    table = np.array([(f.slba, f.status, int(f.drop), f.times) for f in faults], FAULT_DTYPE)
    rc = native.serve(lib, path, names, lba_shift, threads, BACKENDS.index(backend),
                      table.ctypes.data if len(table) else None, len(table), rates)
    if rc:
        raise OSError(-rc, f"compiled NVMe controller: serving {backing} through {path}")


def server(threads: int, backend: str, drive: str | drives.DriveModel | None = None,
           namespaces: Sequence[str] = ()) -> Callable[..., None]:
    """``serve`` with its threads, backend, drive model and further namespaces bound: what
    io/nvme/model.ModelProcess runs in the controller's process (picklable, for a spawned
    process)."""
    if backend not in BACKENDS:
        raise ValueError(f"compiled NVMe controller: backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    return functools.partial(serve, threads=max(1, threads), backend=backend, drive=drive,
                             namespaces=tuple(str(n) for n in namespaces))


def admitted(mem: Any, namespaces: int) -> list[int]:
    """The commands each of the first ``namespaces`` drive models admitted so far (the
    controller's counters in ``mem``, the shared file's BAR)."""
    return [mem.reg64(M_ADMITTED + 8 * i) for i in range(namespaces)]


def busy_ns(mem: Any) -> int:
    """The nanoseconds the controller's poller threads spent in passes that did work (fetched,
    posted or changed state), summed over the threads, so far (its counter in ``mem``)."""
    return mem.reg64(model.M_BUSY_NS)


DRIVER_SOURCES = (Path(__file__).with_name("driver.c"),)
# the one command encoder it includes, with the layout NVRTC gets
DRIVER_HEADERS = (KERNELS / "nvme_cmd.cuh",)
STALL_S = 10.0


def _driver() -> Any:
    return native.driver_library(DRIVER_SOURCES, DRIVER_HEADERS,
                                 (f"-I{KERNELS}", *spec.defines(), *passthru.defines()))


def cpu_reads(mem: Any, pairs: Sequence[Any], n: int, depth: int, bs: int, lba_shift: int,
              blocks: int, threads: int, nsids: Sequence[int] = ()) -> tuple[int, float]:
    """``n`` random reads of ``bs`` bytes (at most a page) on each of ``pairs`` (the model's
    QueuePairs over ``mem``, fresh; pair i reads namespace ``nsids[i]``, else 1, of
    ``blocks`` blocks), ``depth`` in flight on each, by ``threads`` compiled
    driver threads (driver.c), each driving its share of the pairs in turn: (reads that
    succeeded, seconds from the first thread's start to the last one's end)."""
    lib = _driver()
    if lib is None:
        raise RuntimeError("the compiled NVMe CPU driver needs a C compiler (cc)")
    stop = np.zeros(1, np.int64)
    rows = []
    for i, pair in enumerate(pairs):
        _, slots = mem.alloc(depth * bs)
        rows.append(dict(
            sq=pair.sq.ctypes.data, cq=pair.cq.ctypes.data,
            sq_db=mem.addr + pair.sq_db, cq_db=mem.addr + pair.cq_db, entries=pair.entries,
            depth=depth, slots_iova=slots, slot_bytes=bs, bs=bs, lba_shift=lba_shift,
            blocks=blocks, seed=i + 1, nsid=nsids[i] if nsids else 1))
    threads = max(1, min(threads, len(pairs)))
    shares = native.pair_shares(rows, threads)
    good = [0] * threads

    def drive(t: int) -> None:
        good[t] = lib.gnd_reads(shares[t], len(shares[t]), n, stop.ctypes.data)

    workers = [threading.Thread(target=drive, args=(t,), name=f"nvme-driver-{t}")
               for t in range(threads)]
    t = time.perf_counter()
    for w in workers:
        w.start()
    seen, since = -1, time.monotonic()
    try:
        for w in workers:
            while w.is_alive():  # the controller's counter moves, or the drivers stop
                w.join(0.1)
                done = mem.reg64(model.M_COMPLETED)
                if done != seen:
                    seen, since = done, time.monotonic()
                elif time.monotonic() - since > STALL_S or mem.ended():
                    raise Stalled(f"compiled NVMe controller: no completion for "
                                  f"{STALL_S:g} s{mem.ended()}")
    finally:
        stop[0] = 1
        for w in workers:
            w.join()
    if min(good) < 0:
        raise MemoryError("the compiled NVMe CPU driver: no memory for its slots")
    return sum(good), time.perf_counter() - t
