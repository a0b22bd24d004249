"""The block benchmark on a request queue (kernels/gio_bench.cu), for every engine whose GPU
threads post their own I/Os: gpu-uring's io_uring agents and bam's NVMe queue agents run
the same requester kernel, so its arrays, the host loop that follows it (live counts, the
measurement's start, the stop, the watchdog) and the hand-over of its counts live here once.

A queue is an io/gio/queue.RequestQueue of any backend (io/gio/backends: uring's
UringQueue, nvme's NvmeQueues); the loop uses its ``descriptor``, ``start``, ``set``,
``fetch``, ``agent_stream``, ``kernels_done``, ``abort_quietly``, ``stall``, ``bad_slot``,
``keep_alive`` and ``file_refs`` (what the kernel passes as each target's file).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpufio.core import pattern
from gpufio.core.context import READ, WRITE, DeviceTotals
from gpufio.core.requests import QueueSpec
from gpufio.core.stats import PLAT_NR
from gpufio.io import gpu, kernels
from gpufio.io.gio import contract
from gpufio.io.gio.bench import TPB, gpu_price
from gpufio.io.gio.queue import C_MEASURING, C_STOP
from gpufio.io.kernels import Kernel
from gpufio.loops.steps import StallWatch

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.engines.base import Engine

FLAGS = contract.BENCH_FLAGS
ERRNO_SLOTS, BAD_KEEP = contract.CONSTANTS["ERRNO_SLOTS"], contract.CONSTANTS["BAD_KEEP"]
POLL_S = 0.001
PULL_NS = 100_000_000
U64_MAX = (1 << 64) - 1


class DeviceBench:
    """One worker's block benchmark on ``queue``: ``threads`` requester threads, reads
    landing in GPU memory when ``land_gpu``, NOPs when ``nop``. Construction allocates and
    loads (before the clock); ``run`` launches and follows the kernels, feeding ``ctx``'s
    live counts (``direction``: the context's READ or WRITE); ``totals`` is then the GPU's
    final count (fields of core/context.DeviceTotals, None until the kernels stopped), for
    the engine to record; ``price`` what the kernels occupy of the GPU (gpu_price)."""

    def __init__(self, queue: Any, job: "Job", ctx: Any, *, ntargets: int, threads: int,
                 land_gpu: bool, direction: int, nop: bool = False) -> None:
        self.queue, self.job, self.ctx = queue, job, ctx
        self.ntargets, self.direction = ntargets, direction
        self.totals: dict[str, Any] | None = None
        cp = self._cp = gpu.use(job.gpu_of(ctx.worker))
        with gpu.undone_on_failure(queue.close, f"gpu {job.gpu_of(ctx.worker)}: out of "
                                   f"memory for {threads * job.bs} bytes of destination "
                                   "buffers"):
            self._fn = kernels.function(Kernel.GIO_BENCH)
            self.blocks = -(-threads // TPB)
            self._dev = self._arrays(threads, land_gpu and not job.writes and not nop, nop)
        self.stream = cp.cuda.Stream(non_blocking=True)
        queue.keep_alive(self._dev, self.stream)  # if the bench kernel never stops
        self.price = gpu_price(queue.nrings, self.blocks * TPB,
                               gpu.sm_count(job.gpu_of(ctx.worker)))
        cp.cuda.Stream.null.synchronize()  # not the device: other workers' agents run on it

    def _arrays(self, nthreads: int, land_gpu: bool, nop: bool) -> dict[str, Any]:
        """The benchmark's own arrays, and its GioBench descriptor (contract.GIO_BENCH, the
        struct in kernels/gio_bench.cu)."""
        cp, job, ctx, nt = self._cp, self.job, self.ctx, self.ntargets
        bs = job.bs
        seeds = ctx.seeds(np.arange(nt)) if ctx.verifying or job.writes else np.zeros(nt, np.uint64)
        starts, nblocks = ctx.regions()
        d = {"claim": cp.zeros(1, cp.uint64),
             "dst": cp.empty(nthreads * bs if land_gpu else 16, cp.uint8),
             "fds": cp.asarray(self.queue.file_refs),
             "starts": cp.asarray(starts), "nblocks": cp.asarray(nblocks),
             "pat_seed": cp.asarray(seeds),
             "live": cp.zeros(5, cp.uint64), "hist": cp.zeros(PLAT_NR, cp.uint64),
             "lat": cp.asarray(np.array([0, U64_MAX, 0], np.uint64)),
             "lat_sq": cp.zeros(1, cp.float64), "tstats": cp.zeros(4 * nt, cp.uint64),
             "errs": cp.zeros(nt * ERRNO_SLOTS, cp.uint64),
             "bad": cp.zeros(1 + 2 * BAD_KEEP, cp.uint64)}
        chosen = {"B_RANDOM": job.random, "B_FILE_RANDOM": job.file_service == "random",
                  "B_LAND_GPU": land_gpu, "B_VERIFY": ctx.verifying,
                  "B_CONTINUE": job.continue_on_error, "B_WRITE": job.writes, "B_NOP": nop}
        flags = sum(FLAGS[name] for name, on in chosen.items() if on)
        budget = ctx.budget
        seed = int(np.random.default_rng([job.randseed, ctx.worker]).integers(0, 1 << 63))
        p = {name: arr.data.ptr for name, arr in d.items()}
        d["bench"] = cp.asarray(contract.build(contract.GIO_BENCH, {
            **p, "ntargets": nt, "bs": bs, "flags": flags, "seed": seed,
            "budget": U64_MAX if budget is None else budget, "nthreads": nthreads,
            "magic": pattern.MAGIC, "block_bytes": pattern.BLOCK,
            "header_words": pattern.HEADER_WORDS}))
        return d

    def _get(self, name: str) -> np.ndarray:
        return self.queue.fetch(self._dev[name])

    def _running(self) -> bool:
        return not (self.queue.agent_stream.done and self.stream.done)

    def run(self, stall_ns: int, begin: Callable[[], None] | None = None,
            notes: Callable[[], dict[str, Any]] | None = None) -> None:
        """Launch the agents and the bench kernel, follow them to the end and take the
        GPU's counts (``totals``), even when it failed once the kernels stopped; the
        queue's ``wake`` on every pass (SQPOLL threads that fell asleep), ``begin()`` when
        the measurement starts, ``notes()`` the path's facts once it stops; QueueStalled
        once nothing completes for ``stall_ns``."""
        q = self.queue
        q.start(requesters=self.blocks * TPB)
        try:
            self._drive(stall_ns, begin, notes)
        except BaseException:
            # whatever failed (a launch, a wake-up, Ctrl-C), the agents must not spin on
            q.abort_quietly((self.stream,))
            raise
        finally:
            if q.kernels_done:
                self._collect()
        bad = q.bad_slot()
        if bad is not None:
            raise RuntimeError(f"a kernel posted an I/O to request slot {bad}, past the "
                               f"queue's {q.nrings * q.depth}")

    def _drive(self, stall_ns: int, begin: Callable[[], None] | None,
               notes: Callable[[], dict[str, Any]] | None) -> None:
        ctx, q = self.ctx, self.queue
        begun = False
        if ctx.measuring:  # no ramp: the first completions count
            q.set(C_MEASURING, 1)
            begun = True
            if begin is not None:
                begin()
        self._fn((self.blocks,), (TPB,), (q.descriptor, self._dev["bench"]),
                 stream=self.stream)
        watch = StallWatch(stall_ns, time.monotonic_ns)
        last_pull = 0
        stopping = False
        while True:
            if not begun and ctx.measuring:
                q.set(C_MEASURING, 1)
                begun = True
                if begin is not None:
                    begin()
            if not stopping and ctx.done:
                q.set(C_STOP, 1)
                stopping = True
            q.wake()
            running = self._running()
            if (stopping or not running) and notes is not None:
                for key, values in notes().items():
                    ctx.note(key, values)
            now = time.monotonic_ns()
            if not running or now - last_pull > PULL_NS:
                live = self._get("live")
                ctx.publish(int(live[0]), int(live[1]), int(live[2]), self._get("hist"),
                            self.direction)
                last_pull = now
                if running and watch.stuck(int(live[0]), now):
                    q.stall(stall_ns, (self.stream,))
            if not running:
                break
            time.sleep(POLL_S)
        q.kernels_done = True

    def _collect(self) -> None:
        """The GPU's counts as this worker's record (``totals``)."""
        nt = self.ntargets
        live, lat = self._get("live"), self._get("lat")
        tstats = self._get("tstats").reshape(nt, 4).astype(np.int64)
        errs = self._get("errs").reshape(nt, ERRNO_SLOTS)
        bad = self._get("bad")
        nbad = min(int(bad[0]), BAD_KEEP)
        self.totals = dict(
            completed=int(live[0]), ios=int(live[1]), bytes=int(live[2]),
            hist=self._get("hist").astype(np.int64), lat_sum=int(lat[0]),
            lat_sumsq=float(self._get("lat_sq")[0]), lat_min=int(lat[1]), lat_max=int(lat[2]),
            target_ios=tstats[:, 0], target_bytes=tstats[:, 1], short=tstats[:, 2],
            verify_failures=tstats[:, 3],
            errors={(int(t), int(e)): int(errs[t, e]) for t, e in zip(*np.nonzero(errs))},
            bad_offsets=[(int(bad[1 + 2 * i]), int(bad[2 + 2 * i])) for i in range(nbad)],
            direction=self.direction)
        # the mean time a requester thread held no I/O between two of its own: where a
        # Little's-law product falls short of the threads, the time outside every latency
        if live[4]:
            self.ctx.note("idle_between_ios_us", [round(int(live[3]) / int(live[4]) / 1e3, 3)])

    def close(self) -> None:
        """Drop the arrays; if a kernel never stopped, the queue keeps them (keep_alive)."""
        self._dev = {}


class DeviceBlockLoop:
    """One worker's block job on ``engine``'s request queue (its ``queue`` primitive): GPU
    threads post every I/O (DeviceBench) while this thread follows them; built before the
    clock starts, like the loops over a channel. The engine's facts come with its queue
    (core/requests.DeviceQueue), so the loop names none."""

    def __init__(self, engine: type["Engine"], job: "Job", targets: list["Target"],
                 ctx: "WorkerContext") -> None:
        self.job, self.ctx = job, ctx
        self._flushes = engine.flushes_itself
        gpu.use(job.gpu_of(ctx.worker))
        self.dq = engine.queue(job, targets, QueueSpec(job.iodepth, job.bs, ctx.worker))
        try:
            self._bench = DeviceBench(self.dq.queue, job, ctx, ntargets=len(targets),
                                      threads=self.dq.threads, land_gpu=self.dq.land_gpu,
                                      direction=WRITE if job.writes else READ, nop=self.dq.nop)
        except BaseException:
            self.dq.close()
            raise
        ctx.note("gpu_price", [self._bench.price])

    def run(self) -> None:
        """The benchmark to its end, the GPU's counts recorded even when it failed once
        the kernels stopped; end_fsync through the queue where the engine flushes itself."""
        dq, ctx = self.dq, self.ctx
        try:
            self._bench.run(dq.stall_ns, begin=dq.begin, notes=dq.notes)
        finally:
            if self._bench.totals is not None:
                ctx.absorb(DeviceTotals(**self._bench.totals))
        for key, values in (dq.final_notes() if dq.final_notes else {}).items():
            ctx.note(key, values)
        if self._flushes and self.job.end_fsync and self.job.writes:
            t0 = time.perf_counter_ns()
            dq.sync()
            ctx.synced(1, time.perf_counter_ns() - t0)

    def close(self) -> None:
        """The benchmark's arrays, then the queue; if a kernel never stopped, the queue
        keeps what it still touches (keep_alive)."""
        try:
            self._bench.close()
        finally:
            self.dq.close()
