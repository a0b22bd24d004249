#!/usr/bin/env python3
"""gpufio against its peers, in one run, on targets this script sets up itself.

For each target (a tmpfs file with O_DIRECT, and zram when this host has it) and each CPU
path, run gpufio and fio with the same settings, interleaved and repeated, and print the
median of each with their ratio: IOPS, p50/p99 latency, CPU per I/O. The speed targets live
here (``TARGETS``), never in the unit tests: ``--check`` exits 1 if a ratio misses its target.

    python3 -m bench.compare                       # this machine: 1 job, iodepth 32
    python3 -m bench.compare --numjobs 8 16 --fio .peers/fio --check

CPU per I/O is measured like for like: gpufio counts its own in a cgroup over its measured
window (``cpu_accounting = "cgroup"``); fio runs in a cgroup of its own, sampled every few
ms, and the CPU charged to it over its last runtime ms before its timestamp_ms is divided by
the measured I/Os. Kernel threads that work for a tool (io_uring's io-wq and SQPOLL threads) are
created in its cgroup, so they are charged to it, whichever tool it is. Where no cgroup can be
made (not root), each tool's own figure stands in (fio counts only its job threads), and the
run says "cpu": "self".
"""

from __future__ import annotations

import argparse
import shutil
import sys

from bench._common import (
    SIZE,
    clean_up_on_sigterm,
    fio_version,
    median,
    report,
    run_fio,
    run_gpufio,
    setup_tmpfs,
    setup_zram,
)

# (gpufio engine options, fio options, minimum gpufio/fio IOPS ratio)
PATHS = {
    "psync": ({"engine": "psync"}, ["--ioengine=psync"], None),
    "uring": ({"engine": "uring"}, ["--ioengine=io_uring"], 0.9),
    "uring-sqpoll": ({"engine": "uring", "sqpoll": True},
                     ["--ioengine=io_uring", "--sqthread_poll=1"], 0.9),
    # no storage on either side: gpufio's own loop against fio's (fio's null engine opens no
    # file, so it is told the region's size: the bench file's, SIZE)
    "null": ({"engine": "null"}, ["--ioengine=null", f"--size={SIZE}"], None),
}
TARGETS = {1: 0.9, 8: 0.8, 16: 0.8}  # numjobs -> minimum ratio for the io_uring paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", default=shutil.which("fio"), help="fio binary (default: on PATH)")
    ap.add_argument("--numjobs", type=int, nargs="+", default=[1])
    ap.add_argument("--iodepth", type=int, default=32)
    ap.add_argument("--runtime", type=int, default=5, help="measured seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool; medians are reported")
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--no-zram", action="store_true")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a ratio misses its target")
    args = ap.parse_args()
    if not args.fio:
        raise SystemExit("bench: fio not found (apt-get install fio, or pass --fio PATH)")
    clean_up_on_sigterm()
    version = fio_version(args.fio)
    cleanups = []
    tgts = {}
    try:
        path, clean = setup_tmpfs()
        cleanups.append(clean)
        tgts["tmpfs"] = path
        if not args.no_zram and (z := setup_zram()):
            tgts["zram"] = z[0]
            cleanups.append(z[1])
        rows, raw, missed = [], [], []
        for tname, target in tgts.items():
            for numjobs in args.numjobs:
                for pname in args.paths:
                    g_opts, f_opts, _ = PATHS[pname]
                    depth = 1 if pname == "psync" else args.iodepth
                    g_runs, f_runs = [], []
                    for _ in range(args.repeat):  # interleaved, so drift hits both tools alike
                        g_runs.append(run_gpufio(target, g_opts, numjobs, depth, args.runtime))
                        f_runs.append(run_fio(args.fio, target, f_opts, numjobs, depth,
                                              args.runtime))
                    g, f = ({k: median(r, k) for k in ("iops", "p50", "p99", "cpu_us")}
                            for r in (g_runs, f_runs))
                    ratio = g["iops"] / f["iops"] if f["iops"] else 0.0
                    goal = TARGETS.get(numjobs) if PATHS[pname][2] else None
                    verdict = "" if goal is None else ("ok" if ratio >= goal else f"MISS (<{goal})")
                    if verdict.startswith("MISS"):
                        missed.append(f"{tname} {pname} numjobs={numjobs}: {ratio:.2f}")
                    rows.append([tname, pname, numjobs, depth, round(g["iops"]), round(f["iops"]),
                                 f"{ratio:.2f}", f"{g['p50'] / 1e3:.1f}/{f['p50'] / 1e3:.1f}",
                                 f"{g['p99'] / 1e3:.1f}/{f['p99'] / 1e3:.1f}",
                                 f"{g['cpu_us']:.2f}/{f['cpu_us']:.2f}", verdict])
                    raw.append({"target": tname, "path": pname, "numjobs": numjobs,
                                "iodepth": depth, "gpufio": g_runs, "fio": f_runs})
                    print(f"bench: {tname} {pname} numjobs={numjobs}: gpufio {g['iops']:.0f} "
                          f"fio {f['iops']:.0f} IOPS ratio {ratio:.2f}", file=sys.stderr, flush=True)
    finally:
        for clean in cleanups:
            clean()
    return report(f"{version} · 4 KiB randread, O_DIRECT, {args.runtime}s runs, median of "
                  f"{args.repeat}", rows,
                  ["target", "path", "jobs", "qd", "gpufio IOPS", "fio IOPS", "ratio",
                   "p50 us g/f", "p99 us g/f", "CPU us/IO g/f", "target"],
                  {"fio": version, "runs": raw}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
