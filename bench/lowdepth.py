#!/usr/bin/env python3
"""gpufio against fio at low queue depth: issue 32's matrix as one command.

4 KiB random reads, O_DIRECT, on a tmpfs file and a root-disk file: uring at iodepth 1, 4,
32 and 128, psync at numjobs 1 and 2, and the null engine at iodepth 1. gpufio and fio run
interleaved, ``--rounds`` short rounds (each case's pair back to back, the order swapped
every round: A B, B A, ...), so that a VM whose speed drifts from minute to minute moves
both tools of a pair alike; the IOPS ratio is the median of the rounds' own ratios (each
gpufio run against the fio run beside it), the other columns are medians: p50/p99
latency against fio's ``lat`` (from just before the submitting call to just after the
reaping one, as gpufio's), and CPU per I/O counted the same way for both: each run starts in a cpuacct
cgroup of its own, sampled every few ms, and the CPU charged during the tool's measured
window (gpufio's window_unix_ms; fio's last runtime ms before its timestamp_ms), io_uring's
io-wq threads included, is divided by its I/Os. Without a cgroup (not root) each tool's own
figure stands in (fio's counts its job thread only) and the table says "self".
``--check`` exits 1 if a goal (``GOALS``) is missed; ``--quick`` runs every case once for a
second, to prove the bench works, and its numbers are no measurement.

    python3 -m bench.lowdepth --check                 # the full matrix, 7 rounds of 2 s
    python3 -m bench.lowdepth --quick                 # a smoke run
    python3 -m bench.lowdepth --root-dir /mnt/x --json out.json

Self-contained: it drives ``python3 -m gpufio`` (from this checkout) and fio as commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# (case, engine, iodepth, numjobs, targets it runs on)
CASES = [("uring qd1", "uring", 1, 1), ("uring qd4", "uring", 4, 1),
         ("uring qd32", "uring", 32, 1), ("uring qd128", "uring", 128, 1),
         ("psync nj1", "psync", 1, 1), ("psync nj2", "psync", 1, 2)]
NULL_CASE = ("null qd1", "null", 1, 1)
FIO_ENGINE = {"uring": "io_uring", "psync": "psync", "null": "null"}
# the issue's goals: IOPS ratio at least; at depth 1 latency within max(1 us, 5 %) of
# fio's; CPU per I/O at depth 1 at most 1.2x fio's; null at least half fio null's rate
IOPS_RATIO, NULL_RATIO, CPU_RATIO, LAT_ABS_NS, LAT_REL = 0.95, 0.5, 1.2, 1000, 0.05


def make_file(path: Path, size: int) -> None:
    """``size`` bytes of data (not a sparse file: reads must reach the device)."""
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/unified"),
                Path("/sys/fs/cgroup"))
SAMPLE_S = 0.005
_serial = iter(range(1 << 30))


def _group() -> tuple[Path, callable] | None:
    """A fresh CPU-accounting cgroup (v1 cpuacct or v2) and its reader of CPU seconds."""
    for root in CGROUP_ROOTS:
        v1 = (root / "cpuacct.usage").exists()
        if not v1 and not (root / "cpu.stat").exists():
            continue
        group = root / f"gpufio-lowdepth-{os.getpid()}-{next(_serial)}"
        try:
            group.mkdir()
        except OSError:
            continue
        if v1:
            return group, lambda: int((group / "cpuacct.usage").read_text()) / 1e9
        return group, lambda: int((group / "cpu.stat").read_text().split()[1]) / 1e6
    return None


def run_counted(cmd: list[str], **kw) -> tuple[str, list[tuple[float, float]] | None]:
    """Run ``cmd`` in a cgroup of its own; its stdout and the group's CPU seconds sampled
    every SAMPLE_S as (Unix ms, seconds), or None where no group can be made."""
    made = _group()
    if made is None:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout, None
    group, cpu = made
    procs = group / "cgroup.procs"
    samples: list[tuple[float, float]] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: procs.write_text(str(os.getpid())), **kw)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            samples.append((time.time() * 1e3, cpu()))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate()
    finally:
        done.set()
        sampler.join()
        for _ in range(200):  # the group empties once the kernel has reaped every thread
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.01)
    if proc.returncode:
        raise SystemExit(f"bench: {' '.join(cmd)} exited {proc.returncode}: {err.strip()}")
    return out, samples


def window_cpu(samples: list[tuple[float, float]] | None, start_ms: float,
               end_ms: float) -> float | None:
    """CPU seconds charged between two wall-clock instants, interpolated between samples."""
    if not samples or len(samples) < 2:
        return None

    def at(t: float) -> float:
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return samples[0][1] if t < samples[0][0] else samples[-1][1]
    return at(end_ms) - at(start_ms)


def run_gpufio(engine: str, target: str, qd: int, numjobs: int, runtime: float,
               ramp: float) -> dict:
    """One gpufio run (``python3 -m gpufio run -f json``) of a case; its headline numbers."""
    prof = {"engine": engine, "targets": [target], "rw": "randread", "bs": "4k",
            "iodepth": qd, "numjobs": numjobs, "runtime": f"{runtime}s", "time_based": True,
            "ramp_time": f"{ramp}s", "direct": True}
    text = "[global]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in prof.items()) \
        + '[[job]]\nname = "case"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        out, samples = run_counted([sys.executable, "-m", "gpufio", "run", f.name, "-f", "json",
                                    "-q"], cwd=REPO)
    finally:
        os.unlink(f.name)
    job = json.loads(out)["jobs"][0]
    rd, pct = job["read"], job["read"]["lat_ns"]["percentile"]
    cpu_s = window_cpu(samples, *job["window_unix_ms"])
    cpu_us = 1e6 * cpu_s / rd["total_ios"] if cpu_s is not None and rd["total_ios"] else None
    return {"iops": rd["iops"], "p50": pct["50.000000"], "p99": pct["99.000000"],
            "cpu_us": job["cpu_us_per_io"] if cpu_us is None else cpu_us,
            "cpu": "self" if cpu_us is None else "cgroup",
            "loop": job["engine_facts"].get("loop", "")}


def run_fio(fio: str, engine: str, target: str, qd: int, numjobs: int, runtime: float,
            ramp: float) -> dict:
    """The same case through fio; ``lat`` percentiles (submission to completion)."""
    where = ["--size=1g"] if engine == "null" else [f"--filename={target}", "--direct=1"]
    cmd = [fio, "--name=case", f"--ioengine={FIO_ENGINE[engine]}", *where, "--rw=randread",
           "--bs=4k", f"--iodepth={qd}", f"--numjobs={numjobs}", f"--runtime={runtime}",
           "--time_based", f"--ramp_time={ramp}", "--group_reporting", "--lat_percentiles=1",
           "--output-format=json"]
    out, samples = run_counted(cmd)
    doc = json.loads(out)
    job = doc["jobs"][0]
    rd = job["read"]
    pct = rd["lat_ns"]["percentile"]
    cpu_s = window_cpu(samples, doc["timestamp_ms"] - rd["runtime"], doc["timestamp_ms"])
    how = "cgroup"
    if cpu_s is None:
        # with group_reporting fio's usr_cpu/sys_cpu are the average of the group's jobs
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * rd["runtime"] / 1000 * numjobs
        how = "self"
    return {"iops": rd["iops"], "p50": pct["50.000000"], "p99": pct["99.000000"],
            "cpu_us": 1e6 * cpu_s / rd["total_ios"] if rd["total_ios"] else 0.0, "cpu": how}


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("iops", "p50", "p99", "cpu_us")}


def paired_ratio(gpufio: list[dict], fio: list[dict]) -> float:
    """The median of each round's gpufio IOPS over the fio IOPS of the same round: a pair
    ran back to back, so drift between rounds cancels out of its ratio."""
    return statistics.median(g["iops"] / f["iops"] if f["iops"] else 0.0
                             for g, f in zip(gpufio, fio))


def verdict(case: str, g: dict, f: dict, ratio: float) -> list[str]:
    """The goals this case misses (empty: none); ``ratio``: its IOPS ratio."""
    miss = []
    floor = NULL_RATIO if case.startswith("null") else IOPS_RATIO
    if ratio < floor:
        miss.append(f"IOPS {ratio:.2f}x < {floor}x")
    if case.endswith("qd1") or case == "psync nj1":
        if g["cpu_us"] > CPU_RATIO * f["cpu_us"]:
            miss.append(f"CPU/IO {g['cpu_us']:.2f} > {CPU_RATIO}x {f['cpu_us']:.2f} us")
        if not case.startswith("null"):
            for p in ("p50", "p99"):
                if abs(g[p] - f[p]) > max(LAT_ABS_NS, LAT_REL * f[p]):
                    miss.append(f"{p} {g[p] / 1e3:.1f} vs {f[p] / 1e3:.1f} us")
    return miss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", default=shutil.which("fio"), help="fio binary (default: on PATH)")
    ap.add_argument("--rounds", type=int, default=7,
                    help="interleaved rounds (at least 3); medians reported")
    ap.add_argument("--runtime", type=float, default=2.0, help="measured seconds per run")
    ap.add_argument("--ramp", type=float, default=0.5, help="ramp seconds per run")
    ap.add_argument("--size-mb", type=int, default=1024, help="size of each target file")
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--root-dir", default=str(Path.home()), help="where the root-disk file goes")
    ap.add_argument("--quick", action="store_true",
                    help="one round of 1 s runs on 64 MiB files: proves the bench runs")
    ap.add_argument("--cases", nargs="+", default=[],
                    help="run only the cases whose name contains one of these (e.g. qd1 nj1)")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    if not args.fio:
        raise SystemExit("bench: fio not found (apt-get install fio, or pass --fio PATH)")
    if args.quick:
        args.rounds, args.runtime, args.ramp, args.size_mb = 1, 1.0, 0.2, 64
    elif args.rounds < 3:
        raise SystemExit("bench: --rounds must be at least 3 (the goals are medians of 3 or "
                         "more); --quick is the smoke run")
    files = {"tmpfs": Path(args.tmpfs_dir) / f"gpufio-lowdepth-{os.getpid()}.dat",
             "root disk": Path(args.root_dir) / f"gpufio-lowdepth-{os.getpid()}.dat"}
    runs: dict[tuple[str, str], dict[str, list[dict]]] = {}
    try:
        for path in files.values():
            make_file(path, args.size_mb << 20)
        matrix = [(t, c) for t in files for c in CASES] + [("tmpfs", NULL_CASE)]
        matrix = [(t, c) for t, c in matrix if not args.cases or any(k in c[0] for k in args.cases)]
        for rnd in range(args.rounds):
            for target, (case, engine, qd, nj) in matrix:
                tools = [("gpufio", lambda: run_gpufio(engine, str(files[target]), qd, nj,
                                                       args.runtime, args.ramp)),
                         ("fio", lambda: run_fio(args.fio, engine, str(files[target]), qd, nj,
                                                 args.runtime, args.ramp))]
                for name, go in tools if rnd % 2 == 0 else tools[::-1]:
                    runs.setdefault((target, case), {}).setdefault(name, []).append(go())
                print(f"bench: round {rnd + 1}/{args.rounds} {target} {case}", file=sys.stderr,
                      flush=True)
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)
    head = (f"{'target':10} {'case':12} {'gpufio':>9} {'fio':>9} {'ratio':>6} "
            f"{'p50 us g/f':>12} {'p99 us g/f':>12} {'CPU us/IO g/f':>14} {'cpu':6} goals")
    print(head)
    missed = []
    for (target, case), by in runs.items():
        g, f = medians(by["gpufio"]), medians(by["fio"])
        ratio = paired_ratio(by["gpufio"], by["fio"])
        miss = verdict(case, g, f, ratio)
        missed += [f"{target} {case}: {m}" for m in miss]
        print(f"{target:10} {case:12} {g['iops']:9.0f} {f['iops']:9.0f} "
              f"{ratio:6.2f} {g['p50'] / 1e3:5.1f}/{f['p50'] / 1e3:<6.1f} "
              f"{g['p99'] / 1e3:5.1f}/{f['p99'] / 1e3:<6.1f} "
              f"{g['cpu_us']:6.2f}/{f['cpu_us']:<7.2f} {by['fio'][0]['cpu']:6} "
              f"{'; '.join(miss) or 'ok'}")
    fio_version = subprocess.run([args.fio, "--version"], capture_output=True,
                                 text=True).stdout.strip()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{fio_version}, {args.rounds} round(s) of {args.runtime:g} s, medians (ratio: of "
          "the rounds' own ratios)"
          + (" (--quick: not a measurement)" if args.quick else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"target": t, "case": c, **by} for (t, c), by in runs.items()], indent=1))
    if args.check and missed:
        print("bench: goals missed:\n  " + "\n  ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
