"""The GNN workload's result document and tables, built from plain run results.

One row per job, as the experiment reports it: time per stage over the timed iterations,
the aggregation share, the speedup (whole iteration and aggregation alone) against the mmap
baseline with the same batch size and targets, the aggregation time against the same engine
on one target (the article's second SSD), the rows per second and bandwidth the aggregation
delivered (a row is one read, except that GPU-cache hits are rows served without one), and
the cache's hit rate.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufio import __version__
from gpufio.core import events
from gpufio.core.errors import BadInput
from gpufio.core.job import Profile
from gpufio.engines.base import label
from gpufio.facts.host import host_facts
from gpufio.results.live import Interval, LiveTable
from gpufio.results.render import render as render_rows
from gpufio.results.render import table
from gpufio.workloads.gnn import timing
from gpufio.workloads.gnn.run import run_job

FORMATS = ("table", "json", "markdown", "csv")


class ProgressLines:
    """A line on stderr every ``every_s`` seconds while a job runs: which iteration, and the
    last iteration's stage times (long runs must not look hung)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._interval = Interval(every_s)

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        g = job.workload_options
        if not self._interval.due(force=done == g["iterations"]):
            return
        phase = " (warm-up)" if done <= g["warmup"] else ""
        times = ", ".join(f"{s} {ns / 1e6:.1f} ms" for s, ns in zip(timing.STAGES, stage_ns))
        events.emit("progress", f"gpufio: {job.name}: iteration {done}/{g['iterations']}"
                                f"{phase}: {times}")


class LiveStages:
    """On a terminal, a live table with a row per job: its iteration, warm-up or timed, and
    the last iteration's stage times, updated after every iteration."""

    COLUMNS = ("job", "engine", "iteration", "phase", *(f"{s} ms" for s in timing.STAGES))

    def __init__(self, stream: TextIO | None = None) -> None:
        self._rows: dict[str, dict[str, str]] = {}
        self._live = LiveTable(stream or sys.stderr, self._table())

    def _table(self) -> Table:
        return table(list(self._rows.values()), "gpufio: GNN jobs",
                     left=("job", "engine", "phase"), columns=self.COLUMNS)

    def __enter__(self) -> "LiveStages":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__()

    def __call__(self, job: Any, done: int, stage_ns: Any) -> None:
        g = job.workload_options
        phase = "warm-up" if done <= g["warmup"] else "timed"
        self._rows[job.name] = dict(zip(self.COLUMNS, [
            job.name, job.engine, f"{done}/{g['iterations']}", phase,
            *(f"{ns / 1e6:.1f}" for ns in stage_ns)]))
        self._live.show(self._table())


def _progress(quiet: bool) -> Any:
    """What shows progress: nothing, the live table on a terminal, else plain lines."""
    if quiet:
        return contextlib.nullcontext(None)
    if sys.stderr.isatty():
        return LiveStages()
    return contextlib.nullcontext(ProgressLines())


def run_profile(prof: Profile, quiet: bool = False) -> dict[str, Any]:
    """Run every job of a GNN profile; Ctrl-C ends the current job after its iteration."""
    interrupted = []

    def on_sigint(*_: Any) -> None:
        interrupted.append(True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    results = []
    try:
        with _progress(quiet) as progress:
            for job in prof.jobs:
                if interrupted:
                    break
                results.append(run_job(job, stop=lambda: bool(interrupted), progress=progress))
    finally:
        signal.signal(signal.SIGINT, previous)
    return document(results, prof.path, bool(interrupted))


def _group(job: dict[str, Any]) -> tuple:
    return job["batch_size"], len(job["targets"]), job["device"], tuple(job["fanout"])


def _same_path(job: dict[str, Any]) -> tuple:
    return job["engine"], "cache" in job, job["batch_size"], job["device"], tuple(job["fanout"])


def document(results: list[dict[str, Any]], path: str, interrupted: bool) -> dict[str, Any]:
    """The result file; each job gets speedup_vs_mmap when its group has an mmap run."""
    baselines: dict[tuple, dict[str, Any]] = {}
    for r in results:  # the first run of the loaders' baseline in each group
        if r.get("baseline") and r["stages"]:
            baselines.setdefault(_group(r), r)
    for r in results:
        base = baselines.get(_group(r))
        if base is not None and r["stages"]:
            r["speedup_vs_mmap"] = timing.speedups(r["stages"], base["stages"])
    singles: dict[tuple, dict[str, Any]] = {}
    for r in results:  # the same engine on one target: the "second SSD" comparison
        if len(r["targets"]) == 1 and r["stages"]:
            singles.setdefault(_same_path(r), r)
    for r in results:
        one = singles.get(_same_path(r))
        if one is not None and len(r["targets"]) > 1 and r["stages"]:
            r["aggregation_vs_one_target"] = (r["stages"]["aggregation_ms"]
                                              / one["stages"]["aggregation_ms"])
    host = host_facts()
    return {"gpufio version": __version__, "profile": path, "workload": "gnn",
            "host": host, "interrupted": interrupted, "jobs": results}


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for j in doc["jobs"]:
        s, a = j["stages"], j["aggregation"]
        out.append({
            "job": j["jobname"], "engine": label(j["engine"], {"mode": j.get("engine_mode")}),
            "batch": j["batch_size"],
            "targets": len(j["targets"]), "iters": f"{s.get('timed_iterations', 0)} timed",
            **{f"{st}_ms": round(s.get(f"{st}_ms", 0.0), 2) for st in timing.STAGES},
            "total_ms": round(s.get("total_ms", 0.0), 2),
            "agg_share": f"{100 * s.get('aggregation_share', 0.0):.0f}%",
            "speedup": f"{j['speedup_vs_mmap']['total']:.2f}x" if "speedup_vs_mmap" in j else "",
            "agg_speedup": (f"{j['speedup_vs_mmap']['aggregation']:.2f}x"
                            if "speedup_vs_mmap" in j else ""),
            "agg_vs_1_target": (f"{j['aggregation_vs_one_target']:.2f}x"
                                if "aggregation_vs_one_target" in j else ""),
            "agg_rows/s": round(a["iops"]), "agg_MB/s": round(a["bw_bytes"] / 1e6, 1),
            "cache_hits": f"{100 * j['cache']['hit_rate']:.1f}%" if j.get("cache") else "",
            "verify": f"{j['verify']['mismatches']} bad / {j['verify']['rows_checked']}",
        })
    return out


def run_workload(prof: Profile, quiet: bool, repeat: int) -> dict[str, Any]:
    """The registry's entry: run the profile once (a GNN job times its own iterations)."""
    if repeat != 1:
        raise BadInput("--repeat: a GNN job runs once and reports its timed iterations; "
                       "raise 'iterations' instead")
    return run_profile(prof, quiet)


def problems(doc: dict[str, Any]) -> list[str]:
    """A line for each job that failed or aggregated rows that differ from the generator's."""
    out = []
    for job in doc["jobs"]:
        if job.get("failure"):
            out.append(f"{job['jobname']}: {job['failure']}")
        elif job["error"]:
            out.append(f"{job['jobname']}: {job['verify']['mismatches']} aggregated rows "
                       "differ from the generator's values")
    return out


def render(doc: dict[str, Any], fmt: str, console: Any = None) -> str:
    """The document in ``fmt``: the whole document as JSON, else the stage table (a 'table'
    prints to ``console`` and returns '')."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    title = (f"gpufio {doc['gpufio version']} · {doc['profile']} · GNN feature aggregation "
             f"(device {doc['jobs'][0]['device'] if doc['jobs'] else '-'})")
    text = render_rows(rows(doc), fmt, title=title, left=("job", "engine", "iters", "verify"),
                       columns=("job",), console=console)
    if fmt == "table":  # what went wrong, under the table it is about
        for line in problems(doc):
            (console or Console()).print(Text(line, style="red"))
    return text
