"""cufile: NVIDIA cuFile through KvikIO, GPUDirect Storage when the host has it.

Each worker keeps ``iodepth`` reads (or writes, ``pwrite`` from GPU memory the pattern was
generated in) in flight as KvikIO futures, each in its own slot of GPU memory; KvikIO's
thread pool runs them. Without the nvidia-fs driver cuFile (and
KvikIO) fall back to compat mode: POSIX reads into a host bounce buffer, then a copy to the
GPU. The two are different data paths, so the mode is part of every label gpufio prints and
of the result, and ``require_gds`` refuses to run in compat mode at all. A read is complete
when its future is done: KvikIO resolves it only once the bytes are in GPU memory.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.rows import RowSupport
from gpufio.core.slots import SlotTable
from gpufio.core.tensors import TensorSupport
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import gpu
from gpufio.io import verify as gpuverify
from gpufio.io.watchdog import STALL_LIMIT_NS, Stalled

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

POLL_S = 5e-6
PAGE = 4096
_settings_lock = threading.Lock()


def cufile_mode(api: str = "kvikio") -> str:
    """``gds`` when cuFile moves data by GPUDirect Storage here, ``compat`` when it (or, for
    the kvikio api, KvikIO itself) falls back to POSIX I/O through host memory."""
    try:
        import kvikio.cufile_driver
        import kvikio.defaults
    except ImportError:  # the raw APIs without KvikIO: GDS needs the nvidia-fs driver
        return "gds" if os.path.exists("/proc/driver/nvidia-fs/version") else "compat"
    if api == "kvikio" and kvikio.defaults.is_compat_mode_preferred():
        return "compat"
    try:
        return "gds" if kvikio.cufile_driver.get("is_gds_available") else "compat"
    except Exception:  # the driver cannot even be opened: cuFile will run in compat mode
        return "compat"


def configure(threads: int, io_bytes: int, direct: bool) -> None:
    """Set KvikIO's process-wide settings once, before any worker reads (they share a pool):
    ``threads`` pool threads, one task per read of ``io_bytes``, every size sent to cuFile."""
    import kvikio.defaults

    with _settings_lock:
        # bounce buffers (compat mode) of one read each: KvikIO's 16 MiB default, per thread,
        # would pin GBs for a pool of small reads
        wanted = {"num_threads": threads, "task_size": max(io_bytes, 4096),
                  "bounce_buffer_size": max(io_bytes, 4096),
                  "gds_threshold": 0, "auto_direct_io_read": direct,
                  "auto_direct_io_write": direct}
        for key, value in wanted.items():
            if kvikio.defaults.get(key) != value:
                kvikio.defaults.set(key, value)


def settled(future: Any, deadline_ns: int) -> bool:
    """Whether a KvikIO future is done by ``deadline_ns`` (perf_counter_ns), polled: a
    wedged path must end in a diagnostic, never in a blocking get()."""
    while not future.done():
        if time.perf_counter_ns() > deadline_ns:
            return False
        time.sleep(POLL_S)
    return True


def _inflight(job: Job) -> int:
    """The I/Os one process keeps in flight, iodepth for each of its workers: they share
    one cuFile driver and one KvikIO pool."""
    return job.iodepth * (1 if CuFile.settings(job).processes else job.numjobs)


def _threads(job: Job) -> int:
    """KvikIO's pool size (one pool per process): the option, or a thread for every read the
    process keeps queued."""
    return CuFile.settings(job).threads or _inflight(job)


# filesystems cuFile moves data on by GPUDirect (with nvidia-fs); on others it falls back
GDS_FILESYSTEMS = ("ext4", "xfs", "lustre", "wekafs", "gpfs", "beegfs", "nfs")


def _p2pdma_checks(host: Host) -> list[Check]:
    """The prerequisites of GDS without nvidia-fs, through the kernel's PCI P2PDMA."""
    area = "cufile P2PDMA"
    kernel = host.kernel_version()
    driver = host.nvidia_driver()
    major = int(driver[0].split(".")[0]) if driver and driver[0][0].isdigit() else 0
    config = host.kernel_config("CONFIG_PCI_P2PDMA")
    dwords = host.module_param("nvidia", "NVreg_RegistryDwords") or ""
    multipath = host.module_param("nvme_core", "multipath")
    return [
        verdict(area, "kernel >= 6.2", kernel >= (6, 2), host.kernel_release(),
                "P2PDMA for GDS needs Linux 6.2 or newer"),
        verdict(area, "CONFIG_PCI_P2PDMA", config == "y",
                f"CONFIG_PCI_P2PDMA={config}" if config else "not set, or no kernel config found "
                "(/boot/config-*, /proc/config.gz)", "build the kernel with CONFIG_PCI_P2PDMA=y"),
        verdict(area, "open driver >= 565", bool(driver and driver[1] and major >= 565),
                (f"{driver[0]}, {'open' if driver[1] else 'proprietary'} kernel module"
                 if driver else "no NVIDIA driver"),
                "install NVIDIA's open kernel modules, 565 or newer"),
        verdict(area, "RMForceStaticBar1", "RMForceStaticBar1=1" in dwords.replace(" ", ""),
                f"NVreg_RegistryDwords={dwords!r}",
                "load nvidia with NVreg_RegistryDwords=\"RMForceStaticBar1=1\""),
        verdict(area, "nvme_core multipath=N", multipath == "N", f"multipath={multipath}",
                "load nvme_core with multipath=N (native NVMe multipath hides the PCI path)"),
    ]


def _gds_target(area: str, path: str) -> Check:
    """Whether cuFile can move data on ``path``'s filesystem by GPUDirect."""
    from gpufio.facts.device import path_facts

    try:
        facts = path_facts(path)
    except OSError as e:
        return Check(area, f"target {path}", "fail", e.strerror or str(e), "name an existing target")
    fs = facts.get("filesystem") or ("raw " + facts.get("device", "device")
                                     if facts.get("kind") == "block" else "?")
    able = facts.get("kind") == "block" and facts.get("device", "").startswith("nvme") \
        or fs in GDS_FILESYSTEMS
    return verdict(area, f"target {path}", able and not facts.get("ram_backed"),
                   f"{fs}" + (f", ram-backed ({facts.get('ram_backing')})"
                              if facts.get("ram_backed") else ""),
                   "cuFile runs compat mode on this filesystem: use ext4 or XFS on NVMe")


def _udev_record(host: Host, area: str, path: str) -> Check:
    """Whether udev's database records the filesystem of ``path``'s block device: cuFile's
    handle registration reads it, and fails without it (5027) even in compat mode."""
    try:
        dev = os.stat(path).st_dev
    except OSError as e:
        return Check(area, f"udev record for {path}", "fail", e.strerror or str(e),
                     "name an existing target")
    rec = f"run/udev/data/b{os.major(dev)}:{os.minor(dev)}"
    text = host.read(rec) or ""
    fs = next((line.split("=", 1)[1] for line in text.splitlines()
               if line.startswith("E:ID_FS_TYPE=")), None)
    return verdict(area, f"udev record for {path}", fs is not None,
                   f"/{rec}: ID_FS_TYPE={fs}" if fs else f"/{rec}: none (no udevd, or not a "
                   "block device: tmpfs has none)",
                   "run udevd (or write the record: E:ID_FS_USAGE=filesystem, E:ID_FS_TYPE=...); "
                   "on tmpfs, cuFile's own APIs cannot register files: use api = \"kvikio\"")


@register
class CuFile(Engine):
    """KvikIO futures reading straight into GPU memory; mode gds or compat, always labelled."""

    name = "cufile"
    rows = RowSupport(gpu_only=True)
    tensors = TensorSupport(host=False)
    summary = ("NVIDIA cuFile through KvikIO: GPUDirect Storage, or compat mode "
               "(POSIX reads through host memory) where the host has no GDS driver")
    peer = "gdsio -x 0, fio libcufile, KvikIO"
    fio_engines = {"libcufile": "", "libcufile:cufile": ""}
    uses_gpu = True
    worker_kind = "thread"
    options = (
        Option("threads", "int", 0, "api kvikio: KvikIO's thread-pool size, shared by the "
               "process (0: a thread per I/O the process keeps queued); api batch or async: "
               "cuFile's own I/O threads, execution.max_io_threads (0: cufile.json's)",
               minimum=0),
        Option("require_gds", "bool", False, "fail instead of running in cuFile compat mode"),
        Option("api", "str", "kvikio", "how I/Os reach cuFile: KvikIO futures, cuFile's batch "
               "API (cuFileBatchIOSubmit), or its stream API (cuFileReadAsync/WriteAsync)",
               choices=("kvikio", "batch", "async")),
        Option("iodepth_batch", "int", 0, "api batch: I/Os per cuFile batch, as fio's "
               "iodepth_batch (0: a quarter of iodepth, up to the driver's max_batch_io_size)",
               minimum=0),
        Option("streams", "int", 0, "api async: CUDA streams the I/Os take turns on "
               "(0: iodepth, at most 16)", minimum=0),
        Option("register_buffers", "bool", False, "register the GPU buffers with cuFile "
               "(cuFileBufRegister), as gdsio does"),
        PROCESSES,
    )

    @classmethod
    def unavailable(cls) -> str | None:
        why = super().unavailable()
        if why:
            return why
        try:
            import kvikio  # noqa: F401
        except ImportError:
            return "KvikIO is not installed (pip install 'gpufio[gds]')"
        except Exception as e:  # a missing libcufile surfaces as the loader's own error type
            return f"KvikIO cannot load: {str(e).splitlines()[0]}"
        return None

    @classmethod
    def status(cls) -> str:
        why = cls.unavailable()
        return why or f"available, mode {cufile_mode()}"

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        """Why cuFile will run in gds or compat mode here (gds-nvidia-fs #30, fio #1915)."""
        from gpufio.facts.system import cufile_setting

        area = "cufile"
        nvfs = host.nvidia_fs_version()
        out = [verdict(area, "nvidia-fs (GDS driver)", nvfs is not None,
                       f"version {nvfs}" if nvfs else "not loaded",
                       "install NVIDIA's GDS package (nvidia-gds) and modprobe nvidia-fs, or meet "
                       "the P2PDMA prerequisites below")]
        p2p = _p2pdma_checks(host)
        out += p2p
        path, settings, error = host.cufile_json()
        use_p2p = cufile_setting(settings, "properties.use_pci_p2pdma")
        if settings is None:
            out.append(Check(area, "cufile.json", "warn", f"{path}: {error}",
                             "cuFile's defaults apply; set CUFILE_ENV_PATH_JSON to your cufile.json"))
        else:
            # the POSIX pool: compat mode's bounce buffers, one per batch or stream I/O in
            # flight (gpufio raises the count of a job's class for its run: cufile_api)
            keys = ("properties.allow_compat_mode", "properties.io_batchsize",
                    "properties.use_poll_mode", "properties.use_pci_p2pdma",
                    "properties.max_direct_io_size_kb", "properties.posix_pool_slab_size_kb",
                    "properties.posix_pool_slab_count")
            found = ", ".join(f"{k.split('.')[-1]}={cufile_setting(settings, k)}" for k in keys
                              if cufile_setting(settings, k) is not None)
            out.append(Check(area, "cufile.json", "ok", f"{path}: {found or 'no settings'}"))
        groups = host.iommu_groups()
        passthrough = "iommu=pt" in host.cmdline() or "iommu=off" in host.cmdline()
        out.append(verdict(area, "IOMMU", groups == 0 or passthrough,
                           f"{groups} IOMMU groups, " + ("passthrough" if passthrough else
                                                        "translating" if groups else "off"),
                           "GPUDirect needs the IOMMU off or in passthrough: boot with iommu=pt"))
        p2p_ok = all(c.status == "ok" for c in p2p) and use_p2p is True
        mode = "gds" if nvfs or p2p_ok else "compat"
        how = "nvidia-fs" if nvfs else "P2PDMA" if p2p_ok else "no GDS driver, no P2PDMA"
        out.append(verdict(area, "mode cuFile will take", mode == "gds", f"{mode} ({how})",
                           "compat mode reads through a host bounce buffer: a CPU path, "
                           "labelled compat in every result"))
        for job in jobs:
            for t in job.targets:
                out.append(_gds_target(area, t))
                if cls.settings(job).api != "kvikio":
                    out.append(_udev_record(host, area, t))
        return out

    @classmethod
    def check_job(cls, job: Job) -> None:
        s = cls.settings(job)
        if s.api != "batch" and s.iodepth_batch:
            raise BadInput(f"job '{job.name}': iodepth_batch is for api 'batch' "
                           f"(api is '{s.api}')")
        if s.api != "async" and s.streams:
            raise BadInput(f"job '{job.name}': streams is for api 'async' (api is '{s.api}')")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        s = cls.settings(job)
        pool = None
        if s.api != "kvikio":
            from gpufio.io import cufile_api

            inflight = _inflight(job)
            cufile_api.binding(s.threads, job.bs, inflight)  # before KvikIO opens the driver
            pool = cufile_api.pool_facts()
        mode = cufile_mode(s.api)
        if pool is not None and mode == "compat":  # GDS moves the bytes without the pool
            short = cufile_api.pool_shortfall(job.bs, inflight)
            if short:
                raise BadInput(f"job '{job.name}': {short}")
        facts = {**super().describe(job), "mode": mode, "api": s.api,
                 "register_buffers": s.register_buffers, "gpus": list(job.gpu_list),
                 "lands_in": "gpu memory", **({"cufile_posix_pool": pool} if pool else {})}
        if s.api == "kvikio":
            facts["kvikio"] = {"threads": _threads(job), "task_size": max(job.bs, 4096),
                               "gds_threshold": 0, "bounce_buffer_size": max(job.bs, 4096)}
        else:
            facts["cufile_io_threads"] = s.threads or "cufile.json's"
        return facts

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        cp = gpu.use(job.gpu_of(ctx.worker))
        s = self.settings(job)
        if s.require_gds and self.describe(job)["mode"] != "gds":
            raise BadInput("engine 'cufile': require_gds is set, but cuFile runs in compat mode "
                           "here (no GPUDirect Storage driver, or KVIKIO_COMPAT_MODE=on)")
        try:
            self._alloc = cp.empty(job.iodepth * job.bs + PAGE, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            raise BadInput(f"gpu {job.gpu_of(ctx.worker)}: out of memory for "
                           f"{job.iodepth * job.bs} bytes of buffers") from None
        # page-aligned slots: cuFile's registered streams and GPUDirect want aligned buffers
        skip = -self._alloc.data.ptr % PAGE
        self.dev = self._alloc[skip:skip + job.iodepth * job.bs]
        self._rows = self.dev.reshape(job.iodepth, job.bs)
        self._cp = cp
        self._words = self.dev.view(cp.uint64)
        self.queue = open_queue(job, s, targets, self.dev, cp)
        if ctx.verifying or job.writes:
            gpuverify.compile_kernel()

    def _fill(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray) -> None:
        """The pattern of each write's offset into its slot of GPU memory, finished before
        cuFile (or KvikIO's threads) read the slots."""
        cp = self._cp
        gpuverify.fill(self._words, cp.asarray(slots.astype(np.uint64)),
                       cp.asarray(offs.astype(np.uint64)), cp.asarray(self.ctx.seeds(tgt)),
                       len(slots), self.job.bs)
        cp.cuda.Stream.null.synchronize()

    def run(self) -> None:
        ctx, depth, job, queue = self.ctx, self.job.iodepth, self.job, self.queue
        table = SlotTable(depth)
        slot_writes = np.zeros(depth, dtype=bool)
        free = list(range(depth))
        inflight = 0
        fds = [t.fd for t in self.targets]
        issuing, syncing = True, False
        while True:
            if syncing and not inflight:
                ctx.sync(fds)
                syncing = False
            room = min(len(free), queue.room())
            if issuing and room and not syncing:
                tgt, offs = ctx.next_batch(min(room, ctx.until_sync) if job.writes else room)
                issuing = bool(len(offs))
                kinds = np.array(ctx.write_flags(len(offs)), dtype=bool)
                slots = np.array([free.pop() for _ in range(len(offs))], dtype=np.int64)
                if kinds.any():
                    self._fill(slots, tgt, offs)
                table.issue(slots, tgt, offs, time.perf_counter_ns())
                slot_writes[slots] = kinds
                queue.submit(slots, tgt.astype(np.int64), offs.astype(np.int64), kinds)
                inflight += len(slots)
                nwrites = int(kinds.sum())
                syncing = bool(nwrites) and ctx.sync_due(nwrites)
            if not inflight:
                if syncing:
                    continue
                return
            done, res = self._wait_some(table.t_issue, free, inflight)
            inflight -= len(done)
            self._finish(done, res, table, slot_writes)
            free.extend(done.tolist())

    def _wait_some(self, t_issue: np.ndarray, free: list[int],
                   inflight: int) -> tuple[np.ndarray, np.ndarray]:
        """(slots, results) of at least one finished I/O, polling the queue until there is
        one; an I/O older than the stall limit is a diagnostic, never a hang."""
        busy = np.ones(len(t_issue), dtype=bool)
        busy[free] = False
        oldest = int(t_issue[busy].min())
        while True:
            done, res = self.queue.poll()
            if len(done):
                return done, res
            if time.perf_counter_ns() - oldest > STALL_LIMIT_NS:
                raise Stalled(f"a cuFile I/O ({self.queue.api}) has not finished in "
                              f"{STALL_LIMIT_NS / 1e9:g} s ({inflight} in flight)")
            time.sleep(POLL_S)

    def _finish(self, slots: np.ndarray, res64: np.ndarray, table: SlotTable,
                slot_writes: np.ndarray) -> None:
        now = time.perf_counter_ns()
        res = res64.astype(np.int32)
        bad = None
        if self.ctx.verifying:
            def bad(tgt: np.ndarray, offs: np.ndarray) -> list[int]:
                return gpuverify.landed_mismatches(self._rows[self._cp.asarray(slots)],
                                                   self.ctx.seeds(tgt), offs, res)
        table.complete(self.ctx, slots, res, now, bad,
                       slot_writes[slots] if self.job.mixed else self.job.writes)

    def close(self) -> None:
        """Let I/Os still in flight (a failed run) land before their buffers go away."""
        self.queue.close()
        self._rows = self._words = None
        self.dev = self._alloc = None


class KvikioQueue:
    """The default api: one KvikIO future per I/O, run by KvikIO's thread pool."""

    api = "kvikio"

    def __init__(self, job: Job, settings: Any, targets: list[Target], dev: Any) -> None:
        import kvikio

        configure(_threads(job), job.bs, job.direct)
        self._bs = job.bs
        self._slots = [dev[i * job.bs:(i + 1) * job.bs] for i in range(job.iodepth)]
        self._files = [kvikio.CuFile(t.path, "r+" if job.writes else "r") for t in targets]
        self._futures: list[Any] = [None] * job.iodepth
        self._order = np.full(job.iodepth, np.iinfo(np.int64).max, dtype=np.int64)
        self._issued = 0
        self._registered = None
        if settings.register_buffers:
            kvikio.buffer_register(dev)
            self._registered = dev

    def room(self) -> int:
        return len(self._futures)

    def submit(self, slots: np.ndarray, tgt: np.ndarray, offs: np.ndarray,
               writes: np.ndarray) -> None:
        bs = self._bs
        for s, t, off, w in zip(slots.tolist(), tgt.tolist(), offs.tolist(), writes.tolist()):
            f = self._files[t]
            self._futures[s] = (f.pwrite if w else f.pread)(self._slots[s], bs, off, task_size=bs)
            self._order[s], self._issued = self._issued, self._issued + 1

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        """Nothing until the oldest I/O is done (one future asked per poll while waiting),
        then every done one."""
        oldest = self._futures[int(self._order.argmin())]
        if oldest is None or not oldest.done():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        done = [s for s, f in enumerate(self._futures) if f is not None and f.done()]
        res = np.empty(len(done), dtype=np.int64)
        for i, s in enumerate(done):
            try:
                res[i] = self._futures[s].get()
            except Exception as e:  # KvikIO raises on a failed I/O without an errno
                res[i] = -(getattr(e, "errno", None) or errno.EIO)
            self._futures[s] = None
            self._order[s] = np.iinfo(np.int64).max
        return np.array(done, dtype=np.int64), res

    def close(self) -> None:
        import kvikio

        deadline = time.perf_counter_ns() + STALL_LIMIT_NS
        for fut in self._futures:
            if fut is not None:
                settled(fut, deadline)
        for f in self._files:
            f.close()
        if self._registered is not None:
            kvikio.buffer_deregister(self._registered)
        self._slots.clear()


class RawQueue:
    """cuFile's batch or stream API (io/cufile_api) over the job's targets, with the slot
    buffer registered when the job asks; closing waits for what is in flight."""

    def __init__(self, job: Job, settings: Any, targets: list[Target], dev: Any, cp: Any) -> None:
        from gpufio.io import cufile_api

        self.api = settings.api
        cf = cufile_api.binding(settings.threads, job.bs, _inflight(job))
        self._cf, self._base, self._fds = cf, dev.data.ptr, [t.fd for t in targets]
        self._handles = [cufile_api.register_handle(cf, t.fd, t.path) for t in targets]
        self._registered = False
        if settings.register_buffers:
            cf.buf_register(self._base, dev.nbytes, 0)
            self._registered = True
        if self.api == "batch":
            self._q: Any = cufile_api.BatchQueue(cf, self._handles, self._base, job.bs,
                                                 job.iodepth, batch_size(job, settings, cf))
        else:
            self._q = cufile_api.StreamQueue(
                cf, cp, self._handles, self._base, job.bs, job.iodepth,
                settings.streams or min(job.iodepth, 16),
                cufile_api.aligned(job.bs, job.offset))
        self.room, self.submit, self.poll = self._q.room, self._q.submit, self._q.poll

    def close(self) -> None:
        from gpufio.io import cufile_api

        deadline = time.perf_counter_ns() + STALL_LIMIT_NS
        while self._q.busy() and time.perf_counter_ns() < deadline:
            self._q.poll()
            time.sleep(POLL_S)
        self._q.close()
        if self._registered:
            self._cf.buf_deregister(self._base)
        for fd in self._fds:
            cufile_api.deregister_handle(self._cf, fd)


def batch_size(job: Job, settings: Any, cf: Any) -> int:
    """Entries per cuFile batch: the option, or a quarter of the depth (up to the driver's
    limit), so that four batches take turns: a handle takes new I/Os only once all of its
    batch is done, and one batch of the whole depth would drain to empty before each submit.
    More than the driver takes is a one-line error naming the limit."""
    from gpufio.io import cufile_api

    limit = cufile_api.max_batch(cf)
    if settings.iodepth_batch > limit:
        raise BadInput(f"job '{job.name}': iodepth_batch {settings.iodepth_batch} is more than "
                       f"cuFile's max_batch_io_size here ({limit}, properties.io_batchsize "
                       f"in cufile.json)")
    return settings.iodepth_batch or min(-(-job.iodepth // 4), limit)


def open_queue(job: Job, settings: Any, targets: list[Target], dev: Any, cp: Any) -> Any:
    """The job's I/O queue for its ``api``."""
    if settings.api == "kvikio":
        return KvikioQueue(job, settings, targets, dev)
    return RawQueue(job, settings, targets, dev, cp)
