#!/usr/bin/env python3
"""The GNN gather against its engine's block reads, in one run.

A GNN profile with one job per engine and no tuning keys (each row fetcher derives its
queue depth and submission from the machine and the batch) aggregates 4 KiB rows of a
generated feature table; then each engine's block job reads 4 KiB at random offsets of
that same feature file, with the settings its block benchmark uses. The gather's rows/s over
the block job's IOPS is the ratio held to be at least ``GOAL``; ``--check`` exits
1 when one is missed. Run on the GPU machine, with the table in memory (tmpfs, the default)
or on a drive (``--dir``):

    . bench/gpu_env.sh && python3 -m bench.gather --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bench._common import GpufioFailed, gpufio, report

GOAL = 0.8
# each engine's block job as its block benchmark runs it on RAM (bench/gpu.py's cases)
BLOCK = {"gpu-uring": {"rings": 8, "iodepth": 128},
         "cpu-gpu": {"iodepth": 512, "segments": 4, "sqe_async": True}}


def gnn_profile(args: argparse.Namespace) -> dict[str, Any]:
    """One GNN job per engine, with none of the row fetchers' tuning keys."""
    return {"global": {"workload": "gnn", "nodes": args.nodes, "feature_dim": 1024,
                       "batch_size": args.batch, "fanout": args.fanout,
                       "iterations": args.iterations, "warmup": args.warmup,
                       "directory": args.dir},
            "job": [{"name": f"gather-{engine}", "engine": engine} for engine in args.engines]}


def block_profile(args: argparse.Namespace, table: str) -> dict[str, Any]:
    """Each engine's 4 KiB random reads of the feature file ``table``, time based."""
    return {"global": {"rw": "randread", "bs": "4k", "targets": [table],
                       "runtime": f"{args.runtime}s", "ramp_time": "1s", "time_based": True},
            "job": [{"name": f"block-{engine}", "engine": engine, **BLOCK[engine]}
                    for engine in args.engines]}


def run(profile: dict[str, Any]) -> dict[str, Any]:
    """gpufio's document of ``profile``, or the run's own error as the bench's last word."""
    try:
        return gpufio(profile)
    except GpufioFailed as e:
        raise SystemExit(f"bench: gpufio failed: {e}") from None


def judge(gnn: dict, block: dict) -> tuple[list[list], list[str]]:
    """A row per engine: the gather's rows/s, the block job's IOPS, their ratio, the verdict."""
    rows, missed = [], []
    reads = {j["jobname"].removeprefix("block-"): j["read"]["iops"] for j in block["jobs"]}
    for j in gnn["jobs"]:
        engine = j["engine"]
        rate, iops = j["aggregation"]["iops"], reads[engine]
        ratio = rate / iops if iops else 0.0
        ok = ratio >= GOAL and not j["error"] and j["verify"]["mismatches"] == 0
        if not ok:
            missed.append(f"{engine}: gather {ratio:.2f}x its block reads")
        fetch = j.get("fetch", {})
        rows.append([engine, ", ".join(f"{k} {v}" for k, v in fetch.items()
                                       if k in ("iodepth", "rings", "sqe_async")),
                     round(rate), round(iops), f"{ratio:.2f}",
                     f"{j['verify']['mismatches']} / {j['verify']['rows_checked']}",
                     "ok" if ok else f"MISS <{GOAL}"])
    return rows, missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/dev/shm/gpufio-gather",
                    help="where the feature table goes (tmpfs: in memory)")
    ap.add_argument("--nodes", type=int, default=250_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--fanout", type=int, nargs="+", default=[10, 5, 5])
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=3, help="measured seconds of a block job")
    ap.add_argument("--engines", nargs="+", default=list(BLOCK), choices=list(BLOCK))
    ap.add_argument("--json", help="also write both documents here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    gnn = run(gnn_profile(args))
    block = run(block_profile(args, gnn["jobs"][0]["targets"][0]))
    rows, missed = judge(gnn, block)
    return report(f"GNN gather vs block reads · {args.nodes} nodes, batch {args.batch}, fanout "
                  f"{args.fanout}, {args.iterations - args.warmup} timed iterations · 4 KiB "
                  f"rows in {args.dir}", rows,
                  ["engine", "derived", "gather rows/s", "block IOPS", "ratio",
                   "rows bad / checked", "goal"],
                  {"gnn": gnn, "block": block}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
