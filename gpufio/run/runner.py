"""Runs a profile: opens targets, starts workers, times phases, samples, collects results.

The clock starts only when every worker has finished its engine's setup, so ring creation,
buffer registration and kernel compilation never land inside a measurement. Phases follow
fio: ramp_time first (not recorded), then the measured runtime or I/O budget.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gpufio.core import cgroups, events, iolog, pattern, processes, space
from gpufio.core import targets as tg
from gpufio.core.context import DIRECTIONS, READ, WRITE, JobShared, WorkerContext
from gpufio.core.errors import BadInput, WorkerHung
from gpufio.core.guard import WriteConsent
from gpufio.core.job import Job, Profile
from gpufio.core.offsets import OffsetStream, ReplayStream
from gpufio.core.rate import pacer_for, unpaced
from gpufio.core.stats import CpuTimes, LatencyStats
from gpufio.core.steady import SAMPLE_NS, Criterion, SteadyState
from gpufio.engines import all_engines
from gpufio.engines.base import Engine, label
from gpufio.io.gpu import gpu_facts
from gpufio.run import placement
from gpufio.run.launch import Guardian, ProcessWorker, SpawnWorker, ThreadWorker
from gpufio.run.records import DONE, DONE_BOTH, DirResult, JobResult, RunOutcome, Snapshot

TICK_S = 0.02
# a job whose workers complete no I/O for NO_PROGRESS_S is stopped, and a worker still
# running STOP_GRACE_S after its job was stopped is stuck (errors.WorkerHung): far beyond
# any I/O's latency or a worker's teardown, so only a call that never returns meets them
NO_PROGRESS_S = 60.0
STOP_GRACE_S = 30.0


# threads one worker may use to generate the pattern of its writes in host memory
MAX_FILL_THREADS = 4


def fill_threads(job: Job) -> int:
    """The fill threads of each of the job's workers: the cores the workers leave over,
    at most MAX_FILL_THREADS, at least one. A job that writes also has the compiled fill
    built and loaded here, before its workers fork and its clock starts."""
    if not job.writes and job.precondition == "none":
        return 1
    pattern.native_fill()
    return max(1, min(MAX_FILL_THREADS, (os.cpu_count() or 1) // job.numjobs))


def job_target_paths(job: Job) -> tuple[list[str], int | None]:
    """The job's target paths and the size gpufio creates missing ones with (None: never)."""
    if job.targets:
        return tg.resolve(job.targets), None if job.size is None else job.offset + job.size
    if job.size is None:
        raise BadInput(f"job '{job.name}': no targets and no size: give targets, or a size "
                       "for gpufio to create a scratch file of")
    return [tg.scratch_path(job.directory, job.randseed)], job.offset + job.size


def job_targets(job: Job, quiet: bool) -> list[str]:
    """The job's target paths, creating missing files that the job gives a size for."""
    paths, create_size = job_target_paths(job)
    if job.targets:
        if create_size is not None:  # all the files it creates on one filesystem, together
            missing = [p for p in paths if not os.path.lexists(p)]
            for path in missing:
                tg.check_creatable(path)  # where no file may be, that is the error to report
            space.check_layouts([(p, create_size) for p in missing], job.allow_large_layout)
        for path in paths:
            tg.ensure_exists(path, create_size, job.randseed, quiet=quiet,
                             allow_large=job.allow_large_layout)
        return paths
    if job.directory is not None and not os.path.isdir(job.directory):
        raise BadInput(f"job '{job.name}': key 'directory': {job.directory} does not exist "
                       "(as in fio, gpufio does not create it)")
    tg.ensure_scratch(paths[0], create_size or 0, job.randseed, quiet=quiet,
                      allow_large=job.allow_large_layout)
    return paths


class JobRun:
    """One job in flight: its workers, phases and samples."""

    def __init__(self, job: Job, engine: type[Engine], targets: list[tg.Target],
                 regions: list[tuple[int, int]], budgets: list[int] | None = None,
                 gate: Callable[[str], None] | None = None) -> None:
        """``budgets``: each worker's own number of I/Os (a read-back replaying what each
        worker wrote), instead of the job's; ``gate(job name)``: returns when the clock may
        start (every rank of an MPI run has set the job up)."""
        self.job = job
        self._gate = gate
        self.engine = engine
        self.engine_facts = engine.describe(job)
        self.targets = targets
        self.stream_regions = regions
        self.shared = JobShared(job.numjobs)
        self.control = self.shared.control
        budget = None
        trace = iolog.read(job.read_iolog) if job.read_iolog else None
        if trace is not None and not job.time_based:
            budget = len(trace.tgt)  # each worker replays the whole log, as fio's jobs do
        elif not job.time_based:
            io_size = job.io_size or sum(n * job.bs for _, n in regions)
            budget = max(io_size // job.bs, 1)
        self.budget = budget
        worker_budgets = budgets or [budget] * job.numjobs
        # a target without gpufio's pattern (written with overwrite or write_device) gets the
        # pattern of the job's seed
        seeds = ([job.randseed if t.pattern_seed is None else t.pattern_seed for t in targets]
                 if job.verify or job.writes else None)
        self.steady = (SteadyState(Criterion.parse(job.steadystate, "steadystate"),
                                   job.steadystate_duration, job.steadystate_ramp_time)
                       if job.steadystate else None)
        self._steady_last = (0, 0, 0)
        kind = engine.worker_kind_for(job)
        in_process = kind != "thread"
        # the GPUs' facts only where they decide something: each GPU's targets, and the CPUs
        # of its NUMA node for its spawned workers
        placing = engine.uses_gpu and (job.gpu_targets != "all" or kind == "spawn")
        gpus = gpu_facts() if placing else []
        subsets, placed = placement.target_sets(job, targets, gpus) if placing else (None, {})
        self.engine_facts.update(placed)
        cpus = [placement.gpu_cpus(gpus, job.gpu_of(w)) if kind == "spawn" else []
                for w in range(job.numjobs)]
        threads = fill_threads(job)
        handle = {"process": ProcessWorker, "spawn": SpawnWorker, "thread": ThreadWorker}[kind]
        self._go = (multiprocessing.get_context("fork" if kind == "process" else "spawn").Event()
                    if in_process else threading.Event())
        self.workers = [
            handle(engine, job, targets, WorkerContext(
                bs=job.bs, stream=OffsetStream(
                    random=job.random, bs=job.bs, regions=regions, dist=job.random_distribution,
                    file_service=job.file_service, seed=(job.randseed, w),
                    budget=worker_budgets[w], write_fraction=job.write_fraction,
                    subset=subsets.get(job.gpu_of(w)) if subsets else None)
                if trace is None else
                ReplayStream(trace, budget=worker_budgets[w], writes=job.writes),
                control=self.control, ntargets=len(targets), block=self.shared.blocks[w],
                # writes are verified by the read-back, not as they go
                seeds=seeds, verify=job.verify and job.reads,
                continue_on_error=job.continue_on_error,
                own_cpu=in_process, worker=w, sync_every=job.fsync or job.fdatasync,
                datasync=bool(job.fdatasync), fill_threads=threads,
                pacer=pacer_for(job.workload_options, job.randseed, w)),
                w, self._go, self.shared, cpus=cpus[w])
            for w in range(job.numjobs)]
        self._in_process = in_process
        self.state = "setup"
        self.t_start = self.t_measure = 0
        self.cpu0 = self._cpu_end = CpuTimes.now()
        self._group: cgroups.CpuGroup | None = None
        self._guardian: Guardian | None = None
        self._window = (0.0, 0.0)
        self.samples: list[dict[str, float]] = []
        self._last_sample = (0, 0, 0)
        self.interrupted = False
        self._end_syncs = self._end_sync_ns = 0
        self._progress = (0, -1)  # (when, completed I/Os) the count last moved
        self._stalled = False  # stopped because nothing completed for NO_PROGRESS_S
        self._stopping_since: int | None = None
        self._joined = False  # every worker joined: the result can be built
        self._final: Snapshot | None = None  # the finished job's row, from its result

    def start(self) -> None:
        """Start the workers; they set up their engines and wait for the clock. With
        ``cpu_accounting = "cgroup"`` this process moves into a cgroup of the job's own
        first, so every worker, and every kernel thread they create, is counted there."""
        if self.job.cpu_accounting == "cgroup":
            try:
                self._group = cgroups.CpuGroup(f"gpufio-{os.getpid()}-cpu")
                self._group.add(os.getpid())
            except OSError as e:
                if self._group is not None:
                    self._group.close()
                raise BadInput(f"job '{self.job.name}': cpu_accounting = \"cgroup\": cannot "
                               f"make a cgroup here: {e.strerror or e}") from None
        argv = self.engine.guardian(self.job, self.targets)
        self._guardian = Guardian(argv) if argv else None
        for w in self.workers:
            w.start()

    def _cpu_now(self) -> CpuTimes:
        return self._group.times() if self._group is not None else CpuTimes.now()

    def _mark_end(self) -> None:
        """The end of the measured window: the CPU so far, and the wall clock."""
        if not self._window[1]:
            self._cpu_end = self._cpu_now()
            self._window = (self._window[0], time.time() * 1e3)

    def _begin_measure(self, now: int) -> None:
        self.control.begin_measuring()
        self.cpu0 = self._cpu_now()
        self._window = (time.time() * 1e3, 0.0)
        self.t_measure = now
        self._last_sample = self._steady_last = (now, 0, 0)
        self.state = "run"

    def _watch_steady(self, now: int) -> None:
        """Feed the steady-state watch one rate a second; stop the job once it is steady."""
        t0, ios0, bytes0 = self._steady_last
        if now < t0 + SAMPLE_NS:
            return
        _, ios, nbytes = self._live_totals()
        dt = (now - t0) / 1e9
        rate = (ios - ios0) / dt if self.steady.criterion.metric == "iops" else (nbytes - bytes0) / dt
        self._steady_last = (now, ios, nbytes)
        if self.steady.add(rate, now - self.t_measure):
            self.control.stop()

    def tick(self, now: int) -> None:
        """Advance phases; called by the runner's loop every TICK_S."""
        job = self.job
        if self.state == "setup":
            for w in self.workers:
                w.await_up()
                while not w.wait_ready(0.1):
                    pass
            self.shared.close_source()  # every worker has mapped the shared memory by now
            if self._gate is not None:
                self._gate(job.name)
            self.t_start = time.monotonic_ns()
            self.state = "ramp"
            if job.ramp_time == 0:  # before the go: a worker's first completions must count
                self._begin_measure(self.t_start)
            with processes.held():
                self._go.set()
            return
        if self.state == "ramp" and now >= self.t_start + job.ramp_time:
            self._begin_measure(now)
        if self.state == "run":
            if job.runtime is not None and now >= self.t_measure + job.runtime:
                self.control.stop()
                self._mark_end()
            if now >= self._last_sample[0] + job.sample_interval:
                self._sample(now)
            if self.steady is not None and not self.steady.attained:
                self._watch_steady(now)
        self._watch_hang(now)

    def _watch_hang(self, now: int) -> None:
        """Stop a job whose I/Os stopped completing; then name the worker that still runs
        STOP_GRACE_S after its job was stopped (errors.WorkerHung), never wait for it."""
        if self.state == "run" and not self.control.stopping:
            ios = self._live_totals()[0]
            if ios != self._progress[1]:
                self._progress = (now, ios)
            elif now - self._progress[0] > NO_PROGRESS_S * 1e9:
                self._stalled = True
                self.control.stop()
        if not self.control.stopping:
            return
        self._stopping_since = self._stopping_since or now
        if now - self._stopping_since <= STOP_GRACE_S * 1e9:
            return
        stuck = [i for i, w in enumerate(self.workers) if not w.poll()]
        if stuck:
            raise self._hung(stuck[0])

    def _hung(self, worker: int) -> WorkerHung:
        """The error that names a worker which did not stop within STOP_GRACE_S."""
        why = (f"after no I/O completed for {NO_PROGRESS_S:g} s" if self._stalled
               else "of being told to")
        return WorkerHung(f"job '{self.job.name}': worker {worker} "
                          f"({self.workers[worker].where()}) did not stop within "
                          f"{STOP_GRACE_S:g} s {why}; it is stuck in a call that does not "
                          "return, and gpufio ends without it")

    def kill(self) -> None:
        """End the workers that can be ended (processes); a stuck thread ends with us."""
        for w in self.workers:
            if not w.poll():
                w.kill()

    def _live_totals(self) -> tuple[int, int, int]:
        live = [self.shared.live(w) for w in range(len(self.workers))]
        return (sum(x[0] for x in live), sum(x[1] for x in live), sum(x[2] for x in live))

    def _sample(self, now: int) -> None:
        t0, ios0, bytes0 = self._last_sample
        _, ios, nbytes = self._live_totals()
        dt = (now - t0) / 1e9
        self.samples.append({"t_ms": (now - self.t_measure) / 1e6, "iops": (ios - ios0) / dt,
                             "bw_bytes": (nbytes - bytes0) / dt})
        self._last_sample = (now, ios, nbytes)

    @property
    def done(self) -> bool:
        """True once every worker has finished."""
        return self.state != "setup" and all(w.poll() for w in self.workers)

    def stop(self) -> None:
        """Ask the workers to stop (Ctrl-C); results so far are kept."""
        self.interrupted = True
        self.control.stop()
        with processes.held():
            self._go.set()

    def join(self) -> None:
        """Wait for the workers to finish; then end_fsync, whose time counts in the measured
        runtime (as fio's end_fsync). Workers told to stop get STOP_GRACE_S to end (Ctrl-C
        too): a worker stuck in a call is named (WorkerHung), never waited for."""
        deadline = time.monotonic() + STOP_GRACE_S
        for i, w in enumerate(self.workers):
            if not w.join(max(0.0, deadline - time.monotonic()) if self.control.stopping
                          else None):
                raise self._hung(i)
        self._mark_end()
        if self._guardian is not None:
            self._guardian.release()
            self._guardian = None
        if self._group is not None:
            self._group.close()
        self.shared.close_source()
        if (self.job.end_fsync and self.control.measuring and not self._end_syncs
                and not self.engine.flushes_itself):
            t0 = time.monotonic_ns()
            for t in self.targets:
                t.sync()
            self._end_syncs, self._end_sync_ns = len(self.targets), time.monotonic_ns() - t0
        self._joined = True

    def raise_bad_input(self) -> None:
        """Raise BadInput if a worker's engine refused its setup (GPU missing, out of memory)."""
        for w in self.workers:
            if w.outcome is not None and w.outcome.bad_input:
                raise BadInput(f"job '{self.job.name}': {w.outcome.bad_input}")

    def snapshot(self, now: int) -> Snapshot:
        """Where this job stands, for the live display. Once joined, the job's row shows the
        numbers its result reports, so a screen never shows two numbers for one job."""
        if self._final is not None:
            return self._final
        live = self._live_snapshot(now)
        if not self._joined:
            return live if not self.done else replace(live, state="ending")
        r = self.result()
        secs = r.runtime_ns / 1e9
        pct = r.lat.percentiles((50.0, 99.0))
        self._final = replace(
            live, engine=label(self.job.engine, r.engine_facts),
            # a mixed job's result has a row per direction: this one is their sum
            state=DONE_BOTH if r.read.ios and r.write.ios else DONE,
            iops=r.ios / secs if secs else 0.0, bw_bytes=r.bytes / secs if secs else 0.0,
            p50_ns=pct[50.0], p99_ns=pct[99.0], eta_s=None)
        return self._final

    def _live_snapshot(self, now: int) -> Snapshot:
        """The latest sample's rate and the latency so far: where a running job stands."""
        lat = LatencyStats()
        for w in range(len(self.workers)):
            lat.hist += self.shared.live(w)[3]
        lat.n = int(lat.hist.sum())
        pct = lat.percentiles((50.0, 99.0))
        iops = self.samples[-1]["iops"] if self.samples else 0.0
        bw = self.samples[-1]["bw_bytes"] if self.samples else 0.0
        progress = None
        if self.state != "setup":
            fractions = []
            if self.job.runtime is not None:
                total = self.job.ramp_time + self.job.runtime
                fractions.append(max(now - self.t_start, 0) / total)
            if self.budget is not None:
                fractions.append(self._live_totals()[0] / (self.budget * self.job.numjobs))
            progress = min(max(fractions), 1.0) if fractions else None
        elapsed = (now - self.t_start) / 1e9 if self.t_start else 0.0
        eta = elapsed * (1 - progress) / progress if progress else None
        return Snapshot(self.job.name, label(self.job.engine, self.engine_facts), self.state,
                        iops, bw, pct[50.0], pct[99.0], progress, eta)

    def result(self) -> JobResult:
        """Merge the workers' records into one JobResult (call after join)."""
        outcomes = [w.outcome for w in self.workers if w.outcome is not None]
        recs = [o.record for o in outcomes if o.record is not None]
        per_worker = [{"worker": i, "ios": w.outcome.record.ios, "bytes": w.outcome.record.bytes,
                       "completed": w.outcome.record.completed}
                      for i, w in enumerate(self.workers)
                      if w.outcome is not None and w.outcome.record is not None]
        measured = self.control.measuring and bool(outcomes)
        end = max((o.finished_ns for o in outcomes), default=self.t_measure) + self._end_sync_ns
        runtime = max(end - self.t_measure, 0) if measured else 0
        if self._group is not None:
            cpu = self._cpu_end - self.cpu0
        elif self._in_process:
            cpu = CpuTimes(sum(r.cpu.usr for r in recs if r.cpu), sum(r.cpu.sys for r in recs if r.cpu))
        else:
            cpu = CpuTimes.now() - self.cpu0
        dirs = [DirResult() for _ in DIRECTIONS]
        for r in recs:
            for d, rd in zip(dirs, r.dirs):
                d.add(rd)
        per_target, errors, bad = [], [], []
        for i, t in enumerate(self.targets):
            entry = {"path": t.path}
            for d in range(len(DIRECTIONS)):
                prefix = "" if d == READ else "write_"
                entry[f"{prefix}ios"] = int(sum(r.dirs[d].target_ios[i] for r in recs))
                entry[f"{prefix}bytes"] = int(sum(r.dirs[d].target_bytes[i] for r in recs))
            entry["short_ios"] = int(sum(r.short[i] for r in recs))
            entry["verify_failures"] = int(sum(r.verify_failures[i] for r in recs))
            per_target.append(entry)
        merged: dict[tuple[int, int], int] = {}
        for r in recs:
            for key, count in r.errors.items():
                merged[key] = merged.get(key, 0) + count
            bad.extend({"target": self.targets[t].path, "offset": off} for t, off in r.bad_offsets)
        for (t, err), count in sorted(merged.items()):
            errors.append({"target": self.targets[t].path, "errno": err, "count": count})
        facts = [{"path": t.path, "size": t.size, "pattern_seed": t.pattern_seed, **t.facts}
                 for t in self.targets]
        failures = [o.failure for o in outcomes if o.failure]
        lost = len(self.workers) - len(outcomes)
        if lost and not self.interrupted:
            failures.append(f"{lost} worker(s) ended without reporting a result")
        job = self.job
        steady_stop = self.steady is not None and self.steady.attained
        if (job.time_based and measured and not self.interrupted and not failures
                and not merged and runtime < 0.95 * job.runtime and not steady_stop
                and not any(p["short_ios"] for p in per_target)):
            # nothing asked the workers to stop early: a silent early end is an engine bug,
            # and numbers from a cut-short run must not pass as a full one
            failures.append(f"workers ended after {runtime / 1e9:.3f} s of a "
                            f"{job.runtime / 1e9:g} s time-based run without an error")
        noted: dict[str, list[Any]] = {}
        for r in recs:
            for key, values in r.facts.items():
                noted.setdefault(key, []).extend(values)
        gpus = per_gpu(job, [(i, w.outcome.record) for i, w in enumerate(self.workers)
                             if w.outcome is not None and w.outcome.record is not None]) \
            if self.engine.uses_gpu else []
        return JobResult(
            job=self.job, engine_facts={**self.engine_facts, **noted}, targets=facts,
            read=dirs[READ], write=dirs[WRITE], runtime_ns=runtime,
            cpu=cpu, samples=self.samples, per_target=per_target, errors=errors,
            short_ios=sum(p["short_ios"] for p in per_target),
            verify_failures=sum(p["verify_failures"] for p in per_target),
            bad_offsets=bad[:8], interrupted=self.interrupted,
            failure="; ".join(failures) or None, per_worker=per_worker,
            syncs=sum(r.syncs for r in recs) + self._end_syncs,
            sync_ns=sum(r.sync_ns for r in recs) + self._end_sync_ns,
            steadystate=self.steady.report() if self.steady else None, per_gpu=gpus,
            cpu_accounting=self.job.cpu_accounting, window_unix_ms=self._window)


def per_gpu(job: Job, records: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """Each GPU's share of a job whose workers use more than one GPU (``gpus``): its
    workers' I/Os, bytes and latency per direction, for a row per GPU; [] for one GPU."""
    if len({job.gpu_of(w) for w, _ in records}) < 2:
        return []
    out: dict[int, dict[str, Any]] = {}
    for w, rec in records:
        entry = out.setdefault(job.gpu_of(w), {"gpu": job.gpu_of(w), "workers": [],
                                                "dirs": [DirResult() for _ in DIRECTIONS]})
        entry["workers"].append(w)
        for d, rd in zip(entry["dirs"], rec.dirs):
            d.add(rd)
    return [out[g] for g in sorted(out)]


def job_advice(job: Job, facts: dict) -> str | None:
    """One line of advice before a job set up in a way that will cost it or may hang: an
    engine's own warning (facts["warning"]), or spawned GPU workers with no MPS daemon, whose
    contexts the GPU time-slices (docs/PERFORMANCE.md has the cost)."""
    if facts.get("warning"):
        return f"gpufio: job '{job.name}': {facts['warning']}"
    if facts.get("mps") is False and job.numjobs > 1:
        return (f"gpufio: job '{job.name}': {job.numjobs} spawned workers and no CUDA MPS "
                "daemon: the GPU time-slices their contexts (start one with "
                "nvidia-cuda-mps-control -d)")
    return None


def check_trace(job: Job, trace: Any, opened: list[tg.Target]) -> None:
    """BadInput for a replayed log that does not fit its targets: an I/O past a target's
    end, or, with O_DIRECT, one not aligned to 512 bytes."""
    for t, target in enumerate(opened):
        mine = trace.tgt == t
        if not mine.any():
            continue
        ends = trace.offs[mine] + trace.lens[mine]
        if int(ends.max()) > target.size:
            i = int(np.argmax(ends))
            raise BadInput(f"key 'read_iolog': {job.read_iolog}: an I/O at byte "
                           f"{int(trace.offs[mine][i])} of {target.path} runs past its end "
                           f"({target.size} bytes)")
        if job.direct and (trace.offs[mine] % 512).any():
            raise BadInput(f"key 'read_iolog': {job.read_iolog}: offsets of {target.path} that "
                           "are not multiples of 512 cannot be read with O_DIRECT; set direct = "
                           "false")


def _open_job(job: Job, quiet: bool) -> tuple[type[Engine], list[tg.Target], list[tuple[int, int]]]:
    engine = all_engines()[job.engine]
    why = engine.unavailable()
    if why:
        raise BadInput(f"job '{job.name}': engine '{job.engine}' cannot run here: {why}")
    opened: list[tg.Target] = []
    try:
        for path in job_targets(job, quiet):
            opened.append(tg.open_target(path, job.direct, WriteConsent.of(job),
                                         generic=engine.generic_targets(job)))
        # a job that only writes verifies by reading back what it wrote; one that reads
        # checks what was there before, so the target must carry the pattern already
        regions = [tg.check_region(t, offset=job.offset, size=job.size, bs=job.bs,
                                   direct=job.direct, need_pattern=job.verify and job.reads)
                   for t in opened]
        if job.read_iolog:
            check_trace(job, iolog.read(job.read_iolog), opened)
    except BaseException:
        for t in opened:
            t.close()
        raise
    return engine, opened, regions


# descriptors the runner holds per worker (its pipe, its sentinel, a ring and an eventfd
# when the worker is a thread), beside the targets it opens once per job
FDS_PER_WORKER = 4
FDS_SPARE = 64


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return FDS_SPARE


def _process_room() -> int:
    """How many more processes (threads) the kernel will start: threads-max and pid_max,
    less what already runs."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[1])
        limits = [int(Path(p).read_text()) for p in ("/proc/sys/kernel/threads-max",
                                                      "/proc/sys/kernel/pid_max")]
    except (OSError, ValueError, IndexError):
        return sys.maxsize
    return min(limits) - running


def check_machine_limits(profile: Profile) -> None:
    """BadInput, before any target is laid out, for jobs this machine cannot start: more
    open files than RLIMIT_NOFILE allows (the soft limit is raised to the hard one when that
    suffices, as a user's ulimit -n would), more processes than the kernel has room for."""
    batches = [profile.jobs] if profile.concurrent else [[j] for j in profile.jobs]
    if profile.concurrent and any(j.cpu_accounting == "cgroup" for j in profile.jobs):
        raise BadInput("cpu_accounting = \"cgroup\" counts one job at a time: it cannot be "
                       "used with concurrent = true")
    target_fds = sum(max(len(j.targets), 1) for j in profile.jobs)
    worst = max(batches, key=lambda b: sum(j.numjobs for j in b))
    need = _open_fds() + FDS_SPARE + target_fds + FDS_PER_WORKER * sum(j.numjobs for j in worst)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need > soft:
        if hard != resource.RLIM_INFINITY and need > hard:
            job = max(worst, key=lambda j: j.numjobs)
            raise BadInput(f"job '{job.name}': numjobs {job.numjobs} needs about {need} open "
                           f"files; this process may open {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    room = _process_room()
    for batch in batches:
        procs = sum(j.numjobs for j in batch
                    if all_engines()[j.engine].worker_kind_for(j) != "thread")
        if procs > room:
            job = max(batch, key=lambda j: j.numjobs)
            raise BadInput(f"job '{job.name}': numjobs {job.numjobs} needs {procs} worker "
                           f"processes; the kernel has room for {room} more "
                           "(kernel.threads-max, kernel.pid_max)")


def _phase_job(job: Job, name: str, **changes: Any) -> Job:
    """A phase of ``job`` run beside it (preconditioning, read-back): a plain budgeted pass
    with none of the job's own phases, steady-state watch, syncs or rate cap, plus ``changes``."""
    return replace(job, name=f"{job.name} ({name})", time_based=False, runtime=None,
                   workload_options=unpaced(job.workload_options),
                   ramp_time=0, steadystate=None, steadystate_duration=0,
                   steadystate_ramp_time=0, precondition="none", fsync=0, fdatasync=0,
                   **changes)


def precondition_job(job: Job, index: int) -> Job:
    """Pass ``index`` of a job's preconditioning: its engine writes the whole region once,
    sequentially, one worker, synced at the end (fio's usual precondition job)."""
    passes = 2 if job.precondition == "seq2" else 1
    return _phase_job(job, f"precondition {index + 1}/{passes}", rw="write", verify=False,
                      numjobs=1, io_size=None, end_fsync=True, read_iolog=None)


def readback_job(job: Job) -> Job:
    """The read-back of a verified job that wrote (fio's do_verify): the same engine, seeds
    and offset streams reading, with verify, so each worker reads every offset it touched."""
    return _phase_job(job, "verify read-back", rw="randread" if job.random else "read",
                      verify=True, end_fsync=False)


def _phase_summary(phase: str, r: JobResult) -> dict[str, Any]:
    return {"phase": phase, "ios": r.ios, "bytes": r.bytes, "seconds": r.runtime_ns / 1e9,
            "verify_failures": r.verify_failures, "ok": r.ok, "failure": r.failure}


def _preconditions(batch: list[tuple], quiet: bool) -> dict[str, list[dict[str, Any]]]:
    """Run each job's preconditioning passes; their summaries by job name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for job, engine, tgts, regions in batch:
        passes = {"none": 0, "seq": 1, "seq2": 2}[job.precondition]
        for i in range(passes):
            pre = precondition_job(job, i)
            if not quiet:
                events.emit("progress", f"gpufio: job '{job.name}': precondition pass "
                                        f"{i + 1}/{passes}, writing the whole region")
            run = JobRun(pre, engine, tgts, regions)
            _drive([run], [], None, 1.0)
            r = run.result()
            out.setdefault(job.name, []).append(_phase_summary(pre.name, r))
            if not r.ok:
                raise BadInput(f"job '{job.name}': preconditioning failed: "
                               f"{r.failure or 'I/O errors'}")
    return out


def _read_back(run: JobRun, result: JobResult, quiet: bool) -> JobResult:
    """Verify what a write job wrote: read it back, and put the failures in its result."""
    job = run.job
    budgets = [w["completed"] for w in result.per_worker]
    if not budgets or not any(budgets):
        return result
    if not quiet:
        events.emit("progress", f"gpufio: job '{job.name}': reading back what it wrote, "
                                "to verify it")
    back = readback_job(job)
    rb_run = JobRun(back, run.engine, run.targets,
                    [(t0, n) for t0, n in run.stream_regions], budgets=budgets)
    _drive([rb_run], [], None, 1.0)
    rb = rb_run.result()
    result.phases.append(_phase_summary(back.name, rb))
    result.verify_failures += rb.verify_failures
    result.bad_offsets = (result.bad_offsets + rb.bad_offsets)[:8]
    for mine, theirs in zip(result.per_target, rb.per_target):
        mine["verify_failures"] += theirs["verify_failures"]
    if rb.failure or rb.errors or rb.short_ios:
        why = rb.failure or f"{sum(e['count'] for e in rb.errors)} I/O errors, " \
                            f"{rb.short_ios} short reads"
        result.failure = "; ".join(filter(None, [result.failure, f"verify read-back: {why}"]))
    return result


def run_profile(profile: Profile, on_tick: Callable[[list[Snapshot]], None] | None = None,
                quiet: bool = False, tick_every_s: float = 0.25,
                gate: Callable[[str], None] | None = None) -> RunOutcome:
    """Run every job of ``profile`` (sequentially, or all at once if concurrent): each
    job's preconditioning first, then the job, then the read-back of a verified write job;
    ``gate`` holds each job's clock until the other ranks of an MPI run are ready."""
    check_machine_limits(profile)
    prepared = []
    try:
        for job in profile.jobs:
            prepared.append((job, *_open_job(job, quiet)))
        batches = [prepared] if profile.concurrent else [[p] for p in prepared]
        outcome = RunOutcome()
        finished: list[JobRun] = []
        results: list[JobResult] = []
        for batch in batches:
            try:
                pre = _preconditions(batch, quiet)
            except KeyboardInterrupt:
                outcome.interrupted = True
                break
            runs = [JobRun(job, engine, tgts, regions, gate=gate)
                    for job, engine, tgts, regions in batch]
            for r in runs:
                line = job_advice(r.job, r.engine_facts)
                if line and not quiet:
                    events.emit("advice", line)
            try:
                _drive(runs, finished, on_tick, tick_every_s)
            except KeyboardInterrupt:
                _stop_all(runs)
                outcome.interrupted = True
                finished.extend(runs)
                results.extend(r.result() for r in runs)
                break
            except WorkerHung:  # joining would wait for ever
                for r in runs:
                    r.kill()
                raise
            except BaseException:  # another rank failed: no worker outlives the run
                _stop_all(runs)
                raise
            finished.extend(runs)
            for r in runs:
                r.raise_bad_input()
            for r in runs:
                result = r.result()
                result.phases[:0] = pre.get(r.job.name, [])
                if r.job.verify and r.job.writes and not result.interrupted:
                    try:
                        result = _read_back(r, result, quiet)
                    except KeyboardInterrupt:
                        outcome.interrupted = result.interrupted = True
                results.append(result)
            if outcome.interrupted:
                break
        outcome.results = results
        return outcome
    finally:
        for _, _, tgts, _ in prepared:
            for t in tgts:
                t.close()


def _stop_all(runs: list[JobRun]) -> None:
    """Stop every job and wait for its workers; one that will not stop is named
    (WorkerHung) after the workers that can be ended were."""
    for r in runs:
        r.stop()
    try:
        for r in runs:
            r.join()
    except WorkerHung:
        for r in runs:
            r.kill()
        raise


def _drive(runs: list[JobRun], finished: list[JobRun],
           on_tick: Callable[[list[Snapshot]], None] | None, tick_every_s: float) -> None:
    for r in runs:
        r.start()
    next_show = 0.0
    while True:
        now = time.monotonic_ns()
        for r in runs:
            r.tick(now)
        if on_tick and time.monotonic() >= next_show:
            next_show = time.monotonic() + tick_every_s
            on_tick([r.snapshot(now) for r in finished + runs])
        if all(r.done for r in runs):
            break
        time.sleep(TICK_S)
    for r in runs:
        r.join()
    if on_tick:
        on_tick([r.snapshot(time.monotonic_ns()) for r in finished + runs])
