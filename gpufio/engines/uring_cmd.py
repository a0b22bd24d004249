"""uring-cmd: NVMe read and write commands through io_uring passthrough (fio io_uring_cmd).

The CPU builds the NVMe command itself (opcode, namespace id, starting LBA, block count,
buffer: io/nvme/passthru.py, the layout the GPU builder shares) into 128-byte SQEs
(IORING_OP_URING_CMD, NVME_URING_CMD_IO) on the namespace's generic char device
/dev/ngXnY; the kernel hands it to the drive's queue without the block layer. A target may
be named by its char device, as fio's users do, or by its block device /dev/nvmeXnY, which
stands for the same namespace (core/targets.open_namespace). Completions come back as
32-byte CQEs: 0, an NVMe status (one failed I/O, named by its status), or -errno.
``hipri`` polls for them (IORING_SETUP_IOPOLL) where the namespace has poll queues. A block
job that the compiled loops take (engines/base.compiled_loop) runs them as fio's engine
does, with no Python per I/O: io/loops.c's io_uring loop over the passthrough ring, each
SQE built by the CUDA builder's header compiled as C (kernels/nvme_cmd.cuh).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.checks import Check, verdict
from gpufio.core.errors import BadInput
from gpufio.core.options import Option
from gpufio.core.requests import HOST, Capability, Channel, ChannelSpec, drain
from gpufio.core.targets import aligned_buffer
from gpufio.engines import register
from gpufio.engines.base import Engine, loop_facts
from gpufio.io import loops, uring
from gpufio.io.nvme import passthru

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job
    from gpufio.core.targets import Target
    from gpufio.facts.system import Host

WAIT_NS = 200_000_000
PROBE_NS = 10_000_000_000


@register
class UringCmd(Engine):
    """NVMe commands built by the CPU, through io_uring passthrough on /dev/ngXnY."""

    name = "uring-cmd"
    summary = ("NVMe read/write commands built by the CPU, sent through io_uring passthrough "
               "(IORING_OP_URING_CMD) on the namespace's /dev/ngXnY, no block layer")
    peer = "fio io_uring_cmd (cmd_type=nvme)"
    fio_engines = {"io_uring_cmd": ""}  # cmd_type=nvme, its default (fio/jobfile.CMD_TYPES)
    capability = Capability(memory=(HOST,), namespaces=True)
    options = (
        Option("hipri", "bool", False, "poll for completions (IORING_SETUP_IOPOLL); needs "
               "poll queues on the namespace (nvme.poll_queues > 0)"),
        Option("sqpoll", "bool", False, "a kernel thread polls the SQ (IORING_SETUP_SQPOLL)"),
        Option("fixedbufs", "bool", False, "register the buffers (IORING_URING_CMD_FIXED)"),
        Option("registerfiles", "bool", False, "register the char devices' descriptors"),
        Option("ring_entries", "int", 0, "SQ size (default: iodepth rounded up to a power of 2)",
               minimum=0),
    )

    @classmethod
    def generic_targets(cls, job: Job) -> bool:
        return True

    @classmethod
    def unavailable(cls) -> str | None:
        facts = uring.probe()
        if not facts["available"]:
            return facts["reason"]
        return None if facts.get("big") else facts.get("big_reason", "io_uring has no SQE128")

    @classmethod
    def doctor(cls, host: Host, jobs: list[Job]) -> list[Check]:
        out = passthru.passthrough_checks(host, cls.name)
        if any(cls.settings(j).hipri for j in jobs):
            polled = host.kernel_version() >= passthru.POLLED_KERNEL
            out.append(verdict(cls.name, "polled passthrough", polled, host.kernel_release(),
                               "hipri on passthrough needs Linux >= 6.1", bad="fail"))
        return out

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.iodepth is not None:  # None: the rows' depth is picked when they are fetched
            uring.sq_entries(job.iodepth, cls.settings(job).ring_entries,
                             f"job '{job.name}': ")
        if job.fsync or job.fdatasync:
            raise BadInput(f"job '{job.name}': uring-cmd sends NVMe commands past the page "
                           "cache; fsync/fdatasync sync nothing of it (use end_fsync)")
        o = cls.settings(job)
        if o.hipri and o.sqpoll:
            raise BadInput(f"job '{job.name}': hipri and sqpoll together are not supported "
                           "by uring-cmd; choose one")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        o = cls.settings(job)
        return {**super().describe(job), "page_cache": False, "hipri": o.hipri,
                "sqpoll": o.sqpoll, "fixedbufs": o.fixedbufs, "registerfiles": o.registerfiles,
                **loop_facts(job)}

    @classmethod
    def channel(cls, job: Job, files: Sequence[Target], spec: ChannelSpec) -> "UringCmdChannel":
        """Passthrough on the namespaces' char devices as the job's keys ask, after a first
        read of each (refused in one line where commands cannot be sent)."""
        o = cls.settings(job)
        if o.hipri:
            for t in files:
                if not t.facts.get("poll_queues"):
                    raise BadInput(f"target {t.path}: hipri needs poll queues, and "
                                   f"{t.facts.get('namespace', t.path)} has none (load nvme "
                                   "with poll_queues=N, or set hipri = false)")
        return UringCmdChannel(files, spec, o)


class UringCmdChannel(Channel):
    """Requests as NVMe read and write commands in 128-byte SQEs (io/nvme/passthru) on one ring
    over the namespaces' generic char devices ``files`` (core/targets.Target: their nsid and
    LBA size); each completes with its length, an NVMe status or -errno."""

    def __init__(self, files: Sequence[Target], spec: ChannelSpec, o: Any) -> None:
        super().__init__(spec)
        self.ring = uring.Ring(o.ring_entries or spec.depth, sqpoll=o.sqpoll, big=True,
                               iopoll=o.hipri)
        self._fds = np.array([f.fd for f in files], np.int64)
        self._paths = [f.path for f in files]
        self._flags = 0
        self._fixed: int | None = None
        self._nsid = np.array([f.facts["nsid"] for f in files], np.uint32)
        self._shift = np.array([f.lba.bit_length() - 1 for f in files], np.uint64)
        self._len = np.zeros(spec.depth, np.int64)  # each tag's length: the CQE says 0
        self._native: loops.NativeLoop | None = None
        self.facts = {"iodepth": spec.depth}
        # the probe's landing place, freed with the ring (a probe that never completed may
        # still land in it)
        self._probe_buf = aligned_buffer(int(1 << int(self._shift.max())))
        try:
            if o.registerfiles:
                self.ring.register_files([f.fd for f in files])
                self._fds, self._flags = np.arange(len(files), dtype=np.int64), uring.SQE_FIXED_FILE
            if o.fixedbufs and spec.region is not None:
                self.ring.register_buffers([uring.Region(*spec.region)])
                self._fixed = 0
            self._probe()
        except BaseException:
            self.close()
            raise

    def _probe(self) -> None:
        """Read each target's first block once, before the clock: a kernel, device or user
        that may not send NVMe commands is refused here in one line, not as I/O errors."""
        ring = self.ring
        addr = np.array([np.frombuffer(self._probe_buf, np.uint8).ctypes.data], np.uint64)
        for t, path in enumerate(self._paths):
            ring.push(passthru.build(
                write=False, fd=self._fds[t], nsid=self._nsid[t], lba_shift=self._shift[t],
                off=np.zeros(1, np.uint64), length=int(1 << int(self._shift[t])), addr=addr,
                user_data=np.zeros(1, np.uint64), sqe_flags=self._flags))
            ring.submit()
            deadline = time.monotonic_ns() + PROBE_NS
            res = np.empty(0, np.int32)
            while not len(res) and time.monotonic_ns() < deadline:
                ring.submit(wait=1, timeout_ns=WAIT_NS)
                _, res = ring.reap()
            if not len(res):
                raise BadInput(f"target {path}: a first NVMe read through passthrough did not "
                               f"complete within {PROBE_NS / 1e9:g} s")
            why = passthru.refusal(path, -int(res[0]))
            if why:
                raise BadInput(why)

    @property
    def inflight(self) -> int:
        return self._native.inflight if self._native is not None else self.ring.inflight

    def room(self) -> int:
        return min(self.ring.space(), super().room())

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(self.room(), len(off))
        if k:
            tgt, tag = np.asarray(tgt[:k], np.intp), np.asarray(tag[:k], np.int64)
            w = np.asarray(write, bool)
            if tag.max() >= len(self._len):
                self._len = np.resize(self._len, int(tag.max()) + 1)
            self._len[tag] = length[:k]
            self.ring.push(passthru.build(
                write=w[:k] if w.ndim else bool(w), fd=self._fds[tgt], nsid=self._nsid[tgt],
                lba_shift=self._shift[tgt], off=np.asarray(off[:k], np.uint64),
                length=np.asarray(length[:k], np.int64), addr=np.asarray(addr[:k], np.uint64),
                user_data=tag.astype(np.uint64), sqe_flags=self._flags,
                fixed_buffer=self._fixed))
        return k

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        wait = wait_ns is not None and self.ring.inflight > 0
        self.ring.submit(wait=int(wait), timeout_ns=wait_ns if wait else None)
        ud, res = self.ring.reap()
        tags = ud.astype(np.int64)
        return tags, passthru.result(res, self._len[tags]).astype(np.int64)

    def native(self, job: Job, ctx: WorkerContext, batch: int, wait_ns: int) -> Any:
        # ctx: the worker context, read only (stop word, seeds). No stop poll is armed on
        # this ring: every wait has wait_ns as its limit (a polled one needs none)
        if not loops.available() or self.spec.region is None:
            return None
        self._native = loops.NativeLoop(
            loops.URING, depth=self.spec.depth, bs=self.spec.largest,
            bufs=self.spec.region[0], stop=ctx.stop_address, fds=self._fds,
            seeds=ctx.seeds(np.arange(len(self._fds))) if job.writes else None,
            magic=pattern.MAGIC, halt_on_error=not ctx.continue_on_error, batch=batch,
            writes=bool(job.writes), ring=self.ring, wait_ns=0 if self.ring.iopoll else wait_ns,
            nvme=(self._nsid, self._shift), sqe_flags=self._flags,
            cmd_flags=passthru.URING_CMD_FIXED if self._fixed is not None else 0)
        return self._native

    def state(self) -> str:
        if self._native is not None:  # the ring's own count is the compiled loop's
            return f"ring state {dict(self.ring.state(), inflight=self._native.inflight)}"
        return f"ring state {self.ring.state()}"

    def close(self) -> None:
        if self._native is None:  # the compiled loop waits for its own I/Os
            drain(self)
        self.ring.close()
        self._probe_buf.close()
