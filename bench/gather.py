#!/usr/bin/env python3
"""The GNN gather against its engine's block reads, in one run (issue 18 section 3).

A GNN profile with one job per engine and no tuning keys (each row fetcher derives its
queue depth and submission from the machine and the batch) aggregates 4 KiB rows of a
generated feature table; then each engine's block job reads 4 KiB at random offsets of
that same feature file, with the settings its block benchmark uses. The gather's rows/s over
the block job's IOPS is the ratio the issue asks to be at least ``GOAL``; ``--check`` exits
1 when one is missed. Run on the GPU machine, with the table in memory (tmpfs, the default)
or on a drive (``--dir``):

    . bench/gpu_env.sh && python3 bench/gather.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compare import gpufio_counted, report  # noqa: E402

GOAL = 0.8
# each engine's block job as its block benchmark runs it on RAM (bench/gpu.py's cases)
BLOCK = {"gpu-uring": {"rings": 8, "iodepth": 128},
         "cpu-gpu": {"iodepth": 512, "segments": 4, "sqe_async": True}}


def gnn_profile(args: argparse.Namespace) -> str:
    """One GNN job per engine, with none of the row fetchers' tuning keys."""
    lines = ["[global]", 'workload = "gnn"', f"nodes = {args.nodes}", "feature_dim = 1024",
             f"batch_size = {args.batch}", f"fanout = {json.dumps(args.fanout)}",
             f"iterations = {args.iterations}", f"warmup = {args.warmup}",
             f"directory = {json.dumps(args.dir)}"]
    for engine in args.engines:
        lines += ["", "[[job]]", f'name = "gather-{engine}"', f'engine = "{engine}"']
    return "\n".join(lines) + "\n"


def block_profile(args: argparse.Namespace, table: str) -> str:
    """Each engine's 4 KiB random reads of the feature file ``table``, time based."""
    lines = ["[global]", 'rw = "randread"', 'bs = "4k"', f"targets = [{json.dumps(table)}]",
             f'runtime = "{args.runtime}s"', 'ramp_time = "1s"', "time_based = true"]
    for engine in args.engines:
        lines += ["", "[[job]]", f'name = "block-{engine}"', f'engine = "{engine}"'] + [
            f"{k} = {json.dumps(v)}" for k, v in BLOCK[engine].items()]
    return "\n".join(lines) + "\n"


def gpufio(text: str) -> dict:
    """``gpufio run`` of a profile's ``text`` (compare.gpufio_counted); its JSON document, or
    the run's own error as the bench's last word."""
    try:
        return gpufio_counted(text)[0]
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"bench: gpufio failed ({e.returncode}): "
                         f"{(e.stderr or '').strip()[-800:]}") from None


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
    gnn = gpufio(gnn_profile(args))
    block = gpufio(block_profile(args, gnn["jobs"][0]["targets"][0]))
    rows, missed = judge(gnn, block)
    return report(f"GNN gather vs block reads · {args.nodes} nodes, batch {args.batch}, fanout "
                  f"{args.fanout}, {args.iterations - args.warmup} timed iterations · 4 KiB "
                  f"rows in {args.dir}", rows,
                  ["engine", "derived", "gather rows/s", "block IOPS", "ratio",
                   "rows bad / checked", "goal"],
                  {"gnn": gnn, "block": block}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
