#!/usr/bin/env python3
"""gpufio's NVMe paths against fio's on the drives named: uring against fio io_uring (the
block device), uring-cmd against fio io_uring_cmd (the namespace's generic char device).

Random reads only (nothing is written to the drives), the same settings for every tool, the
four paths interleaved within each round (their order rotating from round to round, so a
drive warming up or a neighbour's load falls on all of them alike), and the median of the
rounds reported with each gpufio path's ratio to its fio peer. ``--check`` exits 1 when
uring-cmd's median IOPS falls below GOAL x fio io_uring_cmd's on any drive.

    python3 bench/nvme.py --drive /dev/nvme0n1 --drive /dev/nvme1n1
    python3 bench/nvme.py --drive /dev/ng0n1 --rounds 7 --runtime 20 --check
    python3 bench/nvme.py --drive /dev/nvme0n1 --quick      # prove it works: short rounds

A drive whose model says it is emulated (QEMU's) gets its rows labelled so: such numbers
show the emulator's speed, never a drive's. Runs gpufio and fio as commands (gpufio from this
checkout, with this interpreter), as a user would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.95  # uring-cmd's median IOPS against fio io_uring_cmd's, per drive
# path -> (tool, gpufio engine or fio ioengine, which node of the namespace it reads)
PATHS = {
    "uring": ("gpufio", "uring", "block"),
    "fio io_uring": ("fio", "io_uring", "block"),
    "uring-cmd": ("gpufio", "uring-cmd", "generic"),
    "fio io_uring_cmd": ("fio", "io_uring_cmd", "generic"),
}
PEERS = {"uring": "fio io_uring", "uring-cmd": "fio io_uring_cmd"}
EMULATED = re.compile(r"QEMU|emulat", re.I)


def nodes(drive: str) -> tuple[str, str]:
    """(block device, generic char device) of the namespace ``drive`` names (either)."""
    name = os.path.basename(os.path.realpath(drive))
    m = re.fullmatch(r"(?:nvme|ng)(\d+(?:c\d+)?n\d+)", name)
    if not m:
        raise SystemExit(f"bench: {drive}: not an NVMe namespace (/dev/nvmeXnY or /dev/ngXnY)")
    block, generic = f"/dev/nvme{m.group(1)}", f"/dev/ng{m.group(1)}"
    for node in (block, generic):
        if not os.path.exists(node):
            raise SystemExit(f"bench: {drive}: {node} does not exist (passthrough needs the "
                             "generic device, Linux 5.13+)")
    return block, generic


def model(block: str) -> str:
    """The drive's model from sysfs ('' where unknown)."""
    name = os.path.basename(block)
    for rel in (f"/sys/block/{name}/device/model", f"/sys/block/{name}/device/device/model"):
        try:
            return Path(rel).read_text().strip()
        except OSError:
            continue
    return ""


def run_gpufio(engine: str, target: str, a: argparse.Namespace) -> dict:
    """One gpufio run; (IOPS, p50 ns, p99 ns) of its job."""
    text = (f'[global]\nengine = "{engine}"\ntargets = ["{target}"]\nrw = "randread"\n'
            f'bs = "{a.bs}"\niodepth = {a.iodepth}\nnumjobs = {a.numjobs}\ndirect = true\n'
            f'runtime = "{a.runtime}s"\ntime_based = true\nramp_time = "{a.ramp}s"\n'
            f'size = "{a.size}"\n[[job]]\nname = "bench"\n')
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run([sys.executable, "-m", "gpufio", "run", f.name, "-f", "json", "-q"],
                             cwd=ROOT, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if out.returncode:
        raise SystemExit(f"bench: gpufio {engine} on {target} failed: "
                         f"{(out.stderr or out.stdout).strip()}")
    read = json.loads(out.stdout)["jobs"][0]["read"]
    pct = read["lat_ns"].get("percentile", {})
    return {"iops": read["iops"], "p50": pct.get("50.000000"), "p99": pct.get("99.000000")}


def run_fio(ioengine: str, target: str, a: argparse.Namespace) -> dict:
    """One fio run; (IOPS, p50 ns, p99 ns) of its (grouped) jobs."""
    cmd = [a.fio, "--output-format=json", "--name=bench", f"--filename={target}",
           f"--ioengine={ioengine}", "--rw=randread", f"--bs={a.bs}", f"--iodepth={a.iodepth}",
           f"--numjobs={a.numjobs}", "--group_reporting", "--time_based",
           f"--runtime={a.runtime}", f"--ramp_time={a.ramp}", f"--size={a.size}",
           "--percentile_list=50:99", "--thread"]
    cmd += ["--cmd_type=nvme"] if ioengine == "io_uring_cmd" else ["--direct=1"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench: fio {ioengine} on {target} failed: "
                         f"{(out.stderr or out.stdout).strip()}")
    read = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["read"]
    pct = read.get("clat_ns", {}).get("percentile", {})
    return {"iops": read["iops"], "p50": pct.get("50.000000"), "p99": pct.get("99.000000")}


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bench(a: argparse.Namespace) -> tuple[list[dict], bool]:
    """Every round of every drive; the rows of medians and whether the goal was met."""
    rows, met = [], True
    for drive in a.drive:
        block, generic = nodes(drive)
        label = "emulated" if EMULATED.search(model(block)) else ""
        runs: dict[str, list[dict]] = {p: [] for p in PATHS}
        order = list(PATHS)
        for r in range(a.rounds):
            for path in order[r % len(order):] + order[:r % len(order)]:
                tool, engine, node = PATHS[path]
                target = block if node == "block" else generic
                run = run_gpufio if tool == "gpufio" else run_fio
                runs[path].append(run(engine, target, a))
                print(f"bench: {drive} round {r + 1}/{a.rounds} {path}: "
                      f"{runs[path][-1]['iops']:.0f} IOPS", file=sys.stderr)
        med = {p: {k: median([x[k] for x in runs[p]]) for k in ("iops", "p50", "p99")}
               for p in PATHS}
        for path in PATHS:
            peer = PEERS.get(path)
            ratio = med[path]["iops"] / med[peer]["iops"] if peer and med[peer]["iops"] else None
            rows.append({"drive": drive, "model": model(block), "label": label, "path": path,
                         "rounds": a.rounds, **med[path],
                         "ratio": None if ratio is None else round(ratio, 3)})
            if path == "uring-cmd" and (ratio is None or ratio < GOAL):
                met = False
    return rows, met


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drive", action="append", required=True,
                   help="an NVMe namespace, /dev/nvmeXnY or /dev/ngXnY (repeatable)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runtime", type=float, default=10.0, help="seconds per run")
    p.add_argument("--ramp", type=float, default=2.0, help="seconds of ramp per run")
    p.add_argument("--bs", default="4k")
    p.add_argument("--iodepth", type=int, default=32)
    p.add_argument("--numjobs", type=int, default=1)
    p.add_argument("--size", default="1g", help="the region read on each drive")
    p.add_argument("--fio", default=shutil.which("fio") or "fio")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--check", action="store_true",
                   help=f"exit 1 unless uring-cmd >= {GOAL} x fio io_uring_cmd on every drive")
    p.add_argument("--quick", action="store_true",
                   help="two rounds of 1 s runs, no ramp, a 64 MiB region: proves it works")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.runtime, a.ramp, a.size = 2, 1.0, 0.0, "64m"
    a.runtime, a.ramp = f"{a.runtime:g}", f"{a.ramp:g}"
    rows, met = bench(a)
    from tabulate import tabulate

    print(tabulate([[r["drive"], r["path"], f"{r['iops']:.0f}",
                     "" if r["p50"] is None else f"{r['p50'] / 1e3:.1f}",
                     "" if r["p99"] is None else f"{r['p99'] / 1e3:.1f}",
                     "" if r["ratio"] is None else f"{r['ratio']:.3f}", r["label"]]
                    for r in rows],
                   headers=["drive", "path", "IOPS (median)", "p50 us", "p99 us",
                            "x fio peer", "note"]))
    if any(r["label"] for r in rows):
        print("emulated: these drives are QEMU's; the numbers are the emulator's, not a drive's")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.check:
        print(f"check: uring-cmd >= {GOAL} x fio io_uring_cmd: {'met' if met else 'MISSED'}")
        return 0 if met else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
