"""One job in flight (JobRun): its workers started and timed through ramp and measured phase,
sampled for the live table, the steady-state and hang watches, and its result collected;
``drive`` runs a set of them to the end.

The clock starts only when every worker has finished its engine's setup, so ring creation,
buffer registration and kernel compilation never land inside a measurement. Phases follow
fio: ramp_time first (not recorded), then the measured runtime or I/O budget.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from gpufio.core import cgroups, iolog, processes
from gpufio.core import targets as tg
from gpufio.core.context import WorkerContext
from gpufio.core.errors import BadInput, WorkerHung
from gpufio.core.job import Job
from gpufio.core.offsets import OffsetStream, ReplayStream
from gpufio.core.rate import pacer_for
from gpufio.core.shared import DIRECTIONS, READ, WRITE, JobShared
from gpufio.core.stats import CpuTimes, LatencyStats
from gpufio.core.steady import SAMPLE_NS, Criterion, SteadyState
from gpufio.engines.base import Engine, label
from gpufio.io.gpu import gpu_facts
from gpufio.run import placement
from gpufio.run.launch import ProcessWorker, SpawnWorker, ThreadWorker
from gpufio.run.opening import fill_threads
from gpufio.run.records import DONE, DONE_BOTH, DirResult, JobResult, Snapshot

TICK_S = 0.02


# a job whose workers complete no I/O for NO_PROGRESS_S is stopped, and a worker still
# running STOP_GRACE_S after its job was stopped is stuck (errors.WorkerHung): far beyond
# any I/O's latency or a worker's teardown, so only a call that never returns meets them
NO_PROGRESS_S = 60.0


STOP_GRACE_S = 30.0


class WorkerRate:
    """One worker's measured rate between the moments it published its counts (its stamps),
    for the interval samples: exact counts over the time they took."""

    def __init__(self, t0: int) -> None:
        self.ios = self.bytes = 0
        self.at = t0  # when the counts above were published (the measured phase's start)
        self.span = 0  # the time the last published window covered
        self.rate = (0.0, 0.0)

    def update(self, ios: int, nbytes: int, at: int, now: int) -> tuple[float, float]:
        """(IOPS, bytes/s) from the worker's counts ``ios``, ``nbytes`` published at ``at``:
        over the window since its previous publish; with nothing new, the last window's rate
        (a worker publishing less often than the samples go on at it), until it has been
        silent for twice its last window (then 0: it stopped, or stalled)."""
        if at > self.at:
            dt = (at - self.at) / 1e9
            self.rate = ((ios - self.ios) / dt, (nbytes - self.bytes) / dt)
            self.span = at - self.at
            self.ios, self.bytes, self.at = ios, nbytes, at
        elif now - self.at > 2 * self.span:
            self.rate = (0.0, 0.0)
        return self.rate


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
        self._window = (0.0, 0.0)
        self.samples: list[dict[str, float]] = []
        self._sampled_at = 0
        self._rates: list[WorkerRate] = []
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
        self._sampled_at, self._steady_last = now, (now, 0, 0)
        self._rates = [WorkerRate(now) for _ in self.workers]
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
            if now >= self._sampled_at + job.sample_interval:
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
        # each worker's rate over the span its published counts cover, not the tick's: a
        # worker publishes once per batch, so counts read at a tick are a batch behind by a
        # varying amount, which made a sample's rate jump by a batch per interval
        rates = [r.update(*self.shared.counted(w), now) for w, r in enumerate(self._rates)]
        self.samples.append({"t_ms": (now - self.t_measure) / 1e6,
                             "iops": sum(r[0] for r in rates),
                             "bw_bytes": sum(r[1] for r in rates)})
        self._sampled_at = now

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
        pct = lat.percentiles((50.0, 99.0)) if lat.n else {50.0: None, 99.0: None}
        iops = self.samples[-1]["iops"] if self.samples else None
        bw = self.samples[-1]["bw_bytes"] if self.samples else None
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
    contexts the GPU time-slices (docs/tutorial/04-gpu-paths.md, "Several workers")."""
    if facts.get("warning"):
        return f"gpufio: job '{job.name}': {facts['warning']}"
    if facts.get("mps") is False and job.numjobs > 1:
        return (f"gpufio: job '{job.name}': {job.numjobs} spawned workers and no CUDA MPS "
                "daemon: the GPU time-slices their contexts (start one with "
                "nvidia-cuda-mps-control -d)")
    return None


def stop_all(runs: list[JobRun]) -> None:
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


def drive(runs: list[JobRun], finished: list[JobRun],
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
