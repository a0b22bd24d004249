"""cufile: NVIDIA cuFile through KvikIO, GPUDirect Storage when the host has it.

The engine's channel moves requests between the files and GPU memory: KvikIO futures
(the default api), run by KvikIO's thread pool, or cuFile's own batch and stream APIs; the
block loop above it (loops/block_gpu_slots) keeps ``iodepth`` reads (or writes, from GPU memory the
pattern was generated in) in flight, each in its own slot of GPU memory. Without the
nvidia-fs driver cuFile (and KvikIO) fall back to compat mode: POSIX reads into a host
bounce buffer, then a copy to the GPU. The two are different data paths, so the mode is
part of every label gpufio prints and of the result, and ``require_gds`` refuses to run in
compat mode at all. A read is complete when its future is done: KvikIO resolves it only
once the bytes are in GPU memory.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import GPU, Capability, Channel, ChannelSpec, File, drain
from gpufio.engines import register
from gpufio.engines.base import PROCESSES, Engine
from gpufio.io import cufile_api
from gpufio.io.watchdog import STALL_LIMIT_NS

if TYPE_CHECKING:
    from gpufio.core.job import Job
    from gpufio.facts.system import Host

POLL_S = 5e-6
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


def _inflight(job: Job, depth: int | None = None) -> int:
    """The I/Os one process keeps in flight, ``depth`` (the job's iodepth unless a loop asks
    for another: a GNN job's rows pick theirs) for each of its workers: they share one
    cuFile driver and one KvikIO pool."""
    per = job.iodepth if depth is None else depth
    return per * (1 if CuFile.settings(job).processes else job.numjobs)


def _threads(job: Job, depth: int | None = None) -> int:
    """KvikIO's pool size (one pool per process): the option, or a thread for every read the
    process keeps queued."""
    return CuFile.settings(job).threads or _inflight(job, depth)


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

    capability = Capability(memory=(GPU,))

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
        status = super().status()
        return f"{status}, mode {cufile_mode()}" if status == "available" else status

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
        if s.api != "kvikio" and job.iodepth is not None:
            inflight = _inflight(job)
            cufile_api.binding(s.threads, job.bs, inflight)  # before KvikIO opens the driver
            pool = cufile_api.pool_facts()
        mode = cufile_mode(s.api)
        if s.require_gds and mode != "gds":
            raise BadInput(f"job '{job.name}': engine 'cufile': require_gds is set, but cuFile "
                           "runs in compat mode here (no GPUDirect Storage driver, or "
                           "KVIKIO_COMPAT_MODE=on)")
        if pool is not None and mode == "compat":  # GDS moves the bytes without the pool
            short = cufile_api.pool_shortfall(job.bs, inflight)
            if short:
                raise BadInput(f"job '{job.name}': {short}")
        facts = {**super().describe(job), "mode": mode, "api": s.api,
                 "register_buffers": s.register_buffers, "gpus": list(job.gpu_list),
                 "lands_in": "gpu memory", **({"cufile_posix_pool": pool} if pool else {})}
        if s.api == "kvikio":
            if job.iodepth is not None:  # None: a GNN job's rows pick their depth
                facts["kvikio"] = {"threads": _threads(job), "task_size": max(job.bs, 4096),
                                   "gds_threshold": 0, "bounce_buffer_size": max(job.bs, 4096)}
        else:
            facts["cufile_io_threads"] = s.threads or "cufile.json's"
        return facts

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> Channel:
        """Requests between the files and GPU memory (device pointers) through the job's
        api: KvikIO futures, or cuFile's batch or stream API. The block loop above
        (loops/block_gpu_slots) keeps ``iodepth`` of them in flight, each in its own GPU slot."""
        s = cls.settings(job)
        if s.api == "kvikio":
            return KvikioChannel(files, spec, _threads(job, spec.depth), job.direct,
                                 s.register_buffers)
        return CuFileApiChannel(job, files, spec, s)


class PolledChannel(Channel):
    """A channel whose completions are polled (KvikIO futures, cuFile's batch status, CUDA
    events): ``reap`` with a wait asks every POLL_S until one is done or the wait is over,
    so a wedged path ends in a diagnostic, never in a blocking call."""

    @abstractmethod
    def _poll(self) -> tuple[np.ndarray, np.ndarray]:
        """(tags, results) of the requests done since the last poll."""

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        deadline = None if wait_ns is None else time.perf_counter_ns() + wait_ns
        while True:
            tags, res = self._poll()
            if len(tags) or not self.inflight or deadline is None \
                    or time.perf_counter_ns() > deadline:
                return tags, res
            time.sleep(POLL_S)


class Span:
    """``nbytes`` of GPU memory at ``addr`` as KvikIO takes a buffer (the CUDA array
    interface), made once per distinct request buffer."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (addr, False), "strides": None, "version": 3}


# distinct request buffers a KvikIO channel keeps a Span for (a loop's slots are reused)
SPANS = 1 << 14
EMPTY = np.zeros(0, np.int64)


class KvikioChannel(PolledChannel):
    """The default api: one KvikIO future per request, run by KvikIO's thread pool of
    ``threads`` (one pool per process)."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec, threads: int, direct: bool,
                 register: bool) -> None:
        import kvikio

        super().__init__(spec)
        configure(threads, spec.largest, direct)
        self._files = [kvikio.CuFile(f.path, "r+" if spec.writes else "r") for f in files]
        n = spec.depth
        self._futures: list[Any] = [None] * n
        self._tags = [0] * n  # a list: one store per request, cheaper than an array's
        self._order = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        self._free = list(range(n))
        self._issued = 0
        self._spans: dict[tuple[int, int], Span] = {}
        self._registered: Span | None = None
        if register and spec.region is not None and spec.region[1]:
            self._registered = Span(*spec.region)
            kvikio.buffer_register(self._registered)
        # compat mode is labelled in every result that shows a cuFile run
        self.facts = {"iodepth": n, "mode": cufile_mode()}

    @property
    def inflight(self) -> int:
        return len(self._futures) - len(self._free)

    def _span(self, addr: int, nbytes: int) -> Span:
        span = self._spans.get((addr, nbytes))
        if span is None:
            if len(self._spans) >= SPANS:
                self._spans.clear()
            span = self._spans[addr, nbytes] = Span(addr, nbytes)
        return span

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(len(self._free), len(off))
        for t, o, n, a, w, g in zip(tgt[:k].tolist(), off[:k].tolist(), length[:k].tolist(),
                                    addr[:k].tolist(), cufile_api.flags(write, k), tag[:k].tolist()):
            e = self._free.pop()
            f = self._files[t]
            self._futures[e] = (f.pwrite if w else f.pread)(self._span(a, n), n, o, task_size=n)
            self._tags[e] = g
            self._order[e], self._issued = self._issued, self._issued + 1
        return k

    def _poll(self) -> tuple[np.ndarray, np.ndarray]:
        """Nothing until the oldest request is done (one future asked per poll while
        waiting), then every done one."""
        oldest = self._futures[int(self._order.argmin())]
        if oldest is None or not oldest.done():
            return EMPTY, EMPTY
        done = [e for e, f in enumerate(self._futures) if f is not None and f.done()]
        res = np.empty(len(done), dtype=np.int64)
        for i, e in enumerate(done):
            try:
                res[i] = self._futures[e].get()
            except Exception as err:  # KvikIO raises on a failed I/O without an errno
                res[i] = -(getattr(err, "errno", None) or errno.EIO)
            self._futures[e] = None
            self._order[e] = np.iinfo(np.int64).max
        self._free.extend(done)
        return np.array([self._tags[e] for e in done], dtype=np.int64), res

    def state(self) -> str:
        return f"{self.inflight} KvikIO futures in flight"

    def close(self) -> None:
        import kvikio

        drain(self, STALL_LIMIT_NS)
        for f in self._files:
            f.close()
        if self._registered is not None:
            kvikio.buffer_deregister(self._registered)
        self._spans.clear()


class CuFileApiChannel(PolledChannel):
    """cuFile's batch or stream API (io/cufile_api) over the files, with the loop's buffer
    region registered when the job asks; closing waits for what is in flight."""

    def __init__(self, job: Job, files: Sequence[File], spec: ChannelSpec, settings: Any) -> None:
        super().__init__(spec)
        self.api = settings.api
        cf = cufile_api.binding(settings.threads, spec.largest, _inflight(job, spec.depth))
        self._cf, self._fds = cf, [f.fd for f in files]
        self._handles = [cufile_api.register_handle(cf, f.fd, f.path) for f in files]
        base, nbytes = spec.region or (0, 0)
        self._registered = 0
        if settings.register_buffers and nbytes:
            cf.buf_register(base, nbytes, 0)
            self._registered = base
        if self.api == "batch":
            self._q: Any = cufile_api.BatchQueue(cf, self._handles, base, spec.depth,
                                                 batch_size(job, settings, cf))
        else:
            import cupy

            self._q = cufile_api.StreamQueue(
                cf, cupy, self._handles, spec.depth, settings.streams or min(spec.depth, 16),
                cufile_api.aligned(spec.largest, job.bs, job.offset))
        self.facts = {"iodepth": spec.depth, "mode": cufile_mode(self.api)}

    @property
    def inflight(self) -> int:
        return self._q.busy()

    def room(self) -> int:
        return min(super().room(), self._q.room())

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        return self._q.submit(tgt, off, length, addr, write, tag)

    def _poll(self) -> tuple[np.ndarray, np.ndarray]:
        return self._q.poll()

    def state(self) -> str:
        return f"{self.inflight} cuFile {self.api} I/Os in flight"

    def close(self) -> None:
        drain(self, STALL_LIMIT_NS)
        self._q.close()
        if self._registered:
            self._cf.buf_deregister(self._registered)
        for fd in self._fds:
            cufile_api.deregister_handle(self._cf, fd)


def batch_size(job: Job, settings: Any, cf: Any) -> int:
    """Entries per cuFile batch: the option, or a quarter of the depth (up to the driver's
    limit), so that four batches take turns: a handle takes new I/Os only once all of its
    batch is done, and one batch of the whole depth would drain to empty before each submit.
    More than the driver takes is a one-line error naming the limit."""
    limit = cufile_api.max_batch(cf)
    if settings.iodepth_batch > limit:
        raise BadInput(f"job '{job.name}': iodepth_batch {settings.iodepth_batch} is more than "
                       f"cuFile's max_batch_io_size here ({limit}, properties.io_batchsize "
                       f"in cufile.json)")
    return settings.iodepth_batch or min(-(-job.iodepth // 4), limit)

