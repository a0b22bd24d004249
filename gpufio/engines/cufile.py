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

import contextlib
import errno
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.rows import RowFetchError, RowRequest, RowSupport, RowTable, row_error
from gpufio.core.slots import SlotTable
from gpufio.core.tensors import (
    Extent,
    TensorIOError,
    TensorRequest,
    TensorSupport,
    piece_error,
    pieces,
    sync_files,
)
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
_settings_lock = threading.Lock()


def cufile_mode() -> str:
    """``gds`` when cuFile moves data by GPUDirect Storage here, ``compat`` when KvikIO falls
    back to POSIX reads through host memory."""
    import kvikio.cufile_driver
    import kvikio.defaults

    if kvikio.defaults.is_compat_mode_preferred():
        return "compat"
    try:
        return "gds" if kvikio.cufile_driver.get("is_gds_available") else "compat"
    except Exception:  # the driver cannot even be opened: KvikIO will run in compat mode
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


def _threads(job: Job) -> int:
    """KvikIO's pool size (one pool per process): the option, or a thread for every read the
    process keeps queued, iodepth for each of its workers."""
    s = CuFile.settings(job)
    return s.threads or job.iodepth * (1 if s.processes else job.numjobs)


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


@register
class CuFile(Engine):
    """KvikIO futures reading straight into GPU memory; mode gds or compat, always labelled."""

    name = "cufile"
    rows = RowSupport(gpu_only=True)
    summary = ("NVIDIA cuFile through KvikIO: GPUDirect Storage, or compat mode "
               "(POSIX reads through host memory) where the host has no GDS driver")
    peer = "gdsio -x 0, fio libcufile, KvikIO"
    fio_engines = {"libcufile": "", "libcufile:cufile": ""}
    uses_gpu = True
    worker_kind = "thread"
    options = (
        Option("threads", "int", 0, "KvikIO thread-pool size, shared by the process "
               "(0: a thread per read the process keeps queued)", minimum=0),
        Option("require_gds", "bool", False, "fail instead of running in cuFile compat mode"),
        PROCESSES,
    )

    @classmethod
    def row_fetcher(cls, job: Job, table: RowTable, xp: Any, request: RowRequest) -> Any:
        return CuFileFetch(table, xp, request.dim, cls.settings(job).threads,
                           job.iodepth, request.direct)

    tensors = TensorSupport(host=False)

    @classmethod
    def tensor_mover(cls, job: Job, files: list[Target], extents: list[Extent], xp: Any,
                     request: TensorRequest) -> "CuFileTensors":
        gpu.use(job.gpu)
        return CuFileTensors(files, extents, request, cls.settings(job).threads)

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
            keys = ("properties.allow_compat_mode", "properties.max_batch_io_size",
                    "properties.use_poll_mode", "properties.use_pci_p2pdma",
                    "properties.max_direct_io_size_kb")
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
        return out

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        return {**super().describe(job), "mode": cufile_mode(), "gpus": list(job.gpu_list),
                "lands_in": "gpu memory", "kvikio_threads": _threads(job)}

    def __init__(self, job: Job, targets: list[Target], ctx: WorkerContext) -> None:
        super().__init__(job, targets, ctx)
        cp = gpu.use(job.gpu_of(ctx.worker))
        if self.settings(job).require_gds and cufile_mode() != "gds":
            raise BadInput("engine 'cufile': require_gds is set, but cuFile runs in compat mode "
                           "here (no GPUDirect Storage driver, or KVIKIO_COMPAT_MODE=on)")
        import kvikio

        configure(_threads(job), job.bs, job.direct)
        try:
            self.dev = cp.empty(job.iodepth * job.bs, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            raise BadInput(f"gpu {job.gpu_of(ctx.worker)}: out of memory for "
                           f"{job.iodepth * job.bs} bytes of buffers") from None
        self._rows = self.dev.reshape(job.iodepth, job.bs)
        self._slots = [self._rows[i] for i in range(job.iodepth)]
        self._files = [kvikio.CuFile(t.path, "r+" if job.writes else "r") for t in targets]
        self._cp = cp
        self._futures: list[Any] = []
        self._words = self.dev.view(cp.uint64)
        if ctx.verifying or job.writes:
            gpuverify.compile_kernel()

    def _fill(self, slots: list[int], tgt: np.ndarray, offs: np.ndarray) -> None:
        """The pattern of each write's offset into its slot of GPU memory, finished before
        KvikIO's threads read the slots."""
        cp = self._cp
        gpuverify.fill(self._words, cp.asarray(np.array(slots, np.uint64)),
                       cp.asarray(offs.astype(np.uint64)), cp.asarray(self.ctx.seeds(tgt)),
                       len(slots), self.job.bs)
        cp.cuda.Stream.null.synchronize()

    def run(self) -> None:
        ctx, bs, depth, job = self.ctx, self.job.bs, self.job.iodepth, self.job
        futures = self._futures = [None] * depth
        table = SlotTable(depth)
        slot_writes = np.zeros(depth, dtype=bool)
        free = list(range(depth))
        fds = [t.fd for t in self.targets]
        issuing, syncing = True, False
        while True:
            if syncing and len(free) == depth:
                ctx.sync(fds)
                syncing = False
            if issuing and free and not syncing:
                tgt, offs = ctx.next_batch(min(len(free), ctx.until_sync) if job.writes
                                           else len(free))
                issuing = bool(len(offs))
                kinds = ctx.write_flags(len(offs))
                slots = [free.pop() for _ in range(len(offs))]
                if any(kinds):
                    self._fill(slots, tgt, offs)
                now = time.perf_counter_ns()
                for s, t, off, w in zip(slots, tgt.tolist(), offs.tolist(), kinds):
                    f = self._files[t]
                    futures[s] = (f.pwrite if w else f.pread)(self._slots[s], bs, off, task_size=bs)
                    table.issue(s, t, off, now)
                    slot_writes[s] = w
                nwrites = sum(kinds)
                syncing = bool(nwrites) and ctx.sync_due(nwrites)
            busy = [s for s in range(depth) if futures[s] is not None]
            if not busy:
                if syncing:
                    continue
                return
            done = self._wait_some(futures, busy, table.t_issue)
            self._finish(done, futures, table, slot_writes)
            free.extend(done)

    def _wait_some(self, futures: list[Any], busy: list[int], t_issue: np.ndarray) -> list[int]:
        """The busy slots whose reads are done, waiting until there is at least one."""
        oldest = min(busy, key=lambda s: t_issue[s])
        while not futures[oldest].done():
            if time.perf_counter_ns() - t_issue[oldest] > STALL_LIMIT_NS:
                raise Stalled(f"a KvikIO I/O has not finished in {STALL_LIMIT_NS / 1e9:g} s "
                                f"({len(busy)} in flight)")
            time.sleep(POLL_S)
        return [s for s in busy if futures[s].done()]

    def _finish(self, done: list[int], futures: list[Any], table: SlotTable,
                slot_writes: np.ndarray) -> None:
        now = time.perf_counter_ns()
        slots = np.array(done, dtype=np.int64)
        res = np.empty(len(done), dtype=np.int32)
        for i, s in enumerate(done):
            try:
                res[i] = futures[s].get()
            except Exception as e:  # KvikIO raises on a failed read without an errno
                res[i] = -(getattr(e, "errno", None) or errno.EIO)
            futures[s] = None
        bad = None
        if self.ctx.verifying:
            def bad(tgt: np.ndarray, offs: np.ndarray) -> list[int]:
                return gpuverify.landed_mismatches(self._rows[self._cp.asarray(slots)],
                                                   self.ctx.seeds(tgt), offs, res)
        table.complete(self.ctx, slots, res, now, bad,
                       slot_writes[slots] if self.job.mixed else self.job.writes)

    def close(self) -> None:
        """Let reads still in flight (a failed run) land before their buffers go away."""
        deadline = time.perf_counter_ns() + STALL_LIMIT_NS
        for fut in self._futures:
            while fut is not None and not fut.done() and time.perf_counter_ns() < deadline:
                time.sleep(POLL_S)
        for f in self._files:
            f.close()
        self._slots.clear()
        self._rows = self._words = None
        self.dev = None


class CuFileFetch:
    """The ``cufile`` path for aggregation: KvikIO reads each row straight into its row of
    the device tensor (GPUDirect Storage, or compat mode through a host bounce buffer; the
    result's engine_mode says which), ``iodepth`` futures in flight."""

    page_cache = False

    def __init__(self, table: RowTable, xp: Any, dim: int, threads: int, iodepth: int,
                 direct: bool) -> None:
        import kvikio

        self.xp, self.dim, self.layout, self.depth = xp, dim, table.layout, iodepth
        self.rows = 0
        self.facts = {"iodepth": iodepth}  # how the rows were fetched, for the result
        self.mode = cufile_mode()
        configure(threads or iodepth, dim * 4, direct)
        self._files = [kvikio.CuFile(p, "r") for p in table.paths]

    def fetch(self, nodes: Any) -> Any:
        ids = self.xp.asnumpy(nodes)
        out = self.xp.empty((len(ids), self.dim), self.xp.float32)
        tgt, off = self.layout.locate(ids)
        nbytes = self.dim * 4
        pending: list[tuple[int, Any]] = []
        for i, (t, o) in enumerate(zip(tgt.tolist(), off.tolist())):
            if len(pending) == self.depth:
                self._finish(*pending.pop(0), ids)
            pending.append((i, self._files[t].pread(out[i], nbytes, o, task_size=nbytes)))
        for item in pending:
            self._finish(*item, ids)
        self.rows += len(ids)
        return out

    def _finish(self, i: int, future: Any, ids: np.ndarray) -> None:
        t0 = time.perf_counter_ns()
        while not future.done():  # a wedged path must end in a diagnostic, not a hang
            if time.perf_counter_ns() - t0 > STALL_LIMIT_NS:
                raise RowFetchError(f"feature row of node {int(ids[i])}: KvikIO has not "
                                    f"finished it in {STALL_LIMIT_NS / 1e9:g} s")
            time.sleep(POLL_S)
        try:
            got = future.get()
        except Exception as e:  # KvikIO raises on a failed read, without an errno
            raise RowFetchError(f"feature row of node {int(ids[i])} ({e})") from None
        if got != self.dim * 4:
            raise row_error(int(ids[i]), got)

    def close(self) -> None:
        for f in self._files:
            f.close()


class CuFileTensors:
    """Shards in GPU memory saved with KvikIO ``pwrite`` and restored with ``pread``
    straight between the files and the shards, one future per piece, ``iodepth`` in flight
    (GPUDirect Storage, or compat mode through KvikIO's bounce buffers: ``mode`` says
    which)."""

    page_cache = False

    def __init__(self, files: list[Target], extents: list[Extent], request: TensorRequest,
                 threads: int) -> None:
        import kvikio

        self.mode = cufile_mode()
        configure(threads or request.iodepth, request.chunk, request.direct)
        self._fds, self._paths = [f.fd for f in files], [f.path for f in files]
        self._files = [kvikio.CuFile(f.path, "r+") for f in files]
        self._extents, self._depth = extents, request.iodepth
        self._pieces = pieces(extents, request.chunk)
        self.facts: dict[str, Any] = {"chunk": request.chunk, "iodepth": request.iodepth,
                                      "kvikio_threads": threads or request.iodepth}

    def _move(self, tensors: Any, write: bool) -> int:
        pending: list[tuple[list[int], Any]] = []
        first = 0
        try:
            for piece in self._pieces.tolist():
                if len(pending) == self._depth:
                    self._finish(*pending.pop(0), write)
                    first = first or time.perf_counter_ns()
                e, at, off, n = piece
                f, buf = self._files[self._extents[e].file], tensors[e][at:at + n]
                pending.append((piece, f.pwrite(buf, n, off, task_size=n) if write
                                else f.pread(buf, n, off, task_size=n)))
            while pending:
                self._finish(*pending.pop(0), write)
                first = first or time.perf_counter_ns()
        except BaseException:
            deadline = time.perf_counter_ns() + STALL_LIMIT_NS
            for _, future in pending:  # none may land in memory the caller frees...
                while not future.done() and time.perf_counter_ns() < deadline:
                    time.sleep(POLL_S)  # ...unless the path is wedged: then do not hang
                if future.done():
                    with contextlib.suppress(Exception):
                        future.get()
            raise
        return first

    def _finish(self, piece: list[int], future: Any, write: bool) -> None:
        what = "save" if write else "restore"
        t0 = time.perf_counter_ns()
        while not future.done():  # a wedged path must end in a diagnostic, not a hang
            if time.perf_counter_ns() - t0 > STALL_LIMIT_NS:
                ext = self._extents[piece[0]]
                raise TensorIOError(f"{what} of shard {ext.shard}: {self._paths[ext.file]} at "
                                    f"byte {piece[2]}: KvikIO has not finished the piece in "
                                    f"{STALL_LIMIT_NS / 1e9:g} s")
            time.sleep(POLL_S)
        try:
            got = future.get()
        except Exception as e:  # KvikIO raises on a failed I/O, without an errno
            ext = self._extents[piece[0]]
            raise TensorIOError(f"{what} of shard {ext.shard}: {self._paths[ext.file]} at "
                                f"byte {piece[2]}: {e}") from None
        if got != piece[3]:
            raise piece_error(what, self._extents, self._paths, piece, got)

    def save(self, tensors: Any) -> int:
        return self._move(tensors, True)

    def sync(self) -> None:
        sync_files(self._fds)  # the same files: an fsync of any descriptor flushes them

    def restore(self, tensors: Any) -> int:
        return self._move(tensors, False)

    def close(self) -> None:
        for f in self._files:
            f.close()
