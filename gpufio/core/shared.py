"""One job's shared memory: its control words (stop, measuring) and every worker's live
counters and latency histogram, in one anonymous mapping the runner and the workers share,
whether the workers are threads, forked or spawned processes."""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Any

import numpy as np

from gpufio.core.stats import PLAT_NR
from gpufio.native import memory

# completed, then measured ios and bytes of each direction (read, write), then when the
# measured counts last moved (monotonic ns), so a sample divides by the time they cover
LIVE_WORDS = 6

BLOCK_WORDS = LIVE_WORDS + 2 * PLAT_NR

READ, WRITE = 0, 1

DIRECTIONS = ("read", "write")

class JobShared:
    """One job's shared memory: control words plus a live block per worker.

    The memory is a memfd mapped MAP_SHARED: forked workers inherit the mapping, threads
    share it, and spawned workers (fresh interpreters) map the same memfd again through
    /proc/<runner pid>/fd/<fd> (``source`` says which), with no name in any filesystem.
    Threads and forked workers also share an eventfd that the stop makes readable, so an
    engine blocked in a wait for completions can be woken by it (a spawned worker has none).
    """

    def __init__(self, nworkers: int, source: tuple[int, int] | None = None) -> None:
        size = 8 * (2 + nworkers * BLOCK_WORDS)
        if source is None:
            fd = os.memfd_create("gpufio-job", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            self.source = (os.getpid(), fd)
        else:
            fd = os.open(f"/proc/{source[0]}/fd/{source[1]}", os.O_RDWR | os.O_CLOEXEC)
            self.source = source
        try:
            self._mem = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            if source is not None:
                os.close(fd)
        self._fd = fd if source is None else -1
        wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK) if source is None else -1
        words = np.frombuffer(self._mem, dtype=np.int64)
        self.control = JobControl(memory.int64_words(2, buffer=self._mem), wake)
        if wake >= 0:  # open as long as anything may stop the job: a worker's wait polls it
            weakref.finalize(self.control, os.close, wake)
        self.blocks = [words[2 + i * BLOCK_WORDS:2 + (i + 1) * BLOCK_WORDS] for i in range(nworkers)]

    def close_source(self) -> None:
        """Close the memfd once every worker has mapped it (the mappings stay valid)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def live(self, worker: int) -> tuple[int, int, int, np.ndarray]:
        """A worker's (completed, ios, bytes, histogram) as last published, both
        directions together."""
        block = self.blocks[worker]
        return (int(block[0]), int(block[1] + block[3]), int(block[2] + block[4]),
                block[LIVE_WORDS:LIVE_WORDS + PLAT_NR] + block[LIVE_WORDS + PLAT_NR:])

    def counted(self, worker: int) -> tuple[int, int, int]:
        """A worker's measured (ios, bytes) as last published, and when it published them
        (monotonic ns; 0: not yet): a worker publishes once per batch it reaps, so the
        count at a moment is the count at its stamp, not at the moment."""
        block = self.blocks[worker]
        return int(block[1] + block[3]), int(block[2] + block[4]), int(block[5])


class JobControl:
    """The runner's side of steering: stop, and whether the measured phase has begun."""

    def __init__(self, words: Any, wake_fd: int = -1) -> None:
        self._w = words  # ctypes words, not numpy: a flag read costs a third as much
        self.wake_fd = wake_fd

    @property
    def stop_address(self) -> int:
        """The address of the control words (stop, then measuring), for a compiled loop
        that reads them per I/O."""
        return memory.words_address(self._w)

    @property
    def stopping(self) -> bool:
        """True once workers must issue nothing more."""
        return bool(self._w[0])

    def stop(self) -> None:
        """Tell every worker to stop issuing, and wake those waiting on ``wake_fd``."""
        self._w[0] = 1
        if self.wake_fd >= 0:
            try:
                os.eventfd_write(self.wake_fd, 1)
            except OSError:  # already readable (the counter is full): woken all the same
                pass

    @property
    def measuring(self) -> bool:
        """True from the end of ramp_time on."""
        return bool(self._w[1])

    def begin_measuring(self) -> None:
        """Start recording (end of ramp)."""
        self._w[1] = 1
