"""One result document from the documents of the ranks of an MPI run, merged exactly.

Per job: I/Os, bytes, syncs and CPU seconds summed; latency histograms added bucket by
bucket, so the percentiles are those of every rank's I/Os together (never an average of
percentiles), the moments combined exactly; the runtime is the longest rank's; the interval
samples added up by their position (the ranks' clocks start together at the gate). Each job
keeps a row per rank and per host, and the start skew the gate left between the ranks.
"""

from __future__ import annotations

import time
from typing import Any

from gpufio.core.stats import LatencyStats
from gpufio.workloads.block.document import TABLE_PERCENTILES, hist_bins, lat_from_block, rw_block

DIRECTIONS = ("read", "write")


def _percentiles(job: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(p) for p in job["resolved options"].get("percentile_list",
                                                                 TABLE_PERCENTILES))


def _direction(jobs: list[dict[str, Any]], d: str, runtime_ns: int,
               plist: tuple[float, ...]) -> dict[str, Any]:
    lat = LatencyStats()
    for j in jobs:
        lat.merge(lat_from_block(j[d]["lat_ns"]))
    return rw_block(sum(j[d]["total_ios"] for j in jobs), sum(j[d]["io_bytes"] for j in jobs),
                    runtime_ns, sum(j[d]["short_ios"] for j in jobs), lat, plist)


def _samples(jobs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The ranks' samples added up by position, over the intervals every rank has."""
    n = min(len(j.get("samples", [])) for j in jobs)
    return [{"t_ms": jobs[0]["samples"][i]["t_ms"],
             "iops": sum(j["samples"][i]["iops"] for j in jobs),
             "bw_bytes": sum(j["samples"][i]["bw_bytes"] for j in jobs)} for i in range(n)]


def _rank_row(rank: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    row = {k: rank[k] for k in ("rank", "local_rank", "host")}
    for d in DIRECTIONS:
        if job[d]["total_ios"]:
            row[d] = {k: job[d][k] for k in ("total_ios", "io_bytes", "iops", "bw_bytes")}
            row[d]["lat_ns"] = {k: job[d]["lat_ns"][k] for k in ("mean", "percentile")}
    row["error"] = job["error"]
    return row


def _host_rows(jobs: list[dict[str, Any]], ranks: list[dict[str, Any]],
               runtime_ns: int, plist: tuple[float, ...]) -> list[dict[str, Any]]:
    hosts: dict[str, list[dict[str, Any]]] = {}
    for job, rank in zip(jobs, ranks):
        hosts.setdefault(rank["host"], []).append(job)
    out = []
    for host, mine in hosts.items():
        row: dict[str, Any] = {"host": host, "ranks": len(mine)}
        for d in DIRECTIONS:
            block = _direction(mine, d, runtime_ns, plist)
            if block["total_ios"]:
                block["lat_ns"].pop("bins")
                row[d] = block
        out.append(row)
    return out


def merge_job(jobs: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One job's documents, one per rank (in rank order), as one job document."""
    first = jobs[0]
    runtime_ns = int(max(max(j[d]["runtime"] for d in DIRECTIONS) for j in jobs) * 1e6)
    plist = _percentiles(first)
    out = dict(first)
    for d in DIRECTIONS:
        out[d] = _direction(jobs, d, runtime_ns, plist)
    syncs = sum(j["sync"]["total_ios"] for j in jobs)
    seconds = sum(j["sync"]["seconds"] for j in jobs)
    out["sync"] = {"total_ios": syncs, "lat_ns": {"mean": seconds * 1e9 / syncs if syncs else 0.0},
                   "seconds": seconds}
    secs = runtime_ns / 1e9
    # a rank's CPU seconds: its usr_cpu / sys_cpu are percentages of its own runtime
    usr = sum(j["usr_cpu"] / 100 * j["read"]["runtime"] / 1e3 for j in jobs)
    sys_ = sum(j["sys_cpu"] / 100 * j["read"]["runtime"] / 1e3 for j in jobs)
    ios = sum(out[d]["total_ios"] for d in DIRECTIONS)
    out.update({"usr_cpu": 100 * usr / secs if secs else 0.0,
                "sys_cpu": 100 * sys_ / secs if secs else 0.0,
                "cpu_us_per_io": 1e6 * (usr + sys_) / ios if ios else 0.0})
    out["targets"] = [{**t, "rank": r["rank"]} for j, r in zip(jobs, ranks) for t in j["targets"]]
    out["workers"] = [{**w, "rank": r["rank"]} for j, r in zip(jobs, ranks) for w in j["workers"]]
    out["errors"] = [{**e, "rank": r["rank"]} for j, r in zip(jobs, ranks) for e in j["errors"]]
    out["verify"] = {"enabled": first["verify"]["enabled"],
                     "failures": sum(j["verify"]["failures"] for j in jobs),
                     "bad_offsets": [{**b, "rank": r["rank"]} for j, r in zip(jobs, ranks)
                                     for b in j["verify"]["bad_offsets"]]}
    out["samples"] = _samples(jobs)
    out.pop("per_gpu", None)
    gpus = [{**g, "rank": r["rank"]} for j, r in zip(jobs, ranks) for g in j.get("per_gpu", [])]
    if gpus:
        out["per_gpu"] = gpus
    lat = LatencyStats()
    for d in DIRECTIONS:
        lat.merge(lat_from_block(out[d]["lat_ns"]))
    out["lat_hist"] = {**first["lat_hist"], "bins": hist_bins(lat)}
    out["interrupted"] = any(j["interrupted"] for j in jobs)
    failures = [f"rank {r['rank']}: {j['failure']}" for j, r in zip(jobs, ranks) if j["failure"]]
    out["failure"] = "; ".join(failures) or None
    out["error"] = max(j["error"] for j in jobs)
    starts = [r["job_starts_ns"].get(first["jobname"]) for r in ranks]
    known = [s for s in starts if s is not None]
    out["mpi"] = {"ranks": [_rank_row(r, j) for j, r in zip(jobs, ranks)],
                  "hosts": _host_rows(jobs, ranks, runtime_ns, plist),
                  "start_skew_ns": max(known) - min(known) if known else None}
    return out


def merge_ranks(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' documents (rank order; each with its ``rank`` facts) as one document: the
    cluster's total per job, with rows per rank and per host."""
    t0 = time.perf_counter_ns()
    ranks = [d["rank"] for d in docs]
    out = {k: v for k, v in docs[0].items() if k != "rank"}
    out["jobs"] = [merge_job([d["jobs"][i] for d in docs], ranks)
                   for i in range(min(len(d["jobs"]) for d in docs))]
    out["interrupted"] = any(d["interrupted"] for d in docs)
    merge_ns = time.perf_counter_ns() - t0
    out["mpi"] = {"size": len(docs), "hosts": sorted({r["host"] for r in ranks}),
                  "ranks": [{"rank": r["rank"], "local_rank": r["local_rank"], "host": r["host"],
                             "gate_wait_ns": r["gate_wait_ns"], "host_facts": d["host"]}
                            for r, d in zip(ranks, docs)],
                  "merge_ns": merge_ns, **coordination(out["jobs"], ranks[0], merge_ns)}
    return out


def coordination(jobs: list[dict[str, Any]], root: dict[str, Any], merge_ns: int) -> dict[str, Any]:
    """What coordinating the ranks cost the run, against the jobs' measured time: rank 0
    opening the gates once every rank was ready, the start skew left between the ranks'
    clocks, receiving the ranks' messages and the merge. Waiting for the slowest rank's set-up
    is not in it (``gate_wait_ns``): that happens before the clocks start."""
    skew = sum(j["mpi"]["start_skew_ns"] or 0 for j in jobs)
    cost = root.get("gate_open_ns", 0) + skew + root.get("recv_ns", 0) + merge_ns
    runtime_ns = sum(max(j[d]["runtime"] for d in DIRECTIONS) * 1e6 for j in jobs)
    return {"coordination_ns": cost,
            "coordination_share": cost / runtime_ns if runtime_ns else None}
