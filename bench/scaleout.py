#!/usr/bin/env python3
"""MPI ranks against one process, in one run: does splitting a job over ranks keep its speed?

For each path and rank count N, the same work runs twice on a tmpfs file: one gpufio process
with N rings (gpu-uring) or N workers (cpu-gpu, spawned processes), then ``mpirun -n N`` with
one ring or worker per rank, every rank on the GPU (CUDA MPS lets their contexts share it
when its daemon runs). The merged total's ratio to the single process, the start skew, what
coordinating the ranks cost (its share of the measured time) and the ranks' gate waits are
printed; the merged percentiles are checked to lie within the ranks' own. The goals
(``GOAL``, ``SKEW_GOAL_MS``, ``COORDINATION_GOAL``) live here; ``--check`` exits 1 on a miss.

    . bench/gpu_env.sh && python3 -m bench.scaleout --ranks 2 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import clean_up_on_sigterm, report, setup_tmpfs

GOAL = 0.9
SKEW_GOAL_MS = 10.0  # the ranks' clocks start within 10 ms of each other
COORDINATION_GOAL = 0.01  # and coordinating them costs under 1% of the measured time
# path -> (options of one rank's share, the key that gives one process N of them)
PATHS = {"gpu-uring": ({"engine": "gpu-uring", "rings": 1, "iodepth": 128}, "rings"),
         "cpu-gpu": ({"engine": "cpu-gpu", "iodepth": 64, "processes": True, "numjobs": 1},
                     "numjobs")}


def profile(target: str, opts: dict, runtime: int) -> str:
    prof = {"rw": "randread", "bs": "4k", "targets": [target], "runtime": f"{runtime}s",
            "time_based": True, "ramp_time": "1s", "verify": True, **opts}
    fd, path = tempfile.mkstemp(suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write("[global]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in prof.items()))
    return path


def run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    if out.returncode:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({out.returncode}): "
                         f"{(out.stderr or out.stdout).strip()[-800:]}")
    return json.loads(out.stdout)


def median_by(runs: list, key: callable) -> Any:
    """The median run by ``key`` (the upper one of an even count): a whole run's document,
    so its percentiles and gate waits stay its own."""
    return sorted(runs, key=key)[len(runs) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--runtime", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs of runs per row, interleaved; the row holds the median "
                         "one-process run and the median merged run")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    clean_up_on_sigterm()
    target, clean = setup_tmpfs()
    gpufio = [sys.executable, "-m", "gpufio", "run"]
    rows, raw, missed = [], [], []
    try:
        for name in args.paths:
            share, key = PATHS[name]
            for n in args.ranks:
                one = profile(target, {**share, key: n * share[key]}, args.runtime)
                each = profile(target, share, args.runtime)
                pairs = []
                try:
                    for _ in range(args.repeat):  # interleaved: drift hits both alike
                        pairs.append((run([*gpufio, one, "-f", "json", "-q"])["jobs"][0],
                                      run([args.mpirun, "-n", str(n), *gpufio, each, "-f",
                                           "json", "-q"])))
                finally:
                    os.unlink(one)
                    os.unlink(each)
                single = median_by([s for s, _ in pairs], lambda j: j["read"]["iops"])
                merged_doc = median_by([m for _, m in pairs],
                                       lambda d: d["jobs"][0]["read"]["iops"])
                if args.repeat > 1:
                    print("bench: " + name + f" x{n}: one process / ranks IOPS " + ", ".join(
                        f"{s['read']['iops']:.0f}/{m['jobs'][0]['read']['iops']:.0f}"
                        for s, m in pairs), file=sys.stderr, flush=True)
                merged = merged_doc["jobs"][0]
                ratio = merged["read"]["iops"] / single["read"]["iops"]
                p99 = merged["read"]["lat_ns"]["percentile"]["99.000000"]
                own = [r["read"]["lat_ns"]["percentile"]["99.000000"] for r in merged["mpi"]["ranks"]]
                within = min(own) <= p99 <= max(own)
                skew_ms = merged["mpi"]["start_skew_ns"] / 1e6
                share = merged_doc["mpi"]["coordination_share"]
                verdict = ("ok" if ratio >= GOAL and within and not merged["error"]
                           and skew_ms < SKEW_GOAL_MS and share < COORDINATION_GOAL else "MISS")
                if verdict != "ok":
                    missed.append(f"{name} {n} ranks: ratio {ratio:.2f}, p99 within ranks' "
                                  f"{within}, skew {skew_ms:.2f} ms, coordination {share:.2%}")
                waits = [r["gate_wait_ns"] / 1e6 for r in merged_doc["mpi"]["ranks"]]
                rows.append([name, n, round(single["read"]["iops"]), round(merged["read"]["iops"]),
                             f"{ratio:.2f}", f"{skew_ms:.2f}", f"{share:.3%}",
                             f"{max(waits):.0f}", f"{p99 / 1e3:.0f} in [{min(own) / 1e3:.0f}, "
                             f"{max(own) / 1e3:.0f}]", merged["verify"]["failures"],
                             f"{merged_doc['mpi']['merge_ns'] / 1e6:.1f}", verdict])
                raw.append({"path": name, "ranks": n, "pairs": [{"single": s, "merged": m}
                                                                  for s, m in pairs]})
                print(f"bench: {name} x{n}: one process {single['read']['iops']:.0f}, "
                      f"ranks {merged['read']['iops']:.0f}", file=sys.stderr, flush=True)
    finally:
        clean()
    mps = "on" if subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-control"],
                                 capture_output=True).returncode == 0 else "off"
    return report(f"4k randread on tmpfs, verified, {args.runtime}s runs, MPS {mps}", rows,
                  ["path", "ranks", "one process IOPS", "merged ranks IOPS", "ratio",
                   "start skew ms", "coordination", "max gate wait ms", "merged p99 us in ranks'",
                   "verify failures", "merge ms", "goal"],
                  {"runs": raw}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
