"""How gpufio's processes take the signals that stop a run. The main process treats SIGTERM
(timeout(1), Slurm's time limit and scancel, mpirun passing a stop on, kill) as Ctrl-C, so a
run stopped that way also ends at its next step and writes its results so far, as fio
does; and it takes SIGINT even where it started with SIGINT ignored (a script's
``gpufio run ... &``), as fio installs its own handler whatever it inherited. Helper
processes (block workers, the memory watcher) ignore both: the main process stops them,
and a signal sent to the whole process group (timeout, a terminal's Ctrl-C) must not end
them under it; they die with the main process however it ends. Inside a wait in foreign
C code (MPI_Init), where Python's handlers never run, both take their default action."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def take_stop_signals() -> None:
    """The main process: SIGINT stops the run however gpufio was started, and SIGTERM
    stops it as SIGINT does."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a shell starts its background jobs so; Python then leaves Ctrl-C ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sigterm_as_sigint()


def sigterm_as_sigint() -> None:
    """From now on SIGTERM runs whatever handles SIGINT at that moment: Python's default
    (KeyboardInterrupt) or a workload's stop flag. Where SIGINT is ignored, as a shell
    starts its background jobs, SIGTERM still stops the run as Ctrl-C would."""

    def on_term(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIG_DFL, or SIG_IGN inherited from a shell: Python's Ctrl-C
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def ignore_stop_signals() -> None:
    """A helper process: neither Ctrl-C nor SIGTERM ends it; the main process does."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def stop_signals_end_the_process() -> Iterator[None]:
    """SIGINT and SIGTERM at their default action (the process ends) for the duration: for
    a wait inside C code that never returns to Python (MPI_Init, an MPI collective), where
    Python's handlers would only set a flag nobody reads. For a process that holds nothing
    to clean up yet. Outside the main thread, where handlers cannot be set, nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in saved:
        signal.signal(sig, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: a handler not set from Python, left as it was
                signal.signal(sig, handler)
