#!/usr/bin/env python3
"""The request rate of the submission mechanisms themselves: NOPs, no storage, no copy.

gpu-uring with ``op = "nop"`` (GPU threads post IORING_OP_NOP through the same rings,
agents and SQPOLL threads) beside the first probe's NOP ceiling in the same call
(``--probe``: a standalone GPU-initiated io_uring script run with OPCODE=0 BLOCK=16),
and uring's CPU-submitted NOPs. The goal: gpu-uring nop >= 0.9x the probe at each ring
count. Also what the GPU pays: the SMs the agents and requesters occupy, and NOPs per SM.

    . bench/gpu_env.sh && python3 -m bench.nop --probe .peers/gpu_uring_probe.py
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from bench._common import clean_up_on_sigterm, report, run_gpufio, setup_tmpfs

GOAL = 0.9


def run_probe(probe: str, target: str, n: int, rings: int, reps: int) -> list[float]:
    """The probe's NOP rates (requests/s), its first repetition (compilation) left out."""
    out = subprocess.run([sys.executable, probe, target, str(n), str(rings), "0", str(reps + 1)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "OPCODE": "0", "BLOCK": "16"}).stdout
    rates = [float(m) * 1e3 for m in re.findall(r"-> (\d+)K IOPS", out)]
    if len(rates) != reps + 1:
        raise SystemExit(f"bench: the probe printed {len(rates)} rates, not {reps + 1}:\n{out}")
    return rates[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", required=True, help="the reference probe, copied into the checkout")
    ap.add_argument("--rings", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--iodepth", type=int, default=512, help="gpu-uring request slots per ring")
    ap.add_argument("--n", type=int, default=4 << 20, help="the probe's requests per repetition")
    ap.add_argument("--runtime", type=int, default=3, help="gpufio's measured seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool; medians are reported")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    clean_up_on_sigterm()
    target, clean = setup_tmpfs()
    rows, raw, missed = [], [], []
    try:
        cpu = [run_gpufio(target, {"engine": "uring", "op": "nop"}, 1, 128, args.runtime)
               for _ in range(args.repeat)]
        rate = statistics.median(r["iops"] for r in cpu)
        rows.append(["uring nop (CPU-submitted)", "1 ring x 128", "", round(rate), "", "",
                     f"{statistics.median(r['cpu_us'] for r in cpu):.2f}", "", ""])
        raw.append({"path": "uring nop", "gpufio": cpu})
        for rings in args.rings:
            g, p = [], []
            for _ in range(args.repeat):
                g.append(run_gpufio(target, {"engine": "gpu-uring", "op": "nop", "rings": rings},
                                    1, args.iodepth, args.runtime))
                p.extend(run_probe(args.probe, target, args.n, rings, 1))
            gi, pi = statistics.median(r["iops"] for r in g), statistics.median(p)
            price = (g[0].get("gpu_price") or [{}])[0]
            sms = price.get("sms_occupied") or 0
            ratio = gi / pi if pi else 0.0
            verdict = "ok" if ratio >= GOAL else f"MISS ratio<{GOAL}"
            if ratio < GOAL:
                missed.append(f"gpu-uring nop {rings} rings: {ratio:.2f}")
            rows.append([f"gpu-uring nop, {rings} rings", f"{rings} x {args.iodepth}",
                         round(pi), round(gi), f"{ratio:.2f}",
                         f"{sms} ({price.get('agent_warps')} agent + "
                         f"{price.get('requester_warps')} requester warps)",
                         f"{statistics.median(r['cpu_us'] for r in g):.2f}",
                         f"{gi / sms:.0f}" if sms else "", verdict])
            raw.append({"path": f"gpu-uring nop {rings} rings", "gpufio": g, "probe": p})
            print(f"bench: {rings} rings: gpufio {gi:.0f} probe {pi:.0f} ratio {ratio:.2f}",
                  file=sys.stderr, flush=True)
    finally:
        clean()
    return report(f"NOPs: no storage, no copy · gpufio {args.runtime}s runs, probe "
                  f"{args.n} requests a run, medians of {args.repeat}", rows,
                  ["path", "rings x slots", "probe req/s", "gpufio req/s", "ratio",
                   "SMs occupied", "CPU us/req", "req/s per SM", "goal"],
                  {"runs": raw}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
