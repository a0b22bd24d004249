"""How gpufio's processes take the signals that stop a run. The main process treats SIGTERM
(timeout(1), Slurm's time limit and scancel, mpirun passing a stop on, kill) as Ctrl-C, so a
run stopped that way also ends at its next step and writes its results so far, as fio
does; and it takes SIGINT even where it started with SIGINT ignored (a script's
``gpufio run ... &``), as fio installs its own handler whatever it inherited. Helper
processes (block workers, the memory watcher) ignore both: the main process stops them,
and a signal sent to the whole process group (timeout, a terminal's Ctrl-C) must not end
them under it; they die with the main process however it ends."""

from __future__ import annotations

import signal
from typing import Any


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
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
