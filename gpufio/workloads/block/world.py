"""The ranks of an MPI run (``mpirun`` / ``mpiexec`` / ``srun`` of ``gpufio run``), through
mpi4py (the optional extra ``mpi``): who this rank is, its share of the targets and its GPU,
the start gate before each job's clock, and the gather of every rank's result on rank 0.

Every exchange is point to point with rank 0 and polled against a deadline, never a blocking
collective: a rank that fails sends its error instead of its next message, rank 0 then tells
every other rank to stop, and a rank that sends nothing (hung, or gone) is named on rank 0
once ``TIMEOUT_S`` pass. Outside a launcher, or without mpi4py, there is no world and gpufio
runs as one process.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.core.job import Job, Profile
from gpufio.core.processes import launched
from gpufio.core.signals import stop_signals_end_the_process
from gpufio.engines import settle

# what a rank waits for another before naming it (a job's setup happens inside the gate's
# wait, so this bounds the slowest rank's setup too)
TIMEOUT_S = float(os.environ.get("GPUFIO_MPI_TIMEOUT_S", "60"))
POLL_S = 0.0005
ABORT_GRACE_S = 0.5
CTRL = 71
_FIELD = re.compile(r"\{(rank|local_rank|host|size|local_size)\}")


class RankAbort(Exception):
    """The run stops: rank 0 said so (``reported``: it tells the user), or this rank found
    rank 0 gone; the text says which rank and why."""

    def __init__(self, why: str, reported: bool = False) -> None:
        super().__init__(why)
        self.reported = reported


@dataclass
class World:
    """This process's place among the ranks, and the messages it exchanges with rank 0."""

    comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    # wall-clock ns at which each job's gate opened here, and ns spent waiting in gates
    starts: dict[str, int] = field(default_factory=dict)
    waited_ns: int = 0
    # what coordinating costs beyond waiting for the slowest rank: rank 0's time from the
    # last rank's "ready" to its last "go" sent, and the time spent receiving messages
    open_ns: int = 0
    recv_ns: int = 0

    @property
    def root(self) -> bool:
        return self.rank == 0

    def place(self, text: str) -> str:
        """``text`` with {rank}, {local_rank}, {host}, {size}, {local_size} filled in."""
        values = {"rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                  "size": self.size, "local_size": self.local_size}
        return _FIELD.sub(lambda m: str(values[m.group(1)]), text)

    def share(self, targets: tuple[str, ...]) -> tuple[str, ...]:
        """This rank's targets: templated ones filled in; else, where the host's ranks can
        each have their own, every local_size-th from local_rank; else all of them."""
        if any(_FIELD.search(t) for t in targets):
            return tuple(self.place(t) for t in targets)
        if targets and len(targets) % self.local_size == 0:
            return targets[self.local_rank::self.local_size]
        return targets

    def job_for(self, job: Job) -> Job:
        """The job as this rank runs it: its targets, its GPU (by local rank) and its own
        offset streams (a seed of its own, so ranks sharing a file do not read in step)."""
        gpus = job.gpu_list
        # another job: what its engine picks from its targets is picked again (settle)
        return settle(replace(job, targets=self.share(job.targets),
                              directory=self.place(job.directory) if job.directory else None,
                              gpu=gpus[self.local_rank % len(gpus)], gpus=(),
                              randseed=job.randseed + self.rank))

    def profile_for(self, prof: Profile) -> Profile:
        return replace(prof, jobs=[self.job_for(j) for j in prof.jobs])

    def _send(self, dest: int, msg: tuple, what: str = "") -> None:
        """Send ``msg``, waiting at most TIMEOUT_S for ``dest`` to take it (a large one, a
        rank's result, waits for the receiver); RankAbort when it does not, but a message
        rank 0 sends to stop the others is left behind after the deadline."""
        req = self.comm.isend(msg, dest=dest, tag=CTRL)
        ending = msg[0] in ("abort", "done")
        wait = min(TIMEOUT_S, 1.0) if ending else TIMEOUT_S * (1 if self.root else 2)
        deadline = time.monotonic() + wait
        while not req.Test():
            if time.monotonic() >= deadline:
                if ending:
                    return
                self.abandon()
                raise RankAbort(f"rank {dest} took nothing for {wait:g} s at {what}")
            time.sleep(POLL_S)

    def _poll(self, source: int, deadline: float) -> tuple | None:
        """The next message from ``source`` (any rank: -1), or None at the deadline."""
        from mpi4py import MPI

        src = MPI.ANY_SOURCE if source < 0 else source
        while time.monotonic() < deadline:
            if self.comm.iprobe(source=src, tag=CTRL):
                t0 = time.monotonic_ns()
                msg = self.comm.recv(source=src, tag=CTRL)
                self.recv_ns += time.monotonic_ns() - t0
                return msg
            time.sleep(POLL_S)
        return None

    def _collect(self, kind: str, what: str) -> dict[int, Any]:
        """Rank 0: every other rank's ``kind`` message; RankAbort (after telling them all
        to stop) when a rank reports an error instead or stays silent past TIMEOUT_S."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < self.size - 1:
            msg = self._poll(-1, deadline)
            if msg is None:
                silent = sorted(set(range(1, self.size)) - set(got))
                self.abort(f"rank {', '.join(map(str, silent))} sent nothing for {TIMEOUT_S:g} s "
                           f"at {what} (hung, or killed)")
            elif msg[0] == "error":
                self.abort(f"rank {msg[1]} ({msg[2]}): {msg[3]}")
            elif msg[0] == kind:
                got[msg[1]] = msg[2]
        return got

    def abort(self, why: str) -> None:
        """Rank 0: tell every other rank to stop, and raise RankAbort."""
        for r in range(1, self.size):
            self._send(r, ("abort", why))
        self.abandon()
        raise RankAbort(why, reported=True)

    def abandon(self) -> None:
        """End the whole MPI job with MPI_Abort when this process exits (after it has
        reported): MPI_Finalize would wait forever for a rank that hangs, and the launcher
        then ends every rank, a stopped one too, with exit code 1."""
        atexit.register(self._abort_job)

    def _abort_job(self) -> None:
        # the launcher forwards a rank's output through a pipe: give it time to pass the
        # report on before the abort ends the processes on both ends
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_S)
        self.comm.Abort(1)

    def _await(self, kind: str, what: str) -> Any:
        """A non-root rank: rank 0's ``kind`` message, or RankAbort."""
        # twice rank 0's own wait: when another rank is silent, rank 0 is the one to name it
        msg = self._poll(0, time.monotonic() + 2 * TIMEOUT_S)
        if msg is None:  # rank 0 itself is gone or hung: nobody else will end the job
            self.abandon()
            raise RankAbort(f"rank 0 sent nothing for {2 * TIMEOUT_S:g} s at {what}")
        if msg[0] == "abort":  # rank 0 ends the job once it has reported
            raise RankAbort(msg[1], reported=True)
        return msg[1]

    def gate(self, name: str) -> None:
        """Hold this rank until every rank has set job ``name`` up, so all start its clock
        together; records when the gate opened here."""
        t0 = time.monotonic_ns()
        if self.root:
            self._collect("ready", f"the start of job '{name}'")
            t_all = time.monotonic_ns()
            for r in range(1, self.size):
                self._send(r, ("go", name), f"the start of job '{name}'")
            self.open_ns += time.monotonic_ns() - t_all
        else:
            self._send(0, ("ready", self.rank, name), f"the start of job '{name}'")
            self._await("go", f"the start of job '{name}'")
        self.starts[name] = time.time_ns()
        self.waited_ns += time.monotonic_ns() - t0

    def fail(self, why: str) -> bool:
        """A non-root rank that cannot go on: its error to rank 0, then wait for rank 0's
        word (so the launcher does not end rank 0 before it has reported). False when rank 0
        did not answer: this rank must report the error itself."""
        try:
            self._send(0, ("error", self.rank, self.host, why), "its failure")
            self._await("done", "the end of the run")
        except RankAbort as e:
            return e.reported
        return True

    def gather(self, payload: Any) -> list[Any] | None:
        """Rank 0: every rank's ``payload`` in rank order (RankAbort naming a rank that
        failed or went silent); other ranks: None, after sending theirs."""
        if not self.root:
            self._send(0, ("result", self.rank, payload), "the end of the run")
            return None
        got = self._collect("result", "the end of the run")
        return [payload] + [got[r] for r in range(1, self.size)]

    def release(self, code: int) -> None:
        """Rank 0: the run's exit code to every other rank."""
        for r in range(1, self.size):
            self._send(r, ("done", code))

    def released(self) -> int:
        """A non-root rank: the exit code rank 0 sends once it has reported (1 when rank 0
        stopped the run); RankAbort when rank 0 went silent, for this rank to report."""
        try:
            return int(self._await("done", "the end of the run"))
        except RankAbort as e:
            if e.reported:
                return 1
            raise

    def facts(self) -> dict[str, Any]:
        """This rank, for the result."""
        return {"rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                "job_starts_ns": dict(self.starts), "gate_wait_ns": self.waited_ns,
                "gate_open_ns": self.open_ns, "recv_ns": self.recv_ns}


def detect() -> World | None:
    """The MPI world when launched as one of several ranks with mpi4py installed, else None.
    BadInput when a launcher started several ranks but mpi4py is missing: each would run
    the whole profile alone."""
    if not launched():
        return None
    size = int(os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
               or os.environ.get("SLURM_NTASKS") or 1)
    try:
        # MPI_Init waits for every rank: a rank whose peers never come must still end, on a
        # stop signal, or (its launcher gone without one) once TIMEOUT_S pass: MPI_Init spins
        # in C, where no Python handler runs, so faulthandler's own thread dumps where it
        # stood and exits
        with stop_signals_end_the_process():
            faulthandler.dump_traceback_later(TIMEOUT_S, exit=True)
            try:
                from mpi4py import MPI
            finally:
                faulthandler.cancel_dump_traceback_later()
    except ImportError:
        if size > 1:
            raise BadInput(f"gpufio runs as {size} ranks under an MPI launcher, but mpi4py is "
                           "not installed: pip install 'gpufio[mpi]'") from None
        return None
    except RuntimeError as e:  # mpi4py is there, the MPI library it looks for is not
        raise BadInput(f"mpi4py cannot load its MPI: {e}") from None
    comm = MPI.COMM_WORLD
    if size > 1 and comm.Get_size() == 1:  # each rank would run the whole profile alone
        raise BadInput(f"the launcher started {size} ranks, but mpi4py's MPI sees one "
                       f"({MPI.Get_library_version().splitlines()[0].strip()}): mpi4py must "
                       "load the launcher's MPI (MPI4PY_LIBMPI names its libmpi)")
    if comm.Get_size() == 1:
        return None
    with stop_signals_end_the_process():  # a collective: the same wait
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    return World(comm, comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size(),
                 MPI.Get_processor_name() or socket.gethostname())

