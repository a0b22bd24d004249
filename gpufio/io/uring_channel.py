"""io_uring as a Channel (core/requests): the one I/O primitive of every engine whose
requests go through a ring the CPU submits, so two engines share it without naming each
other. The ring's setup (SQPOLL, IOPOLL, registered files and buffers, NOPs) is the
caller's ``RingOptions``; for the block workload the channel also hands its requests to
the compiled loop (io/loops.py), the same ring driven from C."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core import pattern
from gpufio.core.requests import Channel, ChannelSpec, File, drain
from gpufio.io import loops, uring
from gpufio.io.watchdog import ring_report

if TYPE_CHECKING:
    from gpufio.core.job import Job


@dataclass(frozen=True)
class RingOptions:
    """How the channel's ring is set up: ``entries`` SQ entries (0: the spec's depth);
    ``sqpoll`` with its thread's idle time; ``single_issuer`` (SINGLE_ISSUER|DEFER_TASKRUN);
    ``iopoll`` (polled completions); ``registerfiles``; ``fixedbufs`` (the spec's region
    registered, READ_FIXED / WRITE_FIXED); ``nop``: every request an IORING_OP_NOP, which
    counts as the spec's ``largest`` bytes moved; ``batch_submit``: the most I/Os one
    io_uring_enter of the compiled block loop submits (fio's iodepth_batch_submit; 0: every
    free slot's); ``spin_ns``: how long its waits first look for a completion before they
    sleep (IORING_SQ_TASKRUN; not with ``sqpoll`` or ``iopoll``). Requests through ``submit``
    go in with the next enter, all at once: a call per request would cost the Python loop
    more than the waits it saves."""

    entries: int = 0
    sqpoll: bool = False
    sq_thread_idle_ms: int = 1000
    single_issuer: bool = False
    iopoll: bool = False
    registerfiles: bool = False
    fixedbufs: bool = False
    nop: bool = False
    batch_submit: int = 0
    spin_ns: int = 0


class UringChannel(Channel):
    """Requests through one io_uring ring, READ and WRITE with each request's own
    descriptor, address and length; ``sqe_flags`` on every entry (e.g. SQE_ASYNC, so io-wq
    workers run them in parallel). With ``spec.stop_fd`` the ring keeps a poll of it in
    flight, so a stop ends any wait (an IOPOLL ring takes none: its waits return with each
    completion).

    The channel times each request itself (``times``) where fio's ``lat`` does: from when
    ``submit`` takes it (fio's start_time: before its SQE is built and before the
    io_uring_enter that submits it) to just after the call that returned its completion, so
    the time a request waits for that call counts, and reaping it into arrays does not. The
    wait for the submitting call is fio's slat, whose mean over the measured phase the
    notes carry (``slat_mean_ns``)."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec, sqe_flags: int = 0,
                 options: RingOptions = RingOptions()) -> None:
        super().__init__(spec)
        o = self.options = options
        self._report_fds = [f.fd for f in files]
        self._fds = np.array(self._report_fds, dtype=np.int64)
        self.ring = uring.Ring(o.entries or spec.depth, sqpoll=o.sqpoll,
                               sq_thread_idle_ms=o.sq_thread_idle_ms,
                               single_issuer=o.single_issuer, iopoll=o.iopoll)
        self._share = uring.SqThreadShare([self.ring]) if o.sqpoll else None
        self._native: Any = None
        self._unsent: list[np.ndarray] = []  # tags pushed, not yet submitted by an enter
        self._t_start = np.zeros(spec.depth, np.int64)  # by tag: when submit took it
        self._slat = [0, 0]  # the measured phase's slat: ns summed, requests
        self._took: np.ndarray | None = None
        try:
            if o.registerfiles:
                self.ring.register_files(self._report_fds)
                self._fds = np.arange(len(files), dtype=np.int64)
                sqe_flags |= uring.SQE_FIXED_FILE
            self._ops = (uring.OP_READ, uring.OP_WRITE)
            if o.fixedbufs:
                if spec.region is None:
                    raise ValueError("fixed buffers need the spec's region to register")
                self.ring.register_buffers([uring.Region(*spec.region)])
                self._ops = (uring.OP_READ_FIXED, uring.OP_WRITE_FIXED)
            if o.nop:
                self._ops = (uring.OP_NOP, uring.OP_NOP)
            self._sqe_flags = sqe_flags
            self._armed = spec.stop_fd >= 0 and not o.iopoll
            if self._armed:
                self.ring.arm_wake(spec.stop_fd)
        except BaseException:
            self.ring.close()
            raise
        self.facts = {"iodepth": spec.depth}

    @property
    def inflight(self) -> int:
        return self._native.inflight if self._native is not None else self.ring.inflight

    def room(self) -> int:
        return min(self.ring.space(), super().room())

    @property
    def wakeable(self) -> bool:
        return self.ring.iopoll or (self._armed and not self.ring.woken)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        t = time.perf_counter_ns()
        k = min(self.room(), len(off))
        if k:
            w = np.asarray(write, bool)
            read_op, write_op = self._ops
            opcode = (np.where(w[:k], write_op, read_op) if w.ndim
                      else (write_op if w else read_op))
            tags = np.asarray(tag[:k], dtype=np.int64)
            words = uring.sqe_words(
                opcode=opcode, sqe_flags=self._sqe_flags, fd=self._fds[np.asarray(tgt[:k])],
                off=np.asarray(off[:k], dtype=np.uint64),
                addr=np.asarray(addr[:k], dtype=np.uint64),
                length=np.asarray(length[:k], dtype=np.int64), user_data=tags.astype(np.uint64))
            self._room_for(tags)
            self._t_start[tags] = t
            self.ring.push(words)
            if self.ring.sqpoll:  # the kernel's thread takes an SQE once it is published
                self._submitted(tags, time.perf_counter_ns())
            else:
                self._unsent.append(tags)
        return k

    def _room_for(self, tags: np.ndarray) -> None:
        """Make the stamps' array hold every tag of ``tags``."""
        top = int(tags.max()) + 1
        if top > len(self._t_start):
            self._t_start = np.concatenate((self._t_start, np.zeros(top - len(self._t_start),
                                                                    np.int64)))

    def _submitted(self, tags: np.ndarray, t: int) -> None:
        """Requests ``tags`` went to the kernel at ``t``: their slat."""
        self._slat[0] += int((t - self._t_start[tags]).sum())
        self._slat[1] += len(tags)

    def _enter(self, wait: int, timeout_ns: int | None) -> int:
        """One io_uring_enter that submits what is pushed and waits for ``wait``
        completions; its return stamped just after it (returned, for the completions it
        brought)."""
        t = time.perf_counter_ns()
        self.ring.submit(wait=wait, timeout_ns=timeout_ns)
        done = time.perf_counter_ns()
        for tags in self._unsent:
            self._submitted(tags, t)
        self._unsent = []
        return done

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        wait = wait_ns is not None and self.ring.inflight > 0
        # an IOPOLL ring finds completions only by waiting, and each wait returns with one
        done = self._enter(int(wait), wait_ns if wait and not self.ring.iopoll else None)
        ud, res = self.ring.reap()
        tags = ud.astype(np.int64)
        self._took = done - self._t_start[tags]
        res = res.astype(np.int64)
        if self.options.nop:  # a NOP completes with 0: it did all a NOP does
            res[res == 0] = self.spec.largest
        return tags, res

    def times(self) -> np.ndarray | None:
        return self._took

    def state(self) -> str:
        if self._native is not None:  # the ring's own count is the compiled loop's
            return f"ring state {dict(self.ring.state(), inflight=self._native.inflight)}"
        return ring_report(self.ring, self._report_fds)

    def native(self, job: "Job", ctx: Any, batch: int, wait_ns: int) -> Any:
        # ctx: the worker context, read only (stop word, seeds), never written from io/
        if not loops.available() or self.spec.region is None:
            return None
        depth, bs, base = self.spec.depth, self.spec.largest, np.uint64(self.spec.region[0])
        slots = np.arange(depth, dtype=np.uint64)
        # One ready-made SQE per buffer slot, written into the ring once: a batch only sets
        # the offset (and the first word, opcode and descriptor, for several targets or a mix).
        self.ring.sqes[:depth] = uring.sqe_words(
            opcode=self._ops[not job.reads], sqe_flags=self._sqe_flags,
            fd=np.full(depth, self._fds[0]), off=np.zeros(depth, np.uint64),
            addr=base + slots * np.uint64(bs), length=bs, user_data=slots)
        # an IOPOLL ring's wait polls the device and returns with each completion: it needs
        # no time limit, and a look before it would find nothing (completions turn up only
        # in the wait); an SQPOLL ring has a kernel thread spinning for it already, and no
        # TASKRUN flag to look at; and a thread allowed one CPU only would spin on the CPU
        # its io-wq worker, which inherits that mask, needs to complete the read: there the
        # look only delays the completion it waits for
        polled = self.ring.iopoll
        looks = not (polled or self.ring.sqpoll) and len(os.sched_getaffinity(0)) > 1
        self._native = loops.NativeLoop(
            loops.URING, depth=depth, bs=bs, bufs=int(base), stop=ctx.stop_address,
            fds=self._fds, seeds=ctx.seeds(np.arange(len(self._fds))) if job.writes else None,
            magic=pattern.MAGIC, halt_on_error=not ctx.continue_on_error, batch=batch,
            writes=bool(job.writes), nop=self.options.nop, ring=self.ring,
            word0=tuple(op | self._sqe_flags << 8 for op in self._ops),
            stop_ud=uring.WAKE_UD if self._armed else 0,
            wait_ns=0 if polled else wait_ns, batch_submit=self.options.batch_submit,
            spin_ns=self.options.spin_ns if looks else 0)
        return self._native

    def measured(self) -> None:
        self._slat = [0, 0]  # the ramp's requests are not the window's
        if self._share is not None and not self._share.begun:
            self._share.begin()

    def notes(self) -> dict[str, list[Any]]:
        facts = self._share.facts() if self._share is not None else {}
        # how long the waits looked first, as the channel decided (the Python loop never looks)
        facts["wait_spin_ns"] = [self._native.spin_ns if self._native is not None else 0]
        slat = (self._native.slat_mean_ns if self._native is not None
                else self._slat[0] / self._slat[1] if self._slat[1] else None)
        if slat is not None:  # fio's clat is the latency less this
            facts["slat_mean_ns"] = [round(slat)]
        return facts

    def close(self) -> None:
        # the compiled loop waits for its own I/Os; a polled ring's wait has no limit
        if self._native is None and not self.ring.iopoll:
            drain(self)
        self.ring.close()
