"""The GNN workload's result document and tables, built from plain run results.

One row per job, as the experiment reports it: time per stage over the timed iterations,
the aggregation share, the speedup (whole iteration and aggregation alone) against the mmap
baseline with the same batch size and targets, the aggregation time against the same engine
on one target (the article's second SSD), the rows per second and bandwidth the aggregation
delivered (a row is one read, except that GPU-cache hits are rows served without one), and
the cache's hit rate. Where jobs ran on modelled drives (an engine's ``fetch.drive``), a
second table is the article's: seconds per stage over the timed iterations, the aggregation
share, the speedup over mmap, and the IOPS each drive served during aggregation beside the
IOPS its model is rated at and what bound the aggregation (``_bound``); the title says
every model's "emulated: <model>, rates from <source>".
"""

from __future__ import annotations

from typing import Any

from gpufio import __version__
from gpufio.engines.base import label
from gpufio.facts.host import host_facts
from gpufio.io.gpu import gpu_facts
from gpufio.results.load import emulated_labels, stage_seconds
from gpufio.workloads.documents import problem_lines, render_document
from gpufio.workloads.gnn import memlimit, timing

FORMATS = ("table", "json", "markdown", "csv")


def _group(job: dict[str, Any]) -> tuple:
    return job["batch_size"], len(job["targets"]), job["device"], tuple(job["fanout"])


def _same_path(job: dict[str, Any]) -> tuple:
    return job["engine"], "cache" in job, job["batch_size"], job["device"], tuple(job["fanout"])


def document(results: list[dict[str, Any]], path: str, interrupted: bool,
             host: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result file; each job gets speedup_vs_mmap when its group has an mmap run.
    ``host``: the machine's facts (None: this one's, with its GPUs' names where a job ran
    on one: an H100's seconds are not an H200's)."""
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
    if host is None:
        host = host_facts()
        if any(r.get("device") == "gpu" for r in results):
            host["gpus"] = [g["name"] for g in gpu_facts()]
    return {"gpufio version": __version__, "profile": path, "workload": "gnn",
            "workload_title": "GNN", "own_tables": "stage table",
            "stages": list(timing.STAGES),
            "host": host, "interrupted": interrupted, "jobs": results}


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Documents of one profile's sections run apart (one machine's) as one: their jobs in
    order, each compared again with the mmap baseline and the one-target run of its group
    wherever those ran; the first document's host."""
    jobs = [dict(j) for d in docs for j in d["jobs"]]
    for j in jobs:  # computed again from the jobs that are here now
        j.pop("speedup_vs_mmap", None)
        j.pop("aggregation_vs_one_target", None)
    out = document(jobs, docs[0]["profile"], any(d["interrupted"] for d in docs),
                   docs[0]["host"])
    out["gpufio version"] = docs[0]["gpufio version"]
    return out


def _drive(job: dict[str, Any]) -> dict[str, Any] | None:
    """The drive model a job's rows were read through (its fetch facts), or None."""
    return job.get("fetch", {}).get("drive")


def article_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The article's table: a row per job, seconds per stage over its timed iterations,
    the aggregation share, the speedups over the mmap baseline of its group, and the IOPS
    each drive served while aggregating beside its model's rating."""
    out = []
    for j in doc["jobs"]:
        s, d = j["stages"], _drive(j)
        per = j["aggregation"].get("per_target", [])
        sp = j.get("speedup_vs_mmap")
        busiest = max((p["iops"] for p in per), default=0.0)
        shares = _shares(j, d, busiest) if d else {}
        out.append({
            "job": j["jobname"], "batch": j["batch_size"],
            "drives": f"{len(j['targets'])} x {d['model']}" if d else str(len(j["targets"])),
            **{f"{st}_s": round(v, 3) for st, v in stage_seconds(j, timing.STAGES).items()},
            "agg_share": f"{100 * s.get('aggregation_share', 0.0):.0f}%",
            "vs_mmap": f"{sp['total']:.2f}x" if sp else "",
            "agg_vs_mmap": f"{sp['aggregation']:.2f}x" if sp else "",
            "IOPS/drive": " / ".join(f"{p['iops']:,.0f}" for p in per),
            "rated_IOPS": (f"{d['iops']:,.0f}" if d and d.get("iops") else
                           "unpublished" if d else ""),
            # how near each drive came to what its model allows: the busiest drive's share
            # of its rated IOPS and of its link (where aggregation did not move with the
            # drives or the link, neither bound it)
            **{col: "" if shares.get(rate) is None else f"{100 * shares[rate]:.0f}%"
               for col, rate in (("of_rated", "rated IOPS"), ("of_link", "link"))},
            "bound": _bound(j, shares) if d else "",
        })
    return out


# a drive past this share of one of its model's rates is what bound it (pollers busy past it too)
BOUND_SHARE = 0.9


def _shares(job: dict[str, Any], d: dict[str, Any], busiest: float) -> dict[str, float | None]:
    """The busiest drive's share of each of its model's rates (IOPS, read bandwidth, link)
    while aggregating; None where the model publishes none."""
    bps = busiest * job["feature_dim"] * 4
    return {"rated IOPS": busiest / d["iops"] if d.get("iops") else None,
            "read bandwidth": bps / d["read_bw"] if d.get("read_bw") else None,
            "link": bps / d["link_bw"] if d.get("link_bw") else None}


def _bound(job: dict[str, Any], shares: dict[str, float | None]) -> str:
    """What held the aggregation back, from the busiest drive's ``shares`` of its model's
    rates: that rate where it came within BOUND_SHARE of it; else not the drives
    (``_not_the_drives``)."""
    rate, share = max(((r, v or 0.0) for r, v in shares.items()), key=lambda kv: kv[1])
    if share >= BOUND_SHARE:
        return f"the drives' {rate} ({100 * share:.0f}%)"
    return _not_the_drives(job.get("fetch", {}), _pollers_busy(job), f"{100 * share:.0f}%",
                           rate)


def _not_the_drives(fetch: dict[str, Any], busy: float | None, share: str, rate: str) -> str:
    """Aggregation the drives did not bind (``share`` of their ``rate``): where the compiled
    controller measured itself (``busy``), its poller threads where they were busy for
    BOUND_SHARE of the time, else the GPU side (by elimination); without that measure (the Python
    model, older results), how the GPU side fetched (queue pairs)."""
    if busy is not None and busy >= BOUND_SHARE:
        return f"the controller's {fetch['controller_threads']} poller threads " \
               f"({100 * busy:.0f}% busy)"
    if busy is not None:
        # by elimination: the agents, or too few reads in flight for the drives' latency
        return f"neither the drives nor the pollers ({100 * busy:.0f}% busy): the GPU side, " \
               f"at {share} of the drives' {rate}"
    pairs = fetch.get("queue_pairs")
    how = f": GPU side or controller ({pairs} queue pairs)" if pairs else ""
    return f"not the drives{how}, at {share} of their {rate}"


def _pollers_busy(job: dict[str, Any]) -> float | None:
    """The share of the aggregation (every iteration's, warmup's too: the span of its
    counter) the compiled controller's poller threads spent on work; None without it."""
    fetch = job.get("fetch", {})
    span_ns = job.get("aggregation_all_ms", 0.0) * 1e6 * fetch.get("controller_threads", 0)
    return fetch["controller_busy_ns"] / span_ns \
        if "controller_busy_ns" in fetch and span_ns else None


def _stage_cells(s: dict[str, Any]) -> dict[str, Any]:
    """The timing columns of a job's row and of each of its trainers' rows."""
    return {"iters": f"{s.get('timed_iterations', 0)} timed",
            **{f"{st}_ms": round(s.get(f"{st}_ms", 0.0), 2) for st in timing.STAGES},
            "total_ms": round(s.get("total_ms", 0.0), 2),
            "agg_share": f"{100 * s.get('aggregation_share', 0.0):.0f}%",
            "AU": f"{100 * s.get('accelerator_utilisation', 0.0):.0f}%"}


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for j in doc["jobs"]:
        s, a = j["stages"], j["aggregation"]
        out.append({
            "job": j["jobname"], "engine": label(j["engine"], {"mode": j.get("engine_mode")}),
            "batch": j["batch_size"],
            "targets": len(j["targets"]), **_stage_cells(s),
            "speedup": f"{j['speedup_vs_mmap']['total']:.2f}x" if "speedup_vs_mmap" in j else "",
            "agg_speedup": (f"{j['speedup_vs_mmap']['aggregation']:.2f}x"
                            if "speedup_vs_mmap" in j else ""),
            "agg_vs_1_target": (f"{j['aggregation_vs_one_target']:.2f}x"
                                if "aggregation_vs_one_target" in j else ""),
            "agg_rows/s": round(a["iops"]), "agg_MB/s": round(a["bw_bytes"] / 1e6, 1),
            "cache_hits": f"{100 * j['cache']['hit_rate']:.1f}%" if j.get("cache") else "",
            "verify": f"{j['verify']['mismatches']} bad / {j['verify']['rows_checked']}",
        })
        for g in j.get("per_gpu", []):  # a data-parallel job's trainers, under its total
            gs, ga = g["stages"], g["aggregation"]
            out.append({"job": f"{j['jobname']} · gpu {g['gpu']}", "engine": out[-1]["engine"],
                        "batch": j["batch_size"], "targets": len(j["targets"]),
                        **_stage_cells(gs),
                        "agg_rows/s": round(ga["iops"]), "agg_MB/s": round(ga["bw_bytes"] / 1e6, 1),
                        "verify": f"{g['verify']['mismatches']} bad / {g['verify']['rows_checked']}"})
    return out


def problems(doc: dict[str, Any]) -> list[str]:
    """A line for each job that failed or aggregated rows that differ from the table's."""
    return problem_lines(doc, lambda job: f"{job['verify']['mismatches']} aggregated rows "
                         "differ from the feature table's values" if job["error"] else None)


def render(doc: dict[str, Any], fmt: str, console: Any = None) -> str:
    """The document in ``fmt``: the whole document as JSON, else the stage table (a 'table'
    prints to ``console`` and returns '')."""
    title = (f"gpufio {doc['gpufio version']} · {doc['profile']} · GNN feature aggregation "
             f"(device {doc['jobs'][0]['device'] if doc['jobs'] else '-'})")
    limits = dict.fromkeys(memlimit.describe(j["memory_limit"]) for j in doc["jobs"]
                           if j.get("memory_limit"))
    if limits:  # whether the page cache could hold the table decides what mmap measured
        title += " · " + "; ".join(limits)
    emulated = emulated_labels(doc["jobs"])
    if emulated:  # beside every number of a modelled drive, as compat beside cuFile's
        title += " · " + "; ".join(emulated)
    if doc.get("sections_ran_on"):  # shown as one run: say the sections ran apart
        title += " · sections ran on " + ", ".join(doc["sections_ran_on"])
    stages = render_document(doc, fmt, console, title=title, rows=rows(doc),
                             left=("job", "engine", "iters", "verify"), problems=problems(doc))
    if not emulated or fmt == "json":
        return stages
    return stages + render_document(
        doc, fmt, console, title=f"the article's table: seconds over the timed iterations · "
        f"{'; '.join(emulated)}", rows=article_rows(doc), left=("job", "drives"), problems=[])
