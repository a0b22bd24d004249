"""The software NVMe controllers' rates (io/nvme_model.py, and the compiled one of
io/nvme/compiled.py where ``server`` names it): driven by a CPU driver (the model's Python
one, or compiled driver threads), and by GPU agent warps through io/gio/backends/nvme.py, for
bench/bam.py (BaM's mechanism's ceiling, as bench/nop.py is io_uring's). A mechanism below the
API, so this module reaches gpufio's internals (docs/design/ARCHITECTURE.md allows bench/ that
where it measures a mechanism); a bench's users see only its rates. The numbers are
the software controllers', not a drive's; with ``drive`` (a drives.toml model) every
completion is held to that drive's published rates: an emulated drive's."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from gpufio.io import nvme_queue as nq
from gpufio.io.nvme_model import ModelProcess

BS = 4096


def drive_model(name: str) -> dict[str, Any]:
    """A drive model of io/nvme/drives.toml as a result records it: its published figures
    (None: not published), their sources and its ``label`` (BadInput for an unknown name)."""
    from gpufio.io.nvme import drives

    return drives.describe(drives.model(name))


def _model(where: str, size: int, server: Any = None) -> ModelProcess:
    from gpufio.core import targets

    backing = os.path.join(where, "ns.dat")
    targets.create_file(backing, size, 1, allow_large=True)  # the bench chose the size
    return ModelProcess(where, backing, 9, 256 << 20, server=server)


def _server(pollers: int, backend: str | None, drive: str | None = None) -> Any:
    """The compiled controller's loop, or the Python model's where no backend is named (None:
    its own), at ``drive``'s rates where one is named."""
    if backend is None:
        if drive is None:
            return None
        import functools

        from gpufio.io import nvme_model

        return functools.partial(nvme_model.serve, drive=drive)
    from gpufio.io.nvme import compiled

    return compiled.server(pollers, backend, drive=drive)


def _offsets(n: int, size: int, bs: int = BS) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, size // bs, n).astype(np.uint64) * np.uint64(bs)


def compiled_cpu_rate(n: int, depth: int, pairs: int, bs: int, pollers: int, backend: str,
                      size: int, drive: str | None = None) -> float:
    """Reads/s of the compiled controller (``pollers`` threads, ``backend``) driven by as
    many compiled CPU threads (at most one per pair), ``depth`` outstanding on each pair,
    ``n`` reads of ``bs`` bytes on each: its own CPU-driven ceiling."""
    from gpufio.io.nvme import compiled

    where = tempfile.mkdtemp(prefix="gpufio-bam-bench-", dir="/dev/shm")
    model = _model(where, size, _server(pollers, backend, drive))
    try:
        host = model.host()
        made = [host.create_pair(1 + i, depth + 1) for i in range(pairs)]
        good, seconds = compiled.cpu_reads(model.mem, made, n, depth, bs, 9, size >> 9,
                                           pollers)
        if good != n * pairs:
            raise SystemExit(f"bench: {n * pairs - good} of {n * pairs} CPU-driven reads "
                             "failed on the compiled controller")
        return good / seconds
    finally:
        model.stop()
        shutil.rmtree(where, ignore_errors=True)


def cpu_rate(n: int, depth: int, size: int, pollers: int = 1,
             backend: str | None = None) -> float:
    """Reads/s of the model (or the compiled controller: ``backend``, ``pollers`` threads)
    driven by the model's
    own Python CPU driver, ``depth`` outstanding, over ``n`` 4 KiB reads of a ``size``-byte
    namespace."""
    where = tempfile.mkdtemp(prefix="gpufio-bam-bench-", dir="/dev/shm")
    model = _model(where, size, _server(pollers, backend))
    try:
        host = model.host()
        pair = host.create_pair(1, depth + 1)
        buf, iova = model.mem.alloc(depth * BS)
        offs = _offsets(n, size)
        cids = np.arange(n) % depth
        e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=offs, length=BS,
                           cid=np.arange(n) % (1 << 16), prp1=iova + cids * BS,
                           prp2=np.zeros(n, np.uint64))
        t = time.perf_counter()
        done = 0
        for start in range(0, n, depth):  # a batch of depth, each on its own buffer
            pair.run(e[start:start + depth], 10**10, depth)
            done += len(e[start:start + depth])
        return done / (time.perf_counter() - t)
    finally:
        model.stop()
        shutil.rmtree(where, ignore_errors=True)


def gpu_rate(mode: str, n: int, depth: int, pairs: int, size: int, bs: int = BS,
             pollers: int = 1, backend: str | None = None, drive: str | None = None) -> float:
    """Reads/s of ``bs`` bytes from the model (or the compiled controller: ``backend``,
    ``pollers`` threads) driven by GPU agent warps (``mode`` doorbells), the landed bytes left in
    the landing slots (the copy to GPU memory is not the mechanism)."""
    import cupy as cp

    from gpufio.io import cuda
    from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel

    where = tempfile.mkdtemp(prefix="gpufio-bam-bench-", dir="/dev/shm")
    model = _model(where, size, _server(pollers, backend, drive))
    reg = q = None
    slot = -(-bs // nq.PAGE) * nq.PAGE
    try:
        reg = RegisteredModel(model.mem)
        host = model.host()
        made = [host.create_pair(1 + i, depth + 1) for i in range(pairs)]
        q = NvmeQueues(reg, made, depth=depth, slot_bytes=slot, nsid=1, lba_shift=9, mode=mode)
        fn = cuda.module("bam_io").get_function("bam_requests")
        threads = pairs * depth
        tpb = min(32, threads)
        threads -= threads % tpb
        offs = cp.asarray(_offsets(n, size, bs))
        lens = cp.full(n, bs, cp.uint32)
        kinds = cp.zeros(n, cp.uint8)
        res = cp.zeros(n, cp.int32)
        stream = cp.cuda.Stream(non_blocking=True)
        q.start(threads)
        t = time.perf_counter()
        fn((threads // tpb,), (tpb,), (q.descriptor, np.uint64(n), offs, lens, kinds,
                                       cp.zeros(16, cp.uint8), np.uint64(0), np.int32(0), res),
           stream=stream)
        q.wait((stream,), 10**10)
        rate = n / (time.perf_counter() - t)
        bad = int((res != bs).sum())
        if bad:
            raise SystemExit(f"bench: {bad} of {n} GPU reads failed ({mode} doorbells)")
        return rate
    finally:
        if q is not None:
            q.close()
        model.stop()
        if reg is not None:
            reg.close()
        shutil.rmtree(where, ignore_errors=True)
