"""Helper processes (block workers, GNN trainers, the memory watcher) are started here, so a
stop signal can never catch one half-born.

A SIGTERM sent to gpufio's process group (timeout(1), a batch system) reaches every helper
too. A child that gets it before it has installed its own handlers dies of it, and the run
loses that child's result (the parent sees a pipe end: EOFError). So the parent blocks
SIGINT and SIGTERM in its starting thread across the start (``held``): the child
inherits the blocked mask through fork and exec, a signal sent meanwhile stays pending,
and the child unblocks only once its handlers are in (``take_stop_signals``), when the
pending signal reaches those handlers. The child then says so (``READY``) and the parent
waits for that word with a deadline that names the child (``await_ready``). The parent's own
pending signal is delivered as ``held`` ends, to its handlers as they were.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpufio.core.errors import WorkerHung
from gpufio.core.signals import ignore_stop_signals, sigterm_as_sigint
from gpufio.native import libc

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
# environment variables a launcher sets for each rank (MPICH/hydra, Open MPI, PMIx, Slurm)
LAUNCHER_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
# what a child says once its handlers are in
READY = "ready"
# a child that has not said READY by then is stuck or starved: far beyond an interpreter's
# start and imports on a loaded machine
READY_TIMEOUT_S = 300.0


@contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM in this thread for the block: while a child process starts
    (a multiprocessing ``Process.start()``, a ``subprocess.Popen``: the child begins with them
    blocked and takes them with ``take_stop_signals``), or while this process sets an event
    that other processes wait on (a KeyboardInterrupt in the middle of a multiprocessing
    Condition's notify leaves its counts wrong, and the next set fails)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def take_stop_signals(on_stop: Callable[[], None] | None = None) -> None:
    """In a child started under ``held``, before it says READY: ignore SIGINT and SIGTERM
    (the parent stops it), or, with ``on_stop``, run that for either (a trainer that ends
    after its current step), then unblock them; a signal that came during the start is
    handled now."""
    if on_stop is None:
        ignore_stop_signals()
    else:
        signal.signal(signal.SIGINT, lambda *_: on_stop())
        sigterm_as_sigint()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def await_ready(name: str, said_ready: Callable[[float], bool],
                exitcode: Callable[[], int | None],
                timeout: float | None = None) -> None:
    """Wait until the child ``name`` has said READY (``said_ready(seconds)``: whether it has
    within that long). WorkerHung naming it when it ends first or says nothing within
    ``timeout`` (READY_TIMEOUT_S): the caller ends it without waiting any longer."""
    limit = READY_TIMEOUT_S if timeout is None else timeout
    waited = 0.0
    while not said_ready(min(0.2, limit - waited)):
        waited += 0.2
        code = exitcode()
        if code is not None and not said_ready(0):
            raise WorkerHung(f"{name} ended (exit code {code}) before it was ready")
        if waited >= limit:
            raise WorkerHung(f"{name} did not come up within {limit:g} s")


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """End this child the moment its parent dies, however it dies (kill -9, the OOM
    killer, a CI timeout): a child left alone would keep reading, holding its rings, pinned
    memory and GPU context. The kernel sends SIGKILL on the parent's death (prctl) for a
    child the main thread started, and a thread watching the parent's sentinel covers a
    parent that died before the prctl and a child another thread started (``start``)."""
    # the kernel's parent is the thread that started this child: where that was not the
    # main thread (a job's first worker starting the controller its workers share), the
    # signal would come when that thread ends, and the sentinel alone watches the process
    if not getattr(multiprocessing.current_process(), "started_by_thread", False):
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    if not parent.is_alive():
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def die_with_parent_exec() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the program it starts (QEMU) gets SIGKILL
    when the thread that started it dies, however it dies; one whose parent is already gone
    by then ends at once."""
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def start(process: Any) -> None:
    """``process.start()`` (a multiprocessing Process) under ``held``, the child told
    whether a thread other than the main one started it (``die_with_parent``: the Process
    object travels to the child, pickled where it is spawned)."""
    process.started_by_thread = threading.current_thread() is not threading.main_thread()
    with held():
        process.start()


def launched() -> bool:
    """Whether an MPI launcher started this process (one rank of maybe several): the
    CLI asks no question then, and the block workload looks for its world
    (workloads/block/world.detect)."""
    return any(v in os.environ for v in LAUNCHER_VARS)
