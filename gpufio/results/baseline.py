"""``gpufio baseline``: one baseline file from repeated runs, with every run kept, so
``check`` knows the baseline's noise; and what the spread lets a gate detect."""

from __future__ import annotations

import math
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.results.check import DEFAULT_CONFIDENCE, mode_of, suggest_limits, suggest_paired
from gpufio.results.load import metrics_of
from gpufio.results.repeat import combine
from gpufio.results.runs import side
from gpufio.results.spread import runs_needed, spread


def make(docs: list[dict[str, Any]], paths: list[str]) -> dict[str, Any]:
    """The runs of ``docs`` (each one run or a repeated run of the same profile) as one
    document; BadInput when a file is not a block result or its jobs differ."""
    names = [j["jobname"] for j in docs[0]["jobs"]]
    for doc, path in zip(docs, paths):
        if "metric_info" in doc:
            raise BadInput(f"{path}: a workload's result; gpufio baseline folds block "
                           "results (give a workload's runs to check as several files)")
        mine = [j["jobname"] for j in doc["jobs"]]
        if mine != names:
            raise BadInput(f"{path}: its jobs ({', '.join(mine)}) are not {paths[0]}'s "
                           f"({', '.join(names)}); a baseline holds runs of one profile")
    out = combine(docs)
    out["baseline"] = {"files": list(paths), "runs": {j["jobname"]: j["repeat"]["n"]
                                                      for j in out["jobs"]}}
    return out


def rows(docs: list[dict[str, Any]], confidence: float = DEFAULT_CONFIDENCE,
         result: list[dict[str, Any]] | None = None, paired: bool | None = None,
         ) -> list[dict[str, Any]]:
    """Per job and metric: the runs, their spread and the tightest limit worth setting;
    from the interleaved pairs where ``result``'s runs pair with the baseline's (check
    then judges by them), else from the baseline's own spread."""
    known = metrics_of(docs[0])
    base_side = side(docs)
    cand_side = side(result) if result else {}
    own: dict[str, dict[str, float | None]] | None = None  # every job's, from its own runs
    out = []
    for name, runs in base_side.items():
        mode = mode_of(runs, cand_side[name], paired) if name in cand_side else None
        if mode is not None and mode.pairs:
            limits, source = (suggest_paired(runs, cand_side[name], mode, confidence),
                              f"{len(mode.pairs)} interleaved pairs")
        else:
            own = suggest_limits(docs, confidence) if own is None else own
            limits, source = own.get(name, {}), "baseline's runs"
        for metric, limit in limits.items():
            values = [m[metric] for m in runs.metrics]
            flag = "--max-drop" if known[metric].higher_is_better else "--max-rise"
            out.append({"job": name, "metric": metric, "runs": runs.n,
                        "spread": str(spread(values)), "from": source,
                        f"limit at {100 * confidence:g}%":
                        f"{flag} {metric}={_ceil_pct(limit)}" if limit is not None else
                        f"needs {runs_needed(confidence)} runs"})
    return out


def _ceil_pct(fraction: float) -> str:
    """A limit as the percentage a user writes: rounded up to a half percent, at least 0.5%."""
    halves = max(math.ceil(round(200 * fraction, 6)), 1)
    return f"{halves / 2:g}%"
