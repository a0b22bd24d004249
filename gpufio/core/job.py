"""A resolved job and a loaded profile: plain data every band reads.

The profile loader (gpufio/profile.py) builds them; engines, the runner, workloads and the
result documents only read them, so they live here, below all of those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from gpufio.core.offsets import Distribution


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
    iodepth: int
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
    verify: bool
    continue_on_error: bool
    sample_interval: int
    percentile_list: tuple[float, ...]
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    # the workload's own keys (its registry entry's options), resolved
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    options_as_given: Mapping[str, Any] = field(default_factory=dict)

    @property
    def random(self) -> bool:
        """True for random-offset jobs."""
        return self.rw == "randread"

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
