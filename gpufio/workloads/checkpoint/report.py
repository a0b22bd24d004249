"""The checkpoint workload's result document and table.

One row per path: each job's engine, and the naive path as the baseline row of its group
(the same device, state, layout and targets); each engine row carries its save and restore
speed against that baseline. Every job also carries its gate metrics (``metrics``) and the
document their units (``metric_info``), so compare, check and plot read it like an I/O result.
"""

from __future__ import annotations

from typing import Any

from gpufio import __version__
from gpufio.facts.host import host_facts
from gpufio.results.load import Metric
from gpufio.workloads.documents import not_storage_title, problem_lines, render_document

FORMATS = ("table", "json", "markdown", "csv")


def _value(phase: str, key: str, scale: float = 1.0) -> Any:
    return lambda job: job[phase][key] * scale


METRICS: tuple[Metric, ...] = tuple(m for phase in ("save", "restore") for m in (
    Metric(f"{phase}_gbps", "GB/s", True, _value(phase, "gb_per_s")),
    Metric(f"{phase}_s", "s", False, _value(phase, "seconds")),
    Metric(f"{phase}_ttfb_ms", "ms", False, _value(phase, "ttfb_ms")),
    Metric(f"{phase}_cpu_per_gb", "s/GB", False, _value(phase, "cpu_s_per_gb")),
))
# what plot draws, one panel each
HEADLINE = ("save_gbps", "restore_gbps")


def _group(job: dict[str, Any]) -> tuple:
    return (job["device"], job["layout"], job["state_bytes"], job["shards"],
            tuple(t["path"] for t in job["targets"]))


def document(results: list[dict[str, Any]], path: str, interrupted: bool,
             limits: dict[str, float]) -> dict[str, Any]:
    """The result file: every path's result, its metrics, its speed against the naive path
    of its group where one ran, and the profile's [check] ``limits``."""
    naive = {}
    for r in results:
        if r["baseline"] and r["iterations_done"]:
            naive.setdefault(_group(r), r)
    for r in results:
        if r["iterations_done"]:
            r["metrics"] = {m.name: m.read(r) for m in METRICS}
        base = naive.get(_group(r))
        if base is not None and not r["baseline"] and r["iterations_done"]:
            r["vs_naive"] = {ph: (r[ph]["gb_per_s"] / base[ph]["gb_per_s"]
                                  if base[ph]["gb_per_s"] else 0.0) for ph in ("save", "restore")}
    doc = {"gpufio version": __version__, "profile": path, "workload": "checkpoint",
           "workload_title": "checkpoint", "own_tables": "save/restore table",
           "metric_info": {m.name: {"unit": m.unit, "higher_is_better": m.higher_is_better}
                           for m in METRICS},
           "headline": list(HEADLINE),
           "host": host_facts(), "interrupted": interrupted, "jobs": results}
    if limits:
        doc["check"] = limits
    return doc


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A table row per path."""
    out = []
    for j in doc["jobs"]:
        s, r, v = j["save"], j["restore"], j.get("vs_naive")
        out.append({
            "job": j["jobname"], "path": j["path"], "memory": j["device"],
            "state": f"{_gb(j['state_bytes'])} GB, {j['shards']} shards",
            "files": f"{j['files']} ({j['layout']})",
            "rounds": f"{j['iterations_done']}/{j['iterations']}",
            "save GB/s": round(s["gb_per_s"], 2), "save s": round(s["seconds"], 3),
            "save TTFB ms": round(s["ttfb_ms"], 2), "fsync": f"{100 * s['fsync_share']:.0f}%",
            "save CPU s/GB": round(s["cpu_s_per_gb"], 3),
            "restore GB/s": round(r["gb_per_s"], 2), "restore s": round(r["seconds"], 3),
            "restore TTFB ms": round(r["ttfb_ms"], 2),
            "restore CPU s/GB": round(r["cpu_s_per_gb"], 3),
            "vs naive save/restore": (f"{v['save']:.2f}x / {v['restore']:.2f}x" if v
                                      else "baseline" if j["baseline"] else ""),
            "verify": f"{j['verify']['bad_shards']} bad / {_gb(j['verify']['bytes'])} GB",
        })
    return out


def problems(doc: dict[str, Any]) -> list[str]:
    """A line for each path that failed or restored bytes that differ from the saved ones."""
    return problem_lines(doc, lambda job: f"{job['verify']['bad_shards']} restored shards "
                         f"differ from the saved state; first: {job['verify']['first_bad']}"
                         if job["verify"]["bad_shards"] else None)


def render(doc: dict[str, Any], fmt: str, console: Any = None) -> str:
    """The document in ``fmt``: the whole document as JSON, else the table (a 'table'
    prints to ``console`` and returns '')."""
    title = (f"gpufio {doc['gpufio version']} · {doc['profile']} · checkpoint save and restore"
             + not_storage_title(doc))
    return render_document(doc, fmt, console, title=title, rows=rows(doc),
                           left=("job", "path", "memory", "state", "files"),
                           problems=problems(doc))
