"""A resolved job and a loaded profile: plain data every band reads.

The profile loader (gpufio/profile.py) builds them; engines, the runner, workloads and the
result documents only read them, so they live here, below all of those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from gpufio.core.offsets import Distribution

# fio's rw values, by what they do ("rw" is fio's other name for readwrite)
RW_MODES = ("read", "randread", "write", "randwrite", "readwrite", "randrw")
READ_ONLY = ("read", "randread")
WRITE_ONLY = ("write", "randwrite")


@dataclass(frozen=True)
class Job:
    """One fully resolved job: typed common keys plus the engine's own options."""

    name: str
    engine: str
    rw: str
    bs: int
    size: int | None
    offset: int
    io_size: int | None
    direct: bool
    # None: the engine picks (a workload whose engine sizes its own queues, as GNN's rows)
    iodepth: int | None
    numjobs: int
    runtime: int | None
    ramp_time: int
    time_based: bool
    targets: tuple[str, ...]
    directory: str | None
    file_service: str
    random_distribution: Distribution
    randseed: int
    gpu: int
    gpus: tuple[int, ...]
    workload: str
    gpu_targets: Any
    verify: bool
    invalidate: bool
    rwmixread: int
    fsync: int
    fdatasync: int
    end_fsync: bool
    overwrite: bool
    write_device: str | None
    allow_unbacked: bool
    allow_large_layout: bool
    precondition: str
    steadystate: str | None
    steadystate_duration: int
    steadystate_ramp_time: int
    continue_on_error: bool
    read_iolog: str | None
    replay_no_stall: bool
    cpu_accounting: str
    sample_interval: int
    percentile_list: tuple[float, ...]
    # the engine's own keys as the profile resolved them (what a result document shows)
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    # the workload's own keys (its registry entry's options), resolved
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    # the keys as the profile wrote them, for the result document's "job options" only:
    # what the engine or the workload picks is None in their settings, never a look here
    options_as_given: Mapping[str, Any] = field(default_factory=dict)
    # the engine's options typed, what it picks picked (Engine.settings, Engine.resolve):
    # built once per job by the loader (engines.settle)
    engine_settings: Any = None
    # the workload's options typed (its registry entry's ``settings``), built once with it
    workload_settings: Any = None

    @property
    def random(self) -> bool:
        """True for random-offset jobs."""
        return self.rw.startswith("rand")

    @property
    def writes(self) -> bool:
        """True when the job writes (write, randwrite, or a mix)."""
        return self.rw not in READ_ONLY

    @property
    def reads(self) -> bool:
        """True when the job reads (read, randread, or a mix)."""
        return self.rw not in WRITE_ONLY

    @property
    def mixed(self) -> bool:
        """True for jobs that both read and write (fio's readwrite and randrw)."""
        return self.reads and self.writes

    @property
    def write_fraction(self) -> float:
        """The share of I/Os that write: 0 or 1, or 1 - rwmixread/100 for a mix."""
        if not self.writes:
            return 0.0
        return 1.0 - self.rwmixread / 100 if self.mixed else 1.0

    @property
    def gpu_list(self) -> tuple[int, ...]:
        """The GPUs this job's workers use, in round-robin order."""
        return self.gpus or (self.gpu,)

    def gpu_of(self, worker: int) -> int:
        """The GPU of worker ``worker``: ``gpus`` round-robin, else ``gpu``."""
        gpus = self.gpu_list
        return gpus[worker % len(gpus)]


@dataclass(frozen=True)
class Profile:
    """A loaded profile: where it came from, its jobs (sweeps expanded), its gate limits."""

    path: str
    jobs: list[Job]
    concurrent: bool
    limits: dict[str, float] = field(default_factory=dict)
    # what the user should know about how the profile was read (a fio engine's mapping)
    notes: tuple[str, ...] = ()
    # each job's (run group, reporting group), as fio's stonewall and new_group make them:
    # the jobs of a run group run at once, each group after the one before; () runs them
    # all at once where ``concurrent``, else one after another
    groups: tuple[tuple[int, int], ...] = ()

    def group_of(self, index: int) -> tuple[int, int]:
        """Job ``index``'s (run group, reporting group)."""
        if self.groups:
            return self.groups[index]
        return (0, 0) if self.concurrent else (index, index)

    def batches(self, items: list[Any]) -> list[list[Any]]:
        """``items`` (one per job, in job order, possibly fewer) cut into the run groups
        that run one after another, each group's items at once."""
        out: dict[int, list[Any]] = {}
        for i, item in enumerate(items):
            out.setdefault(self.group_of(i)[0], []).append(item)
        return list(out.values())

    @property
    def runs_together(self) -> bool:
        """Whether some jobs run at the same time as others."""
        return len(self.batches(self.jobs)) < len(self.jobs)


def job_direction(job: Mapping[str, Any]) -> str:
    """A result document's job's main direction: write for a write-only job (its rw
    option), else read."""
    rw = str(job.get("resolved options", {}).get("rw", "read"))
    return "write" if rw in WRITE_ONLY else "read"


def directions(job: Mapping[str, Any]) -> list[str]:
    """The directions a result document's job has numbers for ('read', 'write' or both); a
    job with no I/O at all shows its main direction's (empty) block, as fio does."""
    found = [d for d in ("read", "write") if job.get(d, {}).get("total_ios")]
    return found or [job_direction(job)]
