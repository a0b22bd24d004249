#!/usr/bin/env python3
"""gpufio's latency laid over fio's: a queue-depth sweep of both on one device.

4 KiB random reads, O_DIRECT, uring against fio's io_uring at iodepth 1, 4, 32 and 128
(``--depths``), both at the same iodepth_batch_submit (``--batch-submit``, fio's default 1),
on a loop device with direct I/O on over a file the bench lays out (root needed; ``--target``
names another device or file instead). Each depth runs ``--rounds`` times, the two tools back
to back, the order swapped every round. Per depth the table gives both tools' IOPS and mean
``lat`` (fio's: from get_io_u to the reaped completion; gpufio's the same), the ratio of the
means (the median of each round's own ratio), each tool's IOPS x mean latency (Little's law:
the I/Os it kept in flight by its own stamps, which is the depth when the stamps miss
nothing), and both slats (the wait between an I/O's stamp and its submitting call; clat is
lat less it). ``--check`` exits 1 where the ratio or gpufio's product is more than 5% off;
``--quick`` runs each depth once for a second, to prove the bench works, and its numbers are
no measurement.

    python3 -m bench.overlay --check                  # 3 rounds of 4 s, a 1 GiB file in ~
    python3 -m bench.overlay --quick
    python3 -m bench.overlay --dir /var/tmp --json out.json
    python3 -m bench.overlay --target /dev/nvme0n1 --batch-submit 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import (clean_up_on_sigterm, fio_version, gpufio, report,
                           setup_loop_dio)

DEPTHS = (1, 4, 32, 128)
# lat mean within 5% of fio's; IOPS x mean lat within 5% of the depth
TOLERANCE = 0.05
HEADERS = ["qd", "gpufio IOPS", "fio IOPS", "lat us g/f", "lat ratio", "IOPS x lat g",
           "IOPS x lat f", "slat us g/f", "goal"]


def run_gpufio(target: str, qd: int, batch_submit: int, runtime: float,
               ramp: float) -> dict[str, float]:
    """One gpufio uring run: IOPS, mean lat and mean slat (ns)."""
    doc = gpufio({"global": {
        "engine": "uring", "targets": [target], "rw": "randread", "bs": "4k", "direct": True,
        "iodepth": qd, "iodepth_batch_submit": batch_submit, "runtime": f"{runtime}s",
        "ramp_time": f"{ramp}s", "time_based": True}})
    job = doc["jobs"][0]
    slat = job["engine_facts"].get("slat_mean_ns") or [0]
    return {"iops": job["read"]["iops"], "lat": job["read"]["lat_ns"]["mean"],
            "slat": statistics.fmean(slat), "loop": job["engine_facts"].get("loop", "")}


def run_fio(fio: str, target: str, qd: int, batch_submit: int, runtime: float,
            ramp: float) -> dict[str, float]:
    """The same through fio's io_uring: IOPS, mean lat and mean slat (ns)."""
    out = subprocess.run(
        [fio, "--name=overlay", f"--filename={target}", "--ioengine=io_uring", "--direct=1",
         "--rw=randread", "--bs=4k", f"--iodepth={qd}", f"--iodepth_batch_submit={batch_submit}",
         f"--runtime={runtime}", f"--ramp_time={ramp}", "--time_based",
         "--output-format=json"], capture_output=True, text=True, check=True).stdout
    rd = json.loads(out)["jobs"][0]["read"]
    return {"iops": rd["iops"], "lat": rd["lat_ns"]["mean"], "slat": rd["slat_ns"]["mean"]}


def product(run: dict[str, float]) -> float:
    """IOPS x mean latency: the I/Os in flight by the run's own stamps."""
    return run["iops"] * run["lat"] / 1e9


def verdict(qd: int, ratio: float, g_product: float) -> list[str]:
    """The goals a depth misses: its lat ratio, and gpufio's product against the depth."""
    miss = []
    if abs(ratio - 1) > TOLERANCE:
        miss.append(f"lat {ratio:.3f}x fio's")
    if abs(g_product - qd) > TOLERANCE * qd:
        miss.append(f"IOPS x lat {g_product:.2f} at qd {qd}")
    return miss


def row(qd: int, g_runs: list[dict[str, float]], f_runs: list[dict[str, float]],
        missed: list[str]) -> list[Any]:
    """A depth's table row from its rounds (medians; the lat ratio: of each round's own);
    what it misses added to ``missed``."""
    g, f = ({k: statistics.median(r[k] for r in runs) for k in ("iops", "lat", "slat")}
            for runs in (g_runs, f_runs))
    ratio = statistics.median(a["lat"] / b["lat"] for a, b in zip(g_runs, f_runs))
    gp = statistics.median(product(r) for r in g_runs)
    fp = statistics.median(product(r) for r in f_runs)
    miss = verdict(qd, ratio, gp)
    missed += [f"qd {qd}: {m}" for m in miss]
    return [qd, round(g["iops"]), round(f["iops"]), f"{g['lat'] / 1e3:.1f}/{f['lat'] / 1e3:.1f}",
            f"{ratio:.3f}", f"{gp:.2f}", f"{fp:.2f}",
            f"{g['slat'] / 1e3:.1f}/{f['slat'] / 1e3:.1f}", "; ".join(miss) or "ok"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", default=shutil.which("fio"), help="fio binary (default: on PATH)")
    ap.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    ap.add_argument("--batch-submit", type=int, default=1,
                    help="iodepth_batch_submit of both tools (fio's default: 1)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per depth and tool")
    ap.add_argument("--runtime", type=float, default=4.0, help="measured seconds per run")
    ap.add_argument("--ramp", type=float, default=0.5, help="ramp seconds per run")
    ap.add_argument("--target", help="a device or file to read instead of the bench's own "
                                     "loop device")
    ap.add_argument("--dir", default=str(Path.home()),
                    help="where the loop device's file goes (a disk, not tmpfs)")
    ap.add_argument("--size-mb", type=int, default=1024, help="size of that file")
    ap.add_argument("--quick", action="store_true",
                    help="one round of 1 s runs over a 64 MiB file: proves the bench runs")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    if not args.fio:
        raise SystemExit("bench: fio not found (apt-get install fio, or pass --fio PATH)")
    if args.quick:
        args.rounds, args.runtime, args.ramp, args.size_mb = 1, 1.0, 0.2, 64
    clean_up_on_sigterm()  # a SIGTERM leaves through the finally below: the device goes
    release = None
    if args.target:
        target = args.target
    else:
        target, release = setup_loop_dio(Path(args.dir), args.size_mb << 20)
    runs: dict[int, dict[str, list[dict[str, float]]]] = {}
    try:
        for rnd in range(args.rounds):
            for qd in args.depths:
                tools = [("gpufio", lambda: run_gpufio(target, qd, args.batch_submit,
                                                       args.runtime, args.ramp)),
                         ("fio", lambda: run_fio(args.fio, target, qd, args.batch_submit,
                                                 args.runtime, args.ramp))]
                for name, go in tools if rnd % 2 == 0 else tools[::-1]:
                    runs.setdefault(qd, {}).setdefault(name, []).append(go())
                print(f"bench: round {rnd + 1}/{args.rounds} qd {qd}", file=sys.stderr,
                      flush=True)
    finally:
        if release is not None:
            release()
    missed: list[str] = []
    rows = [row(qd, by["gpufio"], by["fio"], missed) for qd, by in runs.items()]
    what = args.target or f"loop device (dio on) over a file in {args.dir}"
    settings = (f"{what} · 4k randread uring vs {fio_version(args.fio)} io_uring · "
                f"iodepth_batch_submit {args.batch_submit} · {args.rounds} round(s) of "
                f"{args.runtime:g} s, medians" + (" (--quick: not a measurement)"
                                                  if args.quick else ""))
    raw = {"settings": settings, "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "runs": [{"qd": qd, **by} for qd, by in runs.items()]}
    return report(settings, rows, HEADERS, raw, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
