"""How a job's workers run: as threads, forked processes (fio's default), or spawned ones.

Python threads share one interpreter lock, so CPU engines that spend Python time per batch
cannot scale with numjobs as threads; each of their workers is a forked process instead.
CUDA does not survive fork, so engines that hold a CUDA context run as threads, or, to scale
past the lock, as spawned processes: fresh interpreters, each with its own CUDA context, that
reopen the targets and map the job's shared memory again. Every kind of worker builds its
block loop over its engine (gpufio/loops), reports ready, waits for the clock to start,
runs, and hands back a FinalRecord; the runner sees the same interface for all three. Worker processes are started through
core/processes: they take their stop signals first and say so, before any setup.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpufio.core import processes
from gpufio.core.context import WorkerContext
from gpufio.core.errors import BadInput
from gpufio.core.guard import WriteConsent
from gpufio.core.processes import die_with_parent
from gpufio.core.recorder import FinalRecord
from gpufio.engines.base import Engine
from gpufio.loops.block import block_loop

# what a worker process says once its loop is built (after processes.READY)
SET_UP = "set up"

_FORK = multiprocessing.get_context("fork")
_SPAWN = multiprocessing.get_context("spawn")


@dataclass
class WorkerOutcome:
    """A finished worker: its record, when it stopped, and what went wrong if anything."""

    record: FinalRecord | None
    finished_ns: int
    failure: str | None
    bad_input: str | None = None


def _run(engine_cls: type[Engine], job, targets, ctx: WorkerContext, index: int,
         ready: Callable[[], None], wait_go: Callable[[], None]) -> WorkerOutcome:
    loop, failure, bad_input = None, None, None
    try:  # the block loop (gpufio/loops) that fits the engine's primitive and the memory
        loop = block_loop(engine_cls, job, targets, ctx)
    except BadInput as e:  # e.g. a GPU index out of range: the user's to fix, exit 2
        bad_input = str(e)
        ctx.control.stop()
    except Exception as e:  # reported in the result; the run exits 1
        failure = f"worker {index} setup: {type(e).__name__}: {e}"
        ctx.control.stop()
    ready()
    wait_go()
    try:
        if loop is not None:
            loop.run()
    except Exception as e:  # reported in the result; the run exits 1
        failure = f"worker {index}: {type(e).__name__}: {e}"
    finally:
        finished = time.monotonic_ns()
        if loop is not None:
            try:
                loop.close()
            except Exception as e:  # a worker must always report, or its numbers vanish
                failure = failure or f"worker {index} close: {type(e).__name__}: {e}"
        ctx.finish()
    return WorkerOutcome(ctx.rec.final(), finished, failure, bad_input)


class ThreadWorker:
    """A worker in a thread of this process."""

    def __init__(self, engine_cls: type[Engine], job, targets, ctx: WorkerContext,
                 index: int, go: threading.Event, shared=None, cpus: list[int] = ()) -> None:
        self._ready = threading.Event()
        self.outcome: WorkerOutcome | None = None

        def body() -> None:
            self.outcome = _run(engine_cls, job, targets, ctx, index, self._ready.set, go.wait)

        self._thread = threading.Thread(target=body, daemon=True, name=f"{job.name}/{index}")

    def start(self) -> None:
        self._thread.start()

    def await_up(self) -> None:
        """A thread takes no signals of its own: it is up once started."""

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def poll(self) -> bool:
        """True once the worker has finished (its outcome is then set)."""
        return not self._thread.is_alive() and self._thread.ident is not None

    def join(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the worker to end; True once it has."""
        if self._thread.ident is not None:  # Ctrl-C can land before every worker started
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def where(self) -> str:
        """Where the worker's thread is now: its innermost frame in gpufio (the call into a
        library that does not return is made there)."""
        root = Path(__file__).resolve().parent.parent
        frame = sys._current_frames().get(self._thread.ident)
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(root):
                return (f"thread {self._thread.name}, in {path.relative_to(root.parent)}:"
                        f"{frame.f_lineno} ({frame.f_code.co_name})")
            frame = frame.f_back
        return f"thread {self._thread.name}"

    def kill(self) -> None:
        """Nothing can end a thread from outside: the process's exit does (errors.WorkerHung)."""


def _forked_main(engine_cls: type[Engine], job, targets, ctx: WorkerContext, index: int,
                 conn, go) -> None:
    die_with_parent()
    _serve(engine_cls, job, targets, ctx, index, conn, go)


def _serve(engine_cls: type[Engine], job, targets, ctx: WorkerContext, index: int,
           conn, go) -> None:
    processes.take_stop_signals()  # the runner stops us, not a stop sent to the group
    conn.send(processes.READY)
    conn.send(_run(engine_cls, job, targets, ctx, index, lambda: conn.send(SET_UP), go.wait))


def _spawned_main(engine_name: str, job, paths: list[str], spec: dict, shared_source,
                  nworkers: int, conn, go, cpus: list[int]) -> None:
    """A fresh interpreter: pinned to ``cpus`` (its GPU's NUMA node) before anything else
    allocates, its own handle of every target, the shared memory mapped, run like a fork."""
    from gpufio.core import targets as tg
    from gpufio.core.shared import JobShared
    from gpufio.engines import all_engines

    die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)
    shared = JobShared(nworkers, shared_source)
    generic = all_engines()[engine_name].generic_targets(job)
    opened = [tg.open_target(p, job.direct, WriteConsent.of(job), generic) for p in paths]
    try:
        ctx = WorkerContext(**spec, control=shared.control, block=shared.blocks[spec["worker"]],
                            own_cpu=True)
        ctx.note("worker_cpus", [{"worker": spec["worker"],
                                  "cpus": sorted(os.sched_getaffinity(0))}])
        _serve(all_engines()[engine_name], job, opened, ctx, spec["worker"], conn, go)
    finally:
        for t in opened:
            t.close()


class ProcessWorker:
    """A worker in a forked child process; its outcome comes back through a pipe."""

    context = _FORK

    def __init__(self, engine_cls: type[Engine], job, targets, ctx: WorkerContext,
                 index: int, go, shared=None, cpus: list[int] = ()) -> None:
        """``cpus``: where a spawned worker runs (its GPU's NUMA node; empty: anywhere)."""
        self._conn, child_conn = self.context.Pipe(duplex=False)
        self.outcome: WorkerOutcome | None = None
        self._index = index
        self._job = job.name
        self._cpus = list(cpus)
        target, args = self._entry(engine_cls, job, targets, ctx, index, child_conn, go, shared)
        self._proc = self.context.Process(target=target, args=args, daemon=True,
                                          name=f"{job.name}/{index}")
        self._up = self._ready = False

    def _entry(self, engine_cls, job, targets, ctx, index, conn, go, shared) -> tuple:
        return _forked_main, (engine_cls, job, targets, ctx, index, conn, go)

    def start(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        processes.start(self._proc)

    def await_up(self) -> None:
        """Wait until the worker has taken its stop signals (WorkerHung naming it if it
        ends or stays silent first)."""
        def said_up(timeout: float) -> bool:
            if not self._up and self.outcome is None and self._conn.poll(timeout):
                self._receive()
            return self._up or self.outcome is not None

        processes.await_ready(f"job '{self._job}': worker {self._index} ({self.where()})", said_up,
                              lambda: self._proc.exitcode)

    def wait_ready(self, timeout: float) -> bool:
        if not self._ready and self._conn.poll(timeout):
            self._receive()
        return self._ready or self.outcome is not None

    def _receive(self) -> None:
        try:
            msg = self._conn.recv()
        except EOFError:
            self._proc.join()
            self.outcome = WorkerOutcome(None, time.monotonic_ns(),
                                   f"worker {self._index} died (exit code {self._proc.exitcode})")
            return
        if msg == processes.READY:
            self._up = True
        elif msg == SET_UP:
            self._ready = True
        else:
            self.outcome = msg

    def poll(self) -> bool:
        """True once the worker's outcome has arrived (or the process died)."""
        while self.outcome is None and self._conn.poll(0):
            self._receive()
        return self.outcome is not None

    def join(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the worker's outcome and its exit; True once
        both are in."""
        if self._proc.pid is None:  # Ctrl-C can land before every worker started
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.poll():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._conn.poll(0.05)
        self._proc.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._proc.exitcode is not None

    def where(self) -> str:
        return f"process {self._proc.pid}"

    def kill(self) -> None:
        """SIGKILL: the kernel releases its rings, pinned memory and GPU context."""
        if self._proc.pid is not None:
            self._proc.kill()
            self._proc.join()


class SpawnWorker(ProcessWorker):
    """A worker in a spawned process: a fresh interpreter, so it may hold a CUDA context."""

    context = _SPAWN

    def _entry(self, engine_cls, job, targets, ctx, index, conn, go, shared) -> tuple:
        return _spawned_main, (engine_cls.name, job, [t.path for t in targets],
                               ctx.spawn_args(), shared.source, len(shared.blocks), conn, go,
                               self._cpus)
