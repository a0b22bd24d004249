"""The software NVMe controllers' rates (io/nvme/model.py, and the compiled one of
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
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from gpufio.io.nvme import spec as nq
from gpufio.io.nvme.model import ModelProcess

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

        from gpufio.io.nvme import model

        return functools.partial(model.serve, drive=drive)
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


@contextmanager
def _gpu_pairs(mode: str, depth: int, pairs: int, size: int, bs: int, pollers: int,
               backend: str | None, drive: str | None, pack: int | None = None
               ) -> Iterator[tuple[Any, Any]]:
    """(the queues of ``pairs`` pairs driven by GPU agent warps with ``mode`` doorbells,
    ``pack`` to a block (None: the queue's default), the requester kernel) on a new controller serving a ``size``-byte
    namespace of pattern seed 1; everything goes on the way out."""
    from gpufio.io import kernels
    from gpufio.io.gio.backends.nvme import NvmeQueues, RegisteredModel

    where = tempfile.mkdtemp(prefix="gpufio-bam-bench-", dir="/dev/shm")
    model = _model(where, size, _server(pollers, backend, drive))
    reg = q = None
    try:
        reg = RegisteredModel(model.mem)
        host = model.host()
        made = [host.create_pair(1 + i, depth + 1) for i in range(pairs)]
        q = NvmeQueues(reg, made, depth=depth, slot_bytes=-(-bs // nq.PAGE) * nq.PAGE,
                       nsid=1, lba_shift=9, mode=mode)
        if pack is not None:
            q.warps_per_block = pack
        yield q, kernels.function(kernels.Kernel.NVME_REQUESTS)
    finally:
        if q is not None:
            q.close()
        model.stop()
        if reg is not None:
            reg.close()
        shutil.rmtree(where, ignore_errors=True)


def _requester_block(fn: Any, threads: int, pack: int | None) -> int:
    """Threads to a block of the requester kernel ``fn``: ``pack`` warps (None: one), or all
    ``threads`` where fewer, or as many warps as the kernel may have in a block."""
    return min(32 * (pack or 1), threads, fn.max_threads_per_block // 32 * 32)


def _requests(q: Any, fn: Any, n: int, depth: int, pairs: int, size: int, bs: int,
              rows: Any = None, during: Callable[[Callable[[], bool]], Any] | None = None,
              pack: int | None = None) -> tuple[float, Any, np.ndarray, Any]:
    """Run ``n`` random ``bs``-byte reads through the started agents, ``pairs`` x ``depth``
    requester threads (``pack`` warps to a block): (reads/s, each read's result, the
    offsets, what ``during`` returned).
    ``rows``: a CuPy (n, bs) uint8 array each read's bytes are copied into (GPU memory),
    else they stay in the landing slots. ``during(busy)`` runs on this thread while the
    reads do; ``busy()`` says whether they still do."""
    import cupy as cp

    threads = pairs * depth
    tpb = _requester_block(fn, threads, pack)
    threads -= threads % tpb
    offs = _offsets(n, size, bs)
    # every array (and the kernels that fill them) before the agents spin: a module loaded
    # while they do can wait for them (io/gio/queue.RequestQueue.start)
    args = (q.descriptor, np.uint64(n), cp.asarray(offs), cp.full(n, bs, cp.uint32),
            cp.zeros(n, cp.uint8), rows if rows is not None else cp.zeros(16, cp.uint8),
            np.uint64(bs // 16 if rows is not None else 0), np.int32(rows is not None),
            res := cp.zeros(n, cp.int32))
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    q.start(threads)
    t = time.perf_counter()
    fn((threads // tpb,), (tpb,), args, stream=stream)
    done = stream.record()
    side = during((lambda: not done.done)) if during is not None else None
    q.wait((stream,), 10**10)
    return n / (time.perf_counter() - t), res, offs, side


def _all_read(res: Any, bs: int, what: str) -> None:
    """End the bench when any of the GPU reads (their results ``res``) did not move
    ``bs`` bytes."""
    bad = int((res != bs).sum())
    if bad:
        raise SystemExit(f"bench: {bad} of {len(res)} GPU reads failed ({what})")


def gpu_rate(mode: str, n: int, depth: int, pairs: int, size: int, bs: int = BS,
             pollers: int = 1, backend: str | None = None, drive: str | None = None) -> float:
    """Reads/s of ``bs`` bytes from the model (or the compiled controller: ``backend``,
    ``pollers`` threads) driven by GPU agent warps (``mode`` doorbells), the landed bytes left in
    the landing slots (the copy to GPU memory is not the mechanism)."""
    with _gpu_pairs(mode, depth, pairs, size, bs, pollers, backend, drive) as (q, fn):
        rate, res, _, _ = _requests(q, fn, n, depth, pairs, size, bs)
    _all_read(res, bs, f"{mode} doorbells")
    return rate


def gpu_verified_rate(mode: str, n: int, depth: int, pairs: int, size: int, bs: int,
                      pollers: int, backend: str) -> dict[str, Any]:
    """Reads/s of ``bs`` bytes as gpu_rate, each read's bytes copied by its requester
    thread from the landing slot into GPU memory and checked there against the pattern at
    its offset afterwards; with the reads that failed or landed wrong bytes counted."""
    import cupy as cp

    from gpufio.io.verify import landed_mismatches

    rows = cp.zeros((n, bs), cp.uint8)
    with _gpu_pairs(mode, depth, pairs, size, bs, pollers, backend, None) as (q, fn):
        rate, res, offs, _ = _requests(q, fn, n, depth, pairs, size, bs, rows)
    res = res.get()
    wrong = landed_mismatches(rows, np.ones(n, np.uint64), offs, res)
    return {"rate": rate, "failed": int((res != bs).sum()), "mismatches": len(wrong),
            "checked": n}


def h2d_ceiling(nbytes: int = 256 << 20, seconds: float = 1.0) -> float:
    """Bytes/s of host-to-device copies from page-locked host memory (``nbytes`` a copy,
    repeated for about ``seconds``): the most any path that lands host memory in GPU
    memory can move."""
    import cupy as cp

    rt = cp.cuda.runtime
    host = cp.cuda.alloc_pinned_memory(nbytes)
    dev = cp.cuda.alloc(nbytes)
    stream = cp.cuda.Stream(non_blocking=True)

    def copy() -> None:
        rt.memcpyAsync(dev.ptr, host.ptr, nbytes, rt.memcpyHostToDevice, stream.ptr)

    copy()  # the first copy pays for setup
    stream.synchronize()
    copies, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        for _ in range(4):
            copy()
        stream.synchronize()
        copies += 4
    return copies * nbytes / (time.perf_counter() - t)


def _matmul_rate(stop: Callable[[float], bool], side: int = 4096) -> float:
    """Matrix products per second (``side`` x ``side``, float32, on a stream of their own),
    four at a time until ``stop(seconds so far)``."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = cp.ones((side, side), cp.float32)
        b = a @ a  # cuBLAS's handle and workspace, before the clock
        stream.synchronize()
        done, t = 0, time.perf_counter()
        while not done or not stop(time.perf_counter() - t):
            for _ in range(4):
                b = a @ a
            stream.synchronize()
            done += 4
        del b
    return done / (time.perf_counter() - t)


# blocks that only sleep until told: what holding SMs alone costs a kernel beside them
_HOLD = r"""
extern "C" __global__ void hold(const volatile int* stop)
{
    while (!*stop) __nanosleep(20000);
}
"""


def _held_rate(shapes: list[tuple[int, int]], seconds: float) -> float:
    """Matrix products/s (for ``seconds``) beside idle resident blocks: per (blocks, threads)
    of ``shapes`` a kernel of that many sleeping blocks, the shape of the agents' and the
    requesters' launches, so their price splits into holding SMs and the work they do."""
    import cupy as cp

    hold = cp.RawKernel(_HOLD, "hold")
    stop = cp.zeros(1, cp.int32)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in shapes]
    told = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    try:
        for (blocks, threads), stream in zip(shapes, streams):
            hold((blocks,), (threads,), (stop,), stream=stream)
        return _matmul_rate(lambda elapsed: elapsed >= seconds)
    finally:
        # a copy, not a fill: a kernel not yet loaded could wait for the spinning blocks
        stop.set(np.ones(1, np.int32), stream=told)
        told.synchronize()
        for stream in streams:
            stream.synchronize()


def sm_price(mode: str, n: int, depth: int, pairs: int, size: int, bs: int, pollers: int,
             backend: str, seconds: float = 2.0, pack: int | None = None) -> dict[str, Any]:
    """What the GPU side costs a compute kernel: matrix products/s alone (``seconds``), beside
    idle blocks shaped as the agents' and requesters' launches, then while the agents serve
    ``n`` reads (``pairs`` agent warps, ``pairs`` x ``depth`` requester threads, ``pack``
    warps to a block of either), the reads/s they made meanwhile, and the GPU's SM count."""
    import cupy as cp

    solo = _matmul_rate(lambda elapsed: elapsed >= seconds)
    with _gpu_pairs(mode, depth, pairs, size, bs, pollers, backend, None, pack) as (q, fn):
        (agent_blocks,), (agent_threads,) = q.agent_grid()
        tpb = _requester_block(fn, pairs * depth, pack)
        shapes = [(agent_blocks, agent_threads), (pairs * depth // tpb, tpb)]
        held = _held_rate(shapes, seconds)
        rate, res, _, beside = _requests(q, fn, n, depth, pairs, size, bs,
                                         during=lambda busy: _matmul_rate(lambda _: not busy()),
                                         pack=pack)
    _all_read(res, bs, f"{mode} doorbells, beside the products")
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    return {"matmul_solo": solo, "matmul_beside": beside, "kept": beside / solo,
            "matmul_beside_idle_blocks": held, "kept_idle_blocks": held / solo,
            "rate": rate, "agent_warps": pairs, "requester_threads": pairs * depth,
            "pack": pack, "agent_blocks": agent_blocks, "requester_blocks": shapes[1][0],
            "sms": sms}
