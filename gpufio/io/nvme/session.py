"""A job's controller, shared by its workers (threads): brought up by the first to ask,
each worker taking one queue pair of it, shut down by the last to let go (SPDK's
nvme_ctrlr as one process's users see it). Memory only: whatever a user makes of the
controller's memory (the GPU side's CUDA registration, io/gio/backends/nvme.py) it
``attach``es here, and that is closed first, before the controller goes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.io.nvme import spec
from gpufio.io.nvme.pcie_vfio import QueuePair, Session

MODEL_SLACK = 64 * spec.PAGE  # a software controller's admin queue, Identify pages, alignment


def slot_bytes(nbytes: int) -> int:
    """A landing slot of ``nbytes``: whole pages (one PRP entry per page)."""
    return -(-nbytes // spec.PAGE) * spec.PAGE


def dma_bytes(pairs: int, depth: int, largest: int) -> int:
    """The memory a controller gpufio starts must reach for ``pairs`` queue pairs of
    ``depth`` commands, each command's slot of ``largest`` bytes and its PRP list page,
    besides the admin queue and Identify pages (MODEL_SLACK)."""
    per = 3 * spec.PAGE + (depth + 1) * (spec.SQE_BYTES + spec.CQE_BYTES) + \
        depth * (slot_bytes(largest) + spec.PAGE)
    return max(pairs, 1) * per + MODEL_SLACK


class Held:
    """Something a job's workers share, listed in its class's ``open`` by ``key`` while
    ``users`` hold it; ``attached``: what a user made of its memory, closed first."""

    lock: threading.Lock
    open: dict[str, Any]
    key: str
    users: int
    attached: Any = None

    def attach(self, make: Callable[[], Any]) -> Any:
        """``make()``'s result, made by the first caller (every worker gets the same);
        closed before the controller goes."""
        with self.lock:
            if self.attached is None:
                self.attached = make()
            return self.attached

    def _last(self) -> bool:
        """One user fewer; True for the last, who then closes it (no longer listed)."""
        with self.lock:
            self.users -= 1
            if self.users:
                return False
            del self.open[self.key]
        return True

    def _close(self) -> None:
        """What holds it."""

    def release(self) -> None:
        """One user lets go; the last closes what was attached (it uses the controller's
        memory), then the controller, even where the first close raised."""
        if not self._last():
            return
        attached, self.attached = self.attached, None
        with ExitStack() as then:
            then.callback(self._close)
            if attached is not None:
                attached.close()


class Shared(Held):
    """A job's controller, brought up once for all its channels and workers (threads),
    each taking one of its queue pairs; the last to let go shuts it down and gives it
    back."""

    lock = threading.Lock()
    open: dict[str, Shared] = {}

    def __init__(self, bdf: str, writes: bool, pairs: int, depth: int,
                 opener: Callable[[], Any] | None = None) -> None:
        self.bdf = self.key = bdf
        self.session = opener() if opener else Session(bdf, writes=writes)
        try:
            assert self.session.controller is not None
            self.pairs = self.session.controller.create_pairs(pairs, depth)
        except BaseException:
            self.session.close()
            raise
        self.free = list(self.pairs)
        self.users = 0
        self.emulated = opener is not None

    @classmethod
    def acquire(cls, bdf: str, writes: bool, pairs: int, depth: int,
                opener: Callable[[], Any] | None = None) -> tuple[Shared, QueuePair]:
        """The job's controller (brought up with ``pairs`` queue pairs of ``depth`` entries
        by the first taker; ``opener``: its session where gpufio starts the controller
        itself, else the drive at ``bdf`` is taken) and a queue pair of its own."""
        with cls.lock:
            shared = cls.open.get(bdf)
            if shared is None:
                shared = cls.open[bdf] = cls(bdf, writes, pairs, depth, opener)
            if not shared.free:
                raise BadInput(f"controller {bdf}: its {len(shared.pairs)} I/O queue pairs "
                               "are all in use")
            shared.users += 1
            return shared, shared.free.pop(0)

    def give(self, pair: QueuePair) -> None:
        """``pair`` is free again (nothing of it in flight), then ``release``."""
        with self.lock:
            self.free.append(pair)
        self.release()

    @property
    def info(self) -> dict[str, Any]:
        return self.session.info  # type: ignore[return-value]

    def lba_shifts(self, nsids: np.ndarray) -> np.ndarray:
        """log2 of each namespace's block size, from Identify."""
        spaces = self.info["ns"]
        return np.array([spaces[int(n)]["lba_bytes"].bit_length() - 1 for n in nsids],
                        np.uint64)

    def check_transfer(self, job: str, largest: int) -> None:
        """BadInput (naming ``job``) where ``largest`` bytes are past the controller's
        largest transfer (MDTS)."""
        most = int(self.info["max_transfer"])
        if most and largest > most:
            raise BadInput(f"job '{job}': transfers of {largest} bytes are over controller "
                           f"{self.bdf}'s largest (MDTS: {most} bytes)")

    def _close(self) -> None:
        self.pairs = self.free = []
        self.session.close()


class Model(Held):
    """A job's software controller (io/nvme/model.ServedFile) serving its one target,
    started by the first worker, each worker taking one queue pair; the last to close
    stops it."""

    lock = threading.Lock()
    open: dict[str, Model] = {}

    def __init__(self, path: str, lba_shift: int, dma: int, serve: Any = None) -> None:
        from gpufio.io.nvme import model

        self.key = path
        self.served = model.ServedFile(path, lba_shift, dma, serve)
        self.users = 0

    @classmethod
    def acquire(cls, path: str, lba_shift: int, pairs: int, depth: int, largest: int,
                serve: Any = None) -> tuple[Model, Any]:
        """The controller serving ``path`` (started by the first caller with ``serve``,
        sized for ``pairs`` pairs: dma_bytes) and a queue pair of ``depth`` commands of at
        most ``largest`` bytes of the caller's own."""
        with cls.lock:
            held = cls.open.get(path)
            if held is None:
                held = cls.open[path] = cls(path, lba_shift, dma_bytes(pairs, depth, largest),
                                            serve)
            held.users += 1
            try:
                return held, held.served.host.create_pairs(1, depth + 1)[0]
            except BaseException:
                held.users -= 1
                raise

    def _close(self) -> None:
        self.served.close()
