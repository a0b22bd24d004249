"""gpu-uring: GPU threads issue the reads themselves, through io_uring on a stock kernel.

BaM's idea without BaM's kernel module: requester threads on the GPU pick their own offsets
and post requests into device memory; one agent warp per ring turns them into SQEs in rings
that live in CUDA-registered host memory; the kernel's SQPOLL threads execute them; the
agents hand the completions back; the requesting warps copy the landed blocks into GPU
memory and bin their latencies on the GPU. No CPU user code runs per I/O: the host thread
only sets flags, wakes SQPOLL threads that fell asleep, reads live counters every 100 ms,
and stops the kernels with a diagnostic when completions stop (the watchdog). The kernels
are in kernels/gpu_uring.cu; the ring plumbing in gpufio/gpuring.py.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio import cuda, gpu, gpuverify, pattern, uring
from gpufio.engines import register
from gpufio.engines.base import Engine
from gpufio.errors import BadInput
from gpufio.gpuring import GpuRings, Watchdog, default_rings, ring_sizes, stall_report
from gpufio.options import Option
from gpufio.stats import PLAT_NR
from gpufio.targets import aligned_buffer
from gpufio.worker import DeviceTotals

if TYPE_CHECKING:
    from gpufio.profile import Job
    from gpufio.targets import Target
    from gpufio.worker import WorkerContext

C_STOP, C_ABORT, C_MEASURING, C_REQUESTERS, C_AGENTS = range(5)
B_RANDOM, B_FILE_RANDOM, B_LAND_GPU, B_VERIFY, B_CONTINUE = 1, 2, 4, 8, 16
SLOT_STATES = ("free", "claimed", "ready", "submitted", "done")
ERRNO_SLOTS = 256
BAD_KEEP = 8
TPB = 128
POLL_S = 0.001
PULL_NS = 100_000_000
START_LIMIT_S = 10.0
ABORT_WAIT_S = 5.0
U64_MAX = (1 << 64) - 1


class GpuStall(RuntimeError):
    """Completions stopped for stall_timeout; the kernels were stopped."""


def _options(job: Job) -> dict[str, Any]:
    o = dict(job.engine_options)
    o["rings"] = o["rings"] or default_rings(max(len(job.targets), 1), os.cpu_count() or 1)
    o["threads"] = o["threads"] or o["rings"] * job.iodepth
    return o


@register
class GpuUring(Engine):
    """GPU requester threads and agent warps driving SQPOLL rings in registered host memory."""

    name = "gpu-uring"
    summary = ("GPU threads issue the reads: agent warps write io_uring SQEs into rings in "
               "CUDA-registered host memory, SQPOLL kernel threads run them, no CPU code per I/O")
    peer = "BaM (needs its own kernel module and an unbound NVMe drive)"
    uses_gpu = True
    worker_kind = "thread"
    options = (
        Option("rings", "int", 0, "io_uring rings, one SQPOLL kernel thread each (0: half the "
               "cores, at most 8, at least one per target)", minimum=0),
        Option("ring_entries", "int", 0, "SQ entries per ring (0: iodepth); iodepth may not "
               "exceed it, the CQ gets twice as many", minimum=0),
        Option("threads", "int", 0, "GPU requester threads (0: rings x iodepth, one per request "
               "slot); more than that share the slots", minimum=0),
        Option("sq_thread_cpu", "intlist", (), "CPUs the rings' SQPOLL threads are pinned to, "
               "round-robin (default: not pinned)"),
        Option("sq_thread_idle", "time", 1_000_000_000, "how long an SQPOLL thread spins before "
               "it sleeps (the host wakes it)", minimum=1_000_000),
        Option("sqe_async", "bool", True, "set IOSQE_ASYNC: the kernel's io-wq workers run the "
               "reads instead of the SQPOLL thread itself (2x on RAM-backed targets)"),
        Option("land", "str", "gpu", "where a read's bytes end: 'gpu' (copied into GPU memory) "
               "or 'host' (left in the pinned host slots, for comparison)",
               choices=("gpu", "host")),
        Option("stall_timeout", "time", 10_000_000_000, "stop the kernels and fail when no read "
               "completes for this long", minimum=1_000_000),
    )

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.random_distribution.kind != "random":
            raise BadInput(f"job '{job.name}': gpu-uring draws offsets on the GPU, uniformly; "
                           f"random_distribution '{job.random_distribution.kind}' is not "
                           "supported by this engine")
        ring_sizes(job.iodepth, job.engine_options["ring_entries"] or None)

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = _options(job)
        return {**super().describe(job), "gpus": list(job.gpu_list),
                "lands_in": "gpu memory" if o["land"] == "gpu" else "pinned host memory",
                "rings": o["rings"], "iodepth_per_ring": job.iodepth,
                "requester_threads": o["threads"], "sqe_async": o["sqe_async"]}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        o = _options(job)
        self._opts = o
        cp = gpu.use(job.gpu_of(ctx.worker))
        self._cp = cp
        self._kernels_done = True
        self._mem = None
        mod = cuda.module("gpu_uring")
        self._agent_fn, self._bench_fn = mod.get_function("gio_agent"), mod.get_function("gio_bench")
        sq, cq = ring_sizes(job.iodepth, o["ring_entries"] or None)
        self.rings = GpuRings(o["rings"], sq, cq, idle_ms=o["sq_thread_idle"] // 1_000_000,
                              cpus=o["sq_thread_cpu"])
        try:
            self._setup(job, targets, ctx, o)
        except BaseException:
            self.close()
            raise

    def _setup(self, job: Job, targets: list[Target], ctx: WorkerContext, o: dict[str, Any]) -> None:
        cp, nr, depth, bs, nt = self._cp, o["rings"], job.iodepth, job.bs, len(targets)
        slots = nr * depth
        self._mem = aligned_buffer(slots * bs)
        self._landing = np.frombuffer(self._mem, dtype=np.uint8).ctypes.data
        gpu.register_host(self._landing, len(self._mem), mapped=True)
        self._registered = True
        nthreads = o["threads"]
        self._blocks = -(-nthreads // TPB)
        try:
            d = self._dev = {
                "rings": cp.asarray(self.rings.descriptors),
                "state": cp.zeros(slots, cp.int32), "res": cp.zeros(slots, cp.int32),
                "off": cp.zeros(slots, cp.uint64), "len_fd": cp.zeros(slots, cp.uint64),
                "control": cp.zeros(8, cp.int32), "ring_stats": cp.zeros(2 * nr, cp.uint64),
                "claim": cp.zeros(1, cp.uint64),
                "dst": cp.empty(nthreads * bs if o["land"] == "gpu" else 16, cp.uint8),
                "fds": cp.asarray(np.array([t.fd for t in targets], np.int32)),
                "pat_seed": cp.asarray(np.array([t.pattern_seed or 0 for t in targets], np.uint64)),
                "live": cp.zeros(3, cp.uint64), "hist": cp.zeros(PLAT_NR, cp.uint64),
                "lat": cp.asarray(np.array([0, U64_MAX, 0], np.uint64)),
                "lat_sq": cp.zeros(1, cp.float64), "tstats": cp.zeros(4 * nt, cp.uint64),
                "errs": cp.zeros(nt * ERRNO_SLOTS, cp.uint64), "bad": cp.zeros(1 + 2 * BAD_KEEP, cp.uint64),
            }
        except cp.cuda.memory.OutOfMemoryError:
            raise BadInput(f"gpu {job.gpu_of(ctx.worker)}: out of memory for "
                           f"{nthreads * bs} bytes of destination buffers") from None
        starts, nblocks = ctx.stream.region_arrays()
        d["starts"], d["nblocks"] = cp.asarray(starts), cp.asarray(nblocks)
        d["pat_mix"] = cp.asarray(gpuverify.seed_mixes(d["pat_seed"].get()))
        d["control"][C_REQUESTERS] = self._blocks * TPB
        p = lambda name: d[name].data.ptr  # noqa: E731
        d["queue"] = cp.asarray(np.array([
            p("rings"), nr, depth, p("state"), p("res"), p("off"), p("len_fd"), self._landing, bs,
            uring.SQE_ASYNC if o["sqe_async"] else 0, p("control"), p("ring_stats")], np.uint64))
        flags = ((B_RANDOM if job.random else 0) | (B_FILE_RANDOM if job.file_service == "random" else 0)
                 | (B_LAND_GPU if o["land"] == "gpu" else 0) | (B_VERIFY if ctx.verifying else 0)
                 | (B_CONTINUE if job.continue_on_error else 0))
        budget = ctx.stream.remaining
        seed = int(np.random.default_rng([job.randseed, ctx.worker]).integers(0, 1 << 63))
        d["bench"] = cp.asarray(np.array([
            p("fds"), p("starts"), p("nblocks"), nt, bs, flags, seed,
            U64_MAX if budget is None else budget, p("claim"), p("dst"), nthreads,
            p("pat_seed"), p("pat_mix"), pattern.MAGIC, pattern.BLOCK, pattern.HEADER_WORDS,
            p("live"), p("hist"), p("lat"), p("lat_sq"), p("tstats"), p("errs"), p("bad")],
            np.uint64))
        self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
        cp.cuda.Device().synchronize()

    def _set(self, word: int, value: int) -> None:
        """Write a control word in device memory while the kernels run (own stream)."""
        s = self._streams[2]
        self._dev["control"][word:word + 1].set(np.array([value], np.int32), stream=s)
        s.synchronize()

    def _get(self, name: str) -> np.ndarray:
        s = self._streams[2]
        out = self._dev[name].get(stream=s)
        s.synchronize()
        return out

    def _running(self) -> bool:
        return not (self._streams[0].done and self._streams[1].done)

    def run(self) -> None:
        ctx, o = self.ctx, self._opts
        agent_s, bench_s = self._streams[0], self._streams[1]
        self._kernels_done = False
        self._agent_fn((o["rings"],), (32,), (self._dev["queue"],), stream=agent_s)
        deadline = time.monotonic() + START_LIMIT_S
        while self._get("control")[C_AGENTS] < o["rings"]:
            if time.monotonic() > deadline:
                self._abort(f"agent warps did not start within {START_LIMIT_S:g} s")
            time.sleep(POLL_S)
        measuring = stopping = False
        if ctx.control.measuring:  # no ramp: the first completions count
            self._set(C_MEASURING, 1)
            measuring = True
        self._bench_fn((self._blocks,), (TPB,), (self._dev["queue"], self._dev["bench"]),
                       stream=bench_s)
        watchdog = Watchdog(o["stall_timeout"], time.monotonic_ns())
        last_pull = 0
        while True:
            if not measuring and ctx.control.measuring:
                self._set(C_MEASURING, 1)
                measuring = True
            if not stopping and ctx.done:
                self._set(C_STOP, 1)
                stopping = True
            self.rings.wake()
            running = self._running()
            now = time.monotonic_ns()
            if not running or now - last_pull > PULL_NS:
                live = self._get("live")
                ctx.publish(int(live[0]), int(live[1]), int(live[2]), self._get("hist"))
                last_pull = now
                if running and watchdog.update(int(live[0]), now):
                    self._abort(stall_report(o["stall_timeout"], self.rings.states(),
                                             self._slot_counts()))
            if not running:
                break
            time.sleep(POLL_S)
        self._kernels_done = True
        self._collect()

    def _slot_counts(self) -> dict[str, int]:
        counts = np.bincount(self._get("state"), minlength=len(SLOT_STATES))
        return {name: int(counts[i]) for i, name in enumerate(SLOT_STATES)}

    def _abort(self, why: str) -> None:
        """Stop the kernels now (in-flight reads are abandoned), keep the counts, raise."""
        self._set(C_ABORT, 1)
        deadline = time.monotonic() + ABORT_WAIT_S
        while self._running() and time.monotonic() < deadline:
            self.rings.wake()
            time.sleep(POLL_S)
        self._kernels_done = not self._running()
        if self._kernels_done:
            self._collect()
        else:
            why += f"; the kernels did not stop within {ABORT_WAIT_S:g} s"
        raise GpuStall(why)

    def _collect(self) -> None:
        """Hand the GPU's counts to the worker context as this worker's record."""
        nt = len(self.targets)
        live, lat = self._get("live"), self._get("lat")
        tstats = self._get("tstats").reshape(nt, 4).astype(np.int64)
        errs = self._get("errs").reshape(nt, ERRNO_SLOTS)
        bad = self._get("bad")
        nbad = min(int(bad[0]), BAD_KEEP)
        self.ctx.absorb(DeviceTotals(
            completed=int(live[0]), ios=int(live[1]), bytes=int(live[2]),
            hist=self._get("hist").astype(np.int64), lat_sum=int(lat[0]),
            lat_sumsq=float(self._get("lat_sq")[0]), lat_min=int(lat[1]), lat_max=int(lat[2]),
            target_ios=tstats[:, 0], target_bytes=tstats[:, 1], short=tstats[:, 2],
            verify_failures=tstats[:, 3],
            errors={(int(t), int(e)): int(errs[t, e]) for t, e in zip(*np.nonzero(errs))},
            bad_offsets=[(int(bad[1 + 2 * i]), int(bad[2 + 2 * i])) for i in range(nbad)]))

    def close(self) -> None:
        """Tear down rings and buffers, unless a kernel that would still touch them runs on."""
        if not self._kernels_done:
            return  # freeing memory a running kernel uses would crash the process instead
        self._dev = {}
        if self._mem is not None:
            if getattr(self, "_registered", False):
                gpu.unregister_host(self._landing)
                self._registered = False
            self._mem.close()
            self._mem = None
        self.rings.close()
