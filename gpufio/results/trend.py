"""Drive state: a job whose IOPS still trend within a run measured a drive still settling
(its fill state, garbage collection, a cache filling), so a verdict on it is noise.

Each run's per-interval IOPS are fitted with a line; a run warns when the line moves by
more than ``TREND_LIMIT`` of the mean over the run and the slope stands clear of the
samples' scatter (its t statistic), so a flat but noisy run does not warn. The fix is fio's:
precondition the drive, or let steadystate decide when the measured phase may end.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpufio.results.runs import JobRuns

TREND_LIMIT = 0.10  # the line's rise or fall over the run, as a share of its mean IOPS
_T_MIN = 4.0  # how many standard errors the slope must be from flat
_MIN_SAMPLES = 5


def run_trend(iops: Sequence[float]) -> tuple[float, float] | None:
    """The fitted line's IOPS at the run's first and last interval, when the line moves by
    more than TREND_LIMIT of the mean and clear of the scatter; None when flat, noisy or
    too short to tell."""
    y = np.asarray(iops, dtype=np.float64)
    if len(y) < _MIN_SAMPLES or y.mean() <= 0:
        return None
    t = np.arange(len(y), dtype=np.float64)
    slope, icept = np.polyfit(t, y, 1)
    resid = y - (slope * t + icept)
    se = np.sqrt((resid @ resid) / (len(y) - 2) / ((t - t.mean()) @ (t - t.mean())))
    first, last = float(icept), float(icept + slope * (len(y) - 1))
    if abs(last - first) <= TREND_LIMIT * y.mean() or (se > 0 and abs(slope) / se < _T_MIN):
        return None
    return first, last


def warnings(label: str, runs: JobRuns) -> list[str]:
    """One line per run of ``runs`` whose IOPS trend (``label``: baseline or result)."""
    out = []
    for i, iops in enumerate(runs.intervals):
        line = run_trend(iops)
        if line is None:
            continue
        which = f"run {i + 1} of {runs.n}" if runs.n > 1 else "its run"
        out.append(f"drive state: job '{runs.name}' ({label}, {which}): IOPS "
                   f"{'rose' if line[1] > line[0] else 'fell'} from {max(line[0], 0):,.0f} "
                   f"to {max(line[1], 0):,.0f} (fitted) within the run: steady state not "
                   "reached (a drive still settling, or the machine's load changed), so a "
                   "verdict on it is noise; precondition the drive, or set steadystate")
    return out
