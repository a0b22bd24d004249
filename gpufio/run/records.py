"""What a block run hands up: each job's results, live snapshots and the run's outcome, as
plain data for the result documents and the live display."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufio.core.job import Job
from gpufio.core.stats import CpuTimes, LatencyStats


@dataclass
class DirResult:
    """One direction's measured I/Os, bytes and latency (fio's read or write block)."""

    lat: LatencyStats = field(default_factory=LatencyStats)
    ios: int = 0
    bytes: int = 0

    def add(self, other: Any) -> None:
        """Take in another record of the same direction (a worker's, or another result's)."""
        self.lat.merge(other.lat)
        self.ios += other.ios
        self.bytes += other.bytes


@dataclass
class JobResult:
    """Everything measured for one job, as plain data for the report layer."""

    job: Job
    engine_facts: dict[str, Any]
    targets: list[dict[str, Any]]
    read: DirResult
    write: DirResult
    runtime_ns: int
    cpu: CpuTimes
    samples: list[dict[str, float]]
    per_target: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    short_ios: int
    verify_failures: int
    bad_offsets: list[dict[str, Any]]
    interrupted: bool
    failure: str | None
    # each worker's measured I/Os and bytes, as fio's per-thread report without group_reporting
    per_worker: list[dict[str, int]] = field(default_factory=list)
    syncs: int = 0
    sync_ns: int = 0
    # the steady-state watch's verdict (steadystate jobs), the preconditioning passes and
    # the read-back of a verified write job: what the result says beside the numbers
    steadystate: dict[str, Any] | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    # each GPU's workers and their directions (jobrun.per_gpu), when the job uses several
    per_gpu: list[dict[str, Any]] = field(default_factory=list)
    # how ``cpu`` was counted, and the measured window in wall-clock time (Unix ms), for
    # tools that cut their own CPU samples to it (the benchmarks)
    cpu_accounting: str = "rusage"
    window_unix_ms: tuple[float, float] = (0.0, 0.0)

    @property
    def ios(self) -> int:
        """Measured I/Os, both directions."""
        return self.read.ios + self.write.ios

    @property
    def bytes(self) -> int:
        """Measured bytes, both directions."""
        return self.read.bytes + self.write.bytes

    @property
    def lat(self) -> LatencyStats:
        """Latency of both directions together."""
        lat = LatencyStats()
        lat.merge(self.read.lat)
        lat.merge(self.write.lat)
        return lat

    @property
    def ok(self) -> bool:
        """True when the numbers can be trusted: no errors, short reads or bad data."""
        return not (self.errors or self.short_ios or self.verify_failures or self.failure)


# a finished job's Snapshot state: its numbers are its result's (both directions summed
# in a mixed job, whose result has a row for each)
DONE = "done"
DONE_BOTH = "done r+w"


@dataclass
class Snapshot:
    """A job's state for the live display: plain numbers, no rendering. ``state`` is
    setup, ramp, run, ending (the workers finished, their result not yet merged) or DONE /
    DONE_BOTH. The rates are None until a first sample covers a whole interval, the
    latencies until an I/O completed: a job just started has no rate yet, not a zero one."""

    name: str
    engine: str
    state: str
    iops: float | None
    bw_bytes: float | None
    p50_ns: int | None
    p99_ns: int | None
    progress: float | None
    eta_s: float | None


@dataclass
class RunOutcome:
    """The results of the jobs that ran, and whether Ctrl-C cut the run short."""

    results: list[JobResult] = field(default_factory=list)
    interrupted: bool = False
