#!/usr/bin/env python3
"""gpufio against fio at low queue depth: the whole matrix as one command.

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
second, to prove the bench works, and its numbers are no measurement. The ``sleeps/IO``
column counts, over the same window, the voluntary context switches of each tool's own
threads (io-wq and SQPOLL kernel threads left out) per I/O: how often the submitting thread
waited for a completion. ``--fio-args`` and ``--set`` vary either side (say fio with
``--gtod_reduce=1``, or gpufio with ``iodepth_batch_submit=0``), to see what moves a cell.
``--cpus`` pins both tools (every process and thread they start, io-wq workers included) to
the same CPUs, the bench and its sampler left out: on a 2-vCPU VM, where a tool's thread and
its io-wq worker land decides the qd-1 latency from run to run.

    python3 -m bench.lowdepth --check                 # the full matrix, 7 rounds of 2 s
    python3 -m bench.lowdepth --quick                 # a smoke run
    python3 -m bench.lowdepth --root-dir /mnt/x --json out.json
    python3 -m bench.lowdepth --cases "uring qd4" --fio-args=--gtod_reduce=1
    python3 -m bench.lowdepth --check --cpus 1         # both tools on CPU 1

Self-contained: it drives ``python3 -m gpufio`` (from this checkout) and fio as commands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._common import clean_up_on_sigterm

REPO = Path(__file__).resolve().parent.parent
# (case, engine, iodepth, numjobs, targets it runs on)
CASES = [("uring qd1", "uring", 1, 1), ("uring qd4", "uring", 4, 1),
         ("uring qd32", "uring", 32, 1), ("uring qd128", "uring", 128, 1),
         ("psync nj1", "psync", 1, 1), ("psync nj2", "psync", 1, 2)]
NULL_CASE = ("null qd1", "null", 1, 1)
FIO_ENGINE = {"uring": "io_uring", "psync": "psync", "null": "null"}
# the goals: IOPS ratio at least; at depth 1 latency within max(1 us, 5 %) of
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
SLEEPS_EVERY = 10
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


def own_sleeps(group: Path, seen: dict[str, int]) -> int:
    """Voluntary context switches so far of the group's threads, io_uring's kernel threads
    (io-wq workers, SQPOLL) left out: each is a wait of the tool's own (for a completion,
    mostly). ``seen`` keeps each thread's last count, so a thread that has exited still
    counts and the total never falls."""
    listing = group / ("tasks" if (group / "tasks").exists() else "cgroup.threads")
    for tid in listing.read_text().split():
        try:
            if Path(f"/proc/{tid}/comm").read_text().startswith("iou-"):
                continue
            for line in Path(f"/proc/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    seen[tid] = int(line.split()[1])
        except OSError:
            continue  # the thread ended between the listing and its files
    return sum(seen.values())


def run_counted(cmd: list[str], cpus: frozenset[int] | None = None,
                **kw) -> tuple[str, list[tuple[float, float, int | None]] | None]:
    """Run ``cmd`` (on ``cpus`` only, where given) in a cgroup of its own; its stdout and
    samples of (Unix ms, the group's CPU seconds, its threads' own sleeps (``own_sleeps``)):
    CPU every SAMPLE_S, sleeps every SLEEPS_EVERY samples (reading /proc for each thread
    costs more; None in the others); None where no group can be made."""
    made = _group()

    def pin() -> None:  # in the child, before the exec: all it starts inherits the mask
        if cpus:
            os.sched_setaffinity(0, cpus)
    if made is None:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=pin,
                              **kw).stdout, None
    group, cpu = made
    procs = group / "cgroup.procs"
    samples: list[tuple[float, float, int | None]] = []

    def start() -> None:
        procs.write_text(str(os.getpid()))
        pin()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=start, **kw)
    done = threading.Event()

    def sample() -> None:
        n, seen = 0, {}
        while not done.wait(SAMPLE_S):
            sleeps = own_sleeps(group, seen) if n % SLEEPS_EVERY == 0 else None
            n += 1
            samples.append((time.time() * 1e3, cpu(), sleeps))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:  # the bench is leaving (Ctrl-C, SIGTERM): the tool goes too
            proc.kill()
            proc.wait()
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


def window(samples: list[tuple[float, ...]] | None, start_ms: float, end_ms: float,
           column: int = 1) -> float | None:
    """How much a sampled counter (``column`` of the samples: 1 CPU seconds, 2 sleeps) grew
    between two wall-clock instants, interpolated between the samples that read it (None
    in a sample: not read then)."""
    samples = [s for s in samples or () if s[column] is not None]
    if len(samples) < 2:
        return None

    def at(t: float) -> float:
        for a, b in zip(samples, samples[1:]):
            if a[0] <= t <= b[0]:
                return a[column] + (b[column] - a[column]) * (
                    (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else 0.0)
        return samples[0][column] if t < samples[0][0] else samples[-1][column]
    return at(end_ms) - at(start_ms)


def per_io(samples: list[tuple[float, ...]] | None, start_ms: float, end_ms: float,
           ios: int) -> tuple[float | None, float | None]:
    """CPU us per I/O and own sleeps per I/O over the measured window (None: not counted)."""
    if not ios:
        return None, None
    cpu_s, sleeps = (window(samples, start_ms, end_ms, c) for c in (1, 2))
    return (None if cpu_s is None else 1e6 * cpu_s / ios,
            None if sleeps is None else sleeps / ios)


def run_gpufio(engine: str, target: str, qd: int, numjobs: int, runtime: float,
               ramp: float, extra: dict | None = None,
               cpus: frozenset[int] | None = None) -> dict:
    """One gpufio run (``python3 -m gpufio run -f json``) of a case; its headline numbers.
    ``extra``: more profile keys (``--set``); ``cpus``: the CPUs it runs on (``--cpus``)."""
    prof = {"engine": engine, "targets": [target], "rw": "randread", "bs": "4k",
            "iodepth": qd, "numjobs": numjobs, "runtime": f"{runtime}s", "time_based": True,
            "ramp_time": f"{ramp}s", "direct": True, **(extra or {})}
    text = "[global]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in prof.items()) \
        + '[[job]]\nname = "case"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        out, samples = run_counted([sys.executable, "-m", "gpufio", "run", f.name, "-f", "json",
                                    "-q"], cpus, cwd=REPO)
    finally:
        os.unlink(f.name)
    job = json.loads(out)["jobs"][0]
    rd, pct = job["read"], job["read"]["lat_ns"]["percentile"]
    cpu_us, sleeps = per_io(samples, *job["window_unix_ms"], rd["total_ios"])
    return {"iops": rd["iops"], "p50": pct["50.000000"], "p99": pct["99.000000"],
            "cpu_us": job["cpu_us_per_io"] if cpu_us is None else cpu_us,
            "cpu": "self" if cpu_us is None else "cgroup", "sleeps": sleeps,
            "loop": job["engine_facts"].get("loop", "")}


def run_fio(fio: str, engine: str, target: str, qd: int, numjobs: int, runtime: float,
            ramp: float, extra: list[str] | None = None,
            cpus: frozenset[int] | None = None) -> dict:
    """The same case through fio; ``lat`` percentiles (submission to completion).
    ``extra``: more fio options (``--fio-args``), after the case's own; ``cpus``: as
    run_gpufio's."""
    where = ["--size=1g"] if engine == "null" else [f"--filename={target}", "--direct=1"]
    cmd = [fio, "--name=case", f"--ioengine={FIO_ENGINE[engine]}", *where, "--rw=randread",
           "--bs=4k", f"--iodepth={qd}", f"--numjobs={numjobs}", f"--runtime={runtime}",
           "--time_based", f"--ramp_time={ramp}", "--group_reporting", "--lat_percentiles=1",
           "--output-format=json", *(extra or [])]
    out, samples = run_counted(cmd, cpus)
    doc = json.loads(out)
    job = doc["jobs"][0]
    rd = job["read"]
    # no percentiles where the fio options turn latency off (gtod_reduce, disable_lat)
    pct = rd["lat_ns"].get("percentile", {})
    cpu_us, sleeps = per_io(samples, doc["timestamp_ms"] - rd["runtime"], doc["timestamp_ms"],
                            rd["total_ios"])
    how = "cgroup"
    if cpu_us is None:
        # with group_reporting fio's usr_cpu/sys_cpu are the average of the group's jobs
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * rd["runtime"] / 1000 * numjobs
        cpu_us = 1e6 * cpu_s / rd["total_ios"] if rd["total_ios"] else 0.0
        how = "self"
    return {"iops": rd["iops"], "p50": pct.get("50.000000"), "p99": pct.get("99.000000"),
            "cpu_us": cpu_us, "cpu": how, "sleeps": sleeps}


def medians(runs: list[dict]) -> dict:
    """Each column's median over the rounds that have it (None: none has)."""
    out = {}
    for k in ("iops", "p50", "p99", "cpu_us", "sleeps"):
        have = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(have) if have else None
    return out


def cpu_list(text: str) -> frozenset[int]:
    """A ``--cpus`` argument as taskset -c reads one (``1``, ``0,2``, ``0-3``): CPUs this
    process may run on."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi if sep else lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CPUs as 1, 0,2 or 0-3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not CPUs this process may use ({sorted(allowed)})")
    return frozenset(cpus)


def setting(text: str) -> tuple[str, object]:
    """A ``--set`` argument, KEY=VALUE, with VALUE read as a TOML scalar would be: true or
    false, a finite number, else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        scalar = json.loads(value)
    except ValueError:
        return key, value
    if isinstance(scalar, (bool, int)) or (isinstance(scalar, float) and math.isfinite(scalar)):
        return key, scalar
    return key, value


def paired_ratio(gpufio: list[dict], fio: list[dict]) -> float:
    """The median of each round's gpufio IOPS over the fio IOPS of the same round: a pair
    ran back to back, so drift between rounds cancels out of its ratio."""
    return statistics.median(g["iops"] / f["iops"] if f["iops"] else 0.0
                             for g, f in zip(gpufio, fio))


def pair(g: dict, f: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    """A "gpufio/fio" column of medians, or "-" where either tool has none."""
    if g[key] is None or f[key] is None:
        return "-"
    return f"{format(g[key] / scale, fmt)}/{format(f[key] / scale, fmt)}"


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
                if g[p] is None or f[p] is None:
                    continue  # fio's options turned its latency off (--fio-args)
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
    ap.add_argument("--fio-args", default="", metavar="ARGS",
                    help="more fio options for every fio run, as one string "
                         "(e.g. --fio-args=--gtod_reduce=1)")
    ap.add_argument("--control", action="store_true",
                    help="an A/A run: fio in the gpufio column too, judged by the same goals "
                         "(what this machine's own noise does to them)")
    ap.add_argument("--set", type=setting, action="append", default=[], metavar="KEY=VALUE",
                    help="one more profile key for every gpufio run (repeatable; e.g. "
                         "--set iodepth_batch_submit=0)")
    ap.add_argument("--cpus", type=cpu_list, metavar="LIST",
                    help="run both tools on these CPUs only (as taskset -c: 1, 0,2, 0-3); "
                         "the bench itself stays unpinned")
    args = ap.parse_args()
    try:
        fio_extra = shlex.split(args.fio_args)
    except ValueError as e:  # an unclosed quote: a usage error, not a traceback
        ap.error(f"argument --fio-args: {e}")
    gpufio_extra = dict(args.set)
    if args.control and gpufio_extra:
        ap.error("argument --set: --control runs no gpufio")
    if not args.fio:
        raise SystemExit("bench: fio not found (apt-get install fio, or pass --fio PATH)")
    if args.quick:
        args.rounds, args.runtime, args.ramp, args.size_mb = 1, 1.0, 0.2, 64
    elif args.rounds < 3:
        raise SystemExit("bench: --rounds must be at least 3 (the goals are medians of 3 or "
                         "more); --quick is the smoke run")
    clean_up_on_sigterm()  # a SIGTERM leaves through the finally below: no 1 GiB file left
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
                def fio() -> dict:
                    return run_fio(args.fio, engine, str(files[target]), qd, nj,
                                   args.runtime, args.ramp, fio_extra, args.cpus)

                def gpufio() -> dict:
                    return run_gpufio(engine, str(files[target]), qd, nj, args.runtime,
                                      args.ramp, gpufio_extra, args.cpus)

                tools = [("gpufio", fio if args.control else gpufio), ("fio", fio)]
                for name, go in tools if rnd % 2 == 0 else tools[::-1]:
                    runs.setdefault((target, case), {}).setdefault(name, []).append(go())
                print(f"bench: round {rnd + 1}/{args.rounds} {target} {case}", file=sys.stderr,
                      flush=True)
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)
    head = (f"{'target':10} {'case':12} {'gpufio':>9} {'fio':>9} {'ratio':>6} "
            f"{'p50 us g/f':>12} {'p99 us g/f':>12} {'CPU us/IO g/f':>14} {'cpu':6} "
            f"{'sleeps/IO g/f':>13} goals")
    print(head)
    missed = []
    for (target, case), by in runs.items():
        g, f = medians(by["gpufio"]), medians(by["fio"])
        ratio = paired_ratio(by["gpufio"], by["fio"])
        miss = verdict(case, g, f, ratio)
        missed += [f"{target} {case}: {m}" for m in miss]
        print(f"{target:10} {case:12} {g['iops']:9.0f} {f['iops']:9.0f} "
              f"{ratio:6.2f} {pair(g, f, 'p50', '.1f', 1e3):>12} "
              f"{pair(g, f, 'p99', '.1f', 1e3):>12} {pair(g, f, 'cpu_us', '.2f'):>14} "
              f"{by['fio'][0]['cpu']:6} {pair(g, f, 'sleeps', '.3f'):>13} "
              f"{'; '.join(miss) or 'ok'}")
    fio_version = subprocess.run([args.fio, "--version"], capture_output=True,
                                 text=True).stdout.strip()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{fio_version}, {args.rounds} round(s) of {args.runtime:g} s, medians (ratio: of "
          "the rounds' own ratios)"
          + (" (--quick: not a measurement)" if args.quick else "")
          + ("\n--control: the gpufio column is fio too (an A/A run)" if args.control else "")
          + (f"\n--cpus: both tools on CPUs {','.join(map(str, sorted(args.cpus)))}"
             if args.cpus else ""))
    if fio_extra or gpufio_extra:
        print(f"varied: fio {' '.join(fio_extra) or '(as the case)'}; gpufio "
              f"{', '.join(f'{k} = {v!r}' for k, v in gpufio_extra.items()) or '(as the case)'}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"target": t, "case": c, "fio_args": fio_extra, "gpufio_set": gpufio_extra,
              "control": args.control,
              "cpus": sorted(args.cpus) if args.cpus else None, **by}
             for (t, c), by in runs.items()], indent=1))
    if args.check and missed:
        print("bench: goals missed:\n  " + "\n  ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
