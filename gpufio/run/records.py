"""What a block run hands up: each job's results, live snapshots and the run's outcome, as
plain data for the result documents and the live display."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufio.core.job import Job
from gpufio.core.stats import CpuTimes, LatencyStats


@dataclass
class JobResult:
    """Everything measured for one job, as plain data for the report layer."""

    job: Job
    engine_facts: dict[str, Any]
    targets: list[dict[str, Any]]
    lat: LatencyStats
    ios: int
    bytes: int
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

    @property
    def ok(self) -> bool:
        """True when the numbers can be trusted: no errors, short reads or bad data."""
        return not (self.errors or self.short_ios or self.verify_failures or self.failure)


@dataclass
class Snapshot:
    """A job's state for the live display: plain numbers, no rendering."""

    name: str
    engine: str
    state: str
    iops: float
    bw_bytes: float
    p50_ns: int
    p99_ns: int
    progress: float | None
    eta_s: float | None


@dataclass
class RunOutcome:
    """The results of the jobs that ran, and whether Ctrl-C cut the run short."""

    results: list[JobResult] = field(default_factory=list)
    interrupted: bool = False
