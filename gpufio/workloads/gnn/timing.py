"""Stage timing of the GNN workload: per-iteration times in, the experiment's figures out.

Each iteration is timed per stage (sampling, aggregation, training); only iterations after
the warm-up count. Reported: mean time per stage and per iteration, the aggregation share of
the total, what MLPerf Storage calls accelerator utilisation (the training share: the time
the GPU computes, over the iteration; here with the features landing in GPU memory, which
MLPerf's host-memory loaders do not do), and the speedup of every stage against a baseline
run (the mmap loader).
"""

from __future__ import annotations

from typing import Any

import numpy as np

STAGES = ("sampling", "aggregation", "training")


def summarize(stage_ns: np.ndarray, warmup: int) -> dict[str, Any]:
    """``stage_ns``: (iterations, 3) nanoseconds. Means over the timed iterations, in ms."""
    timed = np.asarray(stage_ns, dtype=np.float64)[warmup:]
    if not len(timed):
        raise ValueError("no timed iterations")
    per_stage = timed.mean(axis=0) / 1e6
    total = float(per_stage.sum())
    out: dict[str, Any] = {f"{s}_ms": float(v) for s, v in zip(STAGES, per_stage)}
    out["total_ms"] = total
    out["aggregation_share"] = float(per_stage[1] / total) if total else 0.0
    out["accelerator_utilisation"] = float(per_stage[2] / total) if total else 0.0
    out["timed_iterations"] = len(timed)
    return out


def speedups(summary: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """Baseline time / this run's time, per stage and for the whole iteration."""
    return {key: baseline[f"{key}_ms"] / summary[f"{key}_ms"] if summary[f"{key}_ms"] else 0.0
            for key in (*STAGES, "total")}
