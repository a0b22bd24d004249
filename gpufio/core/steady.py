"""fio's steady-state detection: end a job once its IOPS or bandwidth have settled.

As in fio (steadystate, ss_dur, ss_ramp), the job's rate is sampled once a second; once the
window of ``duration`` seconds is full, each new sample asks whether the window is steady:
for ``iops``/``bw``, every sample lies within the limit of the window's mean; for
``iops_slope``/``bw_slope``, the least-squares slope of the window (per second) is within the
limit. A limit written ``N%`` is a percentage of the window's mean, otherwise absolute (IOPS,
or bytes per second).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpufio.core.errors import BadInput

KINDS = ("iops", "iops_slope", "bw", "bw_slope")
SAMPLE_NS = 1_000_000_000


@dataclass(frozen=True)
class Criterion:
    """What settles: the metric (iops or bw), deviation or slope, and the limit."""

    metric: str
    slope: bool
    limit: float
    percent: bool

    @classmethod
    def parse(cls, text: str, what: str) -> "Criterion":
        """``iops_slope:0.3%`` and the like; BadInput naming ``what`` otherwise."""
        kind, _, limit = text.partition(":")
        if kind not in KINDS or not limit:
            raise BadInput(f"{what}: {text!r} is not KIND:LIMIT with KIND one of "
                           f"{', '.join(KINDS)} (e.g. iops_slope:0.3%)")
        percent = limit.endswith("%")
        try:
            value = float(limit.rstrip("%"))
        except ValueError:
            raise BadInput(f"{what}: limit {limit!r} is not a number or a percentage") from None
        if value < 0:
            raise BadInput(f"{what}: limit {limit!r} must not be negative")
        return cls(kind.split("_")[0], kind.endswith("_slope"), value, percent)

    def __str__(self) -> str:
        kind = self.metric + ("_slope" if self.slope else "")
        return f"{kind}:{self.limit:g}{'%' if self.percent else ''}"

    def steady(self, window: np.ndarray) -> tuple[bool, float]:
        """Whether ``window`` (one sample a second) is steady, and the value judged (the
        largest deviation or the slope, in percent of the mean when the limit is)."""
        mean = float(window.mean())
        if self.slope:
            t = np.arange(len(window), dtype=np.float64)
            value = abs(float(np.polyfit(t, window, 1)[0])) if len(window) > 1 else 0.0
        else:
            value = float(np.abs(window - mean).max())
        if self.percent:
            value = 100.0 * value / mean if mean else float("inf")
        return value <= self.limit, value


@dataclass
class SteadyState:
    """A job's steady-state watch: fed the job's cumulative (ios, bytes) once a second."""

    criterion: Criterion
    duration_ns: int
    ramp_ns: int
    series: list[float] = field(default_factory=list)
    window: deque = field(init=False)
    attained: bool = False
    attained_at_ns: int | None = None
    value: float | None = None

    def __post_init__(self) -> None:
        self.window = deque(maxlen=max(self.duration_ns // SAMPLE_NS, 2))

    def add(self, rate: float, t_ns: int) -> bool:
        """Record one second's rate, measured ``t_ns`` into the measured phase; True once
        the job is steady (it should then stop)."""
        if t_ns < self.ramp_ns or self.attained:
            return self.attained
        self.series.append(rate)
        self.window.append(rate)
        if len(self.window) == self.window.maxlen:
            ok, self.value = self.criterion.steady(np.array(self.window, dtype=np.float64))
            if ok:
                self.attained, self.attained_at_ns = True, t_ns
        return self.attained

    def report(self) -> dict:
        """The result's steadystate block (fio's 'steadystate' names where it has them)."""
        return {"criterion": str(self.criterion), "duration_s": self.duration_ns / 1e9,
                "ramp_time_s": self.ramp_ns / 1e9, "attained": self.attained,
                "attained_at_s": None if self.attained_at_ns is None else self.attained_at_ns / 1e9,
                "last_value": self.value, "samples": list(self.series)}
