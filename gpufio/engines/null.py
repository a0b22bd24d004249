"""null: completes every I/O at once without touching storage, like fio's null engine.

What it measures is gpufio's own loop (loops/block_host.py over this engine's channel):
handing out offsets, stamping and recording each I/O, the live counters; compiled where it
can be (io/loops.py), as for the other CPU engines.
Beside ``fio --ioengine=null`` it says what share of a CPU engine's cost is gpufio's rather
than the kernel's (docs/PERFORMANCE.md: the null rows of "CPU paths at low and high depth").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.requests import Capability, Channel, ChannelSpec, File
from gpufio.engines import register
from gpufio.engines.base import Engine, loop_facts
from gpufio.io import loops

if TYPE_CHECKING:
    from gpufio.core.context import WorkerContext
    from gpufio.core.job import Job


@register
class Null(Engine):
    """I/Os that complete as they are issued, with all their bytes and no data."""

    name = "null"
    summary = "completes every I/O at once without touching storage: the cost of gpufio's loop"
    peer = "fio null"
    iodepth_means = ("I/Os handed out and completed per batch by the Python loop; the "
                     "compiled loop completes each I/O as it is handed out")
    fio_engines = {"null": ""}
    capability = Capability(moves_data=False)
    touches_storage = False

    @classmethod
    def channel(cls, job: Job, files: Sequence[File], spec: ChannelSpec) -> "NullChannel":
        return NullChannel(spec, len(files))

    @classmethod
    def check_job(cls, job: Job) -> None:
        if job.verify:
            raise BadInput(f"job '{job.name}': engine 'null' moves no data, so verify has "
                           "nothing to check")

    @classmethod
    def describe(cls, job: Job) -> dict[str, Any]:
        return {**super().describe(job), "moves_data": False, **loop_facts(job)}


class NullChannel(Channel):
    """Every request completes as it is submitted, with all its bytes and no data, over
    ``ntargets`` files it never touches."""

    def __init__(self, spec: ChannelSpec, ntargets: int = 1) -> None:
        super().__init__(spec)
        self._ntargets = ntargets
        self._tags = np.zeros(0, np.int64)
        self._res = np.zeros(0, np.int64)

    @property
    def inflight(self) -> int:
        return len(self._tags)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(self.room(), len(off))
        self._tags = np.concatenate((self._tags, np.asarray(tag[:k], np.int64)))
        self._res = np.concatenate((self._res, np.asarray(length[:k], np.int64)))
        return k

    def reap(self, wait_ns: int | None) -> tuple[np.ndarray, np.ndarray]:
        done = self._tags, self._res
        self._tags, self._res = np.zeros(0, np.int64), np.zeros(0, np.int64)
        return done

    def native(self, job: Job, ctx: WorkerContext, batch: int, wait_ns: int) -> Any:
        if not loops.available():
            return None
        return loops.NativeLoop(
            loops.NULL, depth=1, bs=self.spec.largest, bufs=0, stop=ctx.stop_address,
            fds=np.zeros(self._ntargets), seeds=None, magic=0, halt_on_error=False,
            batch=batch, writes=bool(job.writes))
