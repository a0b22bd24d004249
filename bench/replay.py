#!/usr/bin/env python3
"""The very same GNN aggregation reads through fio and through each gpufio engine.

A GNN job (``--device``, engine mmap) writes every row its mini-batches ask for as an fio
iolog (``gnn_iolog``); then fio replays that log into host memory (``--read_iolog``,
``--replay_no_stall``) and each gpufio engine replays it (``read_iolog``) into its own
memory (GPU memory for the GPU engines), at the same queue depth, one after another, the
page cache dropped before each. Prints each replay's reads/s and its ratio to fio's.

    python3 -m bench.replay --fio .peers/fio --dir /mnt/nvme/gnn --engines uring cpu-gpu cufile
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench._common import cgroup_cpu, fio_cpu_s, gpufio, report, run_counted
from gpufio import api


def trace(args: argparse.Namespace) -> str:
    """Run the GNN job that writes the log; the log's path."""
    log = str(Path(args.dir) / "aggregation.iolog")
    gpufio({"global": {"workload": "gnn", "engine": "mmap", "device": args.device,
                       "nodes": args.nodes, "feature_dim": 1024, "batch_size": args.batch,
                       "fanout": args.fanout, "iterations": args.iterations, "warmup": 0,
                       "targets": [args.dir], "gnn_iolog": log}})
    return log


def replay_fio(fio: str, log: str, depth: int) -> dict:
    out, samples = run_counted([fio, "--name=replay", f"--read_iolog={log}",
                                "--replay_no_stall=1", "--ioengine=io_uring", "--direct=1",
                                f"--iodepth={depth}", "--output-format=json"])
    doc = json.loads(out)
    rd = doc["jobs"][0]["read"]
    cpu = fio_cpu_s(doc, samples, rd["runtime"])
    return {"ios": rd["total_ios"], "iops": rd["iops"],
            "cpu_us": 1e6 * cpu / rd["total_ios"] if cpu is not None and rd["total_ios"] else None}


def replay_gpufio(engine: str, log: str, depth: int) -> dict:
    counted = cgroup_cpu()  # gpufio counts its CPU like fio's: in a cgroup of its own
    job = gpufio({"global": {"engine": engine, "read_iolog": log, "iodepth": depth,
                             **({"cpu_accounting": "cgroup"} if counted else {})}})["jobs"][0]
    ios = job["read"]["total_ios"]
    cpu = job["cpu_us_per_io"] if counted else None
    return {"ios": ios, "iops": job["read"]["iops"], "cpu_us": cpu, "error": job["error"],
            "mode": job["engine_facts"].get("mode")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", required=True)
    ap.add_argument("--dir", required=True, help="where the feature table and the log go")
    ap.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    ap.add_argument("--nodes", type=int, default=250_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--fanout", type=int, nargs="+", default=[10, 5, 5])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--iodepth", type=int, default=128)
    ap.add_argument("--engines", nargs="+", default=["psync", "uring", "cpu-gpu", "cufile", "mmap"])
    ap.add_argument("--json", help="also write every replay's numbers here")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    log = trace(args)
    trace_log = api.read_iolog(log)
    entries, files = len(trace_log.offs), list(trace_log.files)
    api.evict(files)
    fio = replay_fio(args.fio, log, args.iodepth)
    rows = [["fio io_uring (host memory)", args.iodepth, fio["ios"], round(fio["iops"]), "1.00",
             f"{fio['cpu_us']:.2f}" if fio["cpu_us"] is not None else ""]]
    raw = {"log": log, "entries": entries, "fio": fio, "gpufio": {}}
    for engine in args.engines:
        depth = 1 if engine == "psync" else args.iodepth
        api.evict(files)
        r = replay_gpufio(engine, log, depth)
        raw["gpufio"][engine] = r
        name = f"gpufio {engine}" + (f" ({r['mode']})" if r.get("mode") else "")
        rows.append([name, depth, r["ios"], round(r["iops"]), f"{r['iops'] / fio['iops']:.2f}",
                     f"{r['cpu_us']:.2f}" if r["cpu_us"] is not None else ""])
    return report(f"{entries} aggregation reads of {args.iterations} GNN iterations "
                  f"(batch {args.batch}, fanout {args.fanout}), replayed once each", rows,
                  ["replay", "qd", "reads", "reads/s", "vs fio", "CPU us/read"], raw, args.json, [])


if __name__ == "__main__":
    sys.exit(main())
