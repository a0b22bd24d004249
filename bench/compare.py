#!/usr/bin/env python3
"""gpufio against its peers, in one run, on targets this script sets up itself.

For each target (a tmpfs file with O_DIRECT, and zram when this host has it) and each CPU
path, run gpufio and fio with the same settings, interleaved and repeated, and print the
median of each with their ratio: IOPS, p50/p99 latency, CPU per I/O. The speed targets live
here (``TARGETS``), never in the unit tests: ``--check`` exits 1 if a ratio misses its target.

    python3 bench/compare.py                       # this machine: 1 job, iodepth 32
    python3 bench/compare.py --numjobs 8 16 --fio .peers/fio --check

CPU per I/O is measured like for like: each run (gpufio's or a peer's) starts in a cgroup of
its own, sampled every few ms, and the CPU charged to it during the tool's measured window
(gpufio's window_unix_ms; fio's last runtime ms before its timestamp_ms) is divided by the
measured I/Os. Kernel threads that work for a tool (io_uring's io-wq and SQPOLL threads) are
created in its cgroup, so they are charged to it, whichever tool it is. Where no cgroup can be
made (not root), each tool's own figure stands in (fio counts only its job threads), and the
run says "cpu": "self".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tabulate import tabulate  # noqa: E402

from gpufio.core import cgroups, pattern, targets  # noqa: E402

# (gpufio engine options, fio options, minimum gpufio/fio IOPS ratio)
PATHS = {
    "psync": ({"engine": "psync"}, ["--ioengine=psync"], None),
    "uring": ({"engine": "uring"}, ["--ioengine=io_uring"], 0.9),
    "uring-sqpoll": ({"engine": "uring", "sqpoll": True},
                     ["--ioengine=io_uring", "--sqthread_poll=1"], 0.9),
    # no storage on either side: gpufio's own loop against fio's (fio's null engine opens no
    # file, so it is told the region's size: the bench file's, SIZE)
    "null": ({"engine": "null"}, ["--ioengine=null", "--size=1g"], None),
}
TARGETS = {1: 0.9, 8: 0.8, 16: 0.8}  # numjobs -> minimum ratio for the io_uring paths
SIZE = 1 << 30


def setup_tmpfs() -> tuple[str, callable]:
    """A pattern file on tmpfs (/dev/shm), which honours O_DIRECT."""
    base = Path("/dev/shm")
    if not base.is_dir():
        raise SystemExit("bench: no /dev/shm tmpfs here")
    path = base / f"gpufio-bench-{os.getpid()}.dat"
    targets.create_file(str(path), SIZE, 7, allow_large=True)
    return str(path), lambda: path.unlink(missing_ok=True)


def setup_zram() -> tuple[str, callable] | None:
    """zram0 sized and filled with the (incompressible) pattern, if it is free to use."""
    dev = Path("/sys/block/zram0")
    if not dev.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    if not dev.exists() or (dev / "disksize").read_text().strip() != "0":
        return None
    try:
        (dev / "disksize").write_text(str(SIZE))
        fd = os.open("/dev/zram0", os.O_WRONLY)
        try:
            for off in range(0, SIZE, targets.FILL_CHUNK):
                os.pwrite(fd, pattern.fill(7, off, targets.FILL_CHUNK), off)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        print(f"bench: zram skipped: {e}", file=sys.stderr)
        return None
    return "/dev/zram0", lambda: (dev / "reset").write_text("1")


def release_zram(mnt: str, control: Path, word: str) -> None:
    """Unmount ``mnt`` and free its zram device (``word`` into ``control``: the device's
    reset, or hot_remove with its number). Just after a tool exits the kernel may still hold
    its files (io_uring tears a ring's registered files down after the process is gone), so
    the unmount and the free are tried again for a few seconds; then the device is left with
    a warning instead of losing the run's table."""
    for _ in range(40):
        gone = subprocess.run(["umount", mnt], capture_output=True).returncode == 0 \
            or not os.path.ismount(mnt)
        try:
            if gone:
                control.write_text(word)
                return
        except OSError:
            pass
        time.sleep(0.25)
    print(f"bench: {mnt} stayed busy; unmount it and write {word} to {control} by hand",
          file=sys.stderr)


def setup_zram_ext4(room: int = 2 * SIZE) -> tuple[str, callable] | None:
    """A pattern file on ext4 on a zram device of its own (``room`` bytes): RAM-backed like
    tmpfs, but a block device with a filesystem, which cuFile's own APIs can register (tmpfs
    they cannot), and where O_DIRECT works."""
    control = Path("/sys/class/zram-control/hot_add")
    if not control.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    if not control.exists():
        return None
    n = control.read_text().strip()
    dev, mnt = f"/dev/zram{n}", Path(f"/tmp/gpufio-zram{n}")
    try:
        Path(f"/sys/block/zram{n}/disksize").write_text(str(room))
        subprocess.run(["mkfs.ext4", "-q", dev], check=True)
        mnt.mkdir(exist_ok=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"bench: zram ext4 skipped: {e}", file=sys.stderr)
        return None
    st = os.stat(dev)
    udev = Path(f"/run/udev/data/b{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    if udev.parent.is_dir() and not udev.exists():  # as bench/gpu_env.sh does for its mounts
        udev.write_text("E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n")
    path = mnt / "gpufio-bench.dat"
    targets.create_file(str(path), SIZE, 7, allow_large=True)

    def clean() -> None:
        release_zram(str(mnt), Path("/sys/class/zram-control/hot_remove"), n)
        udev.unlink(missing_ok=True)

    return str(path), clean


SAMPLE_S = 0.005
_groups = iter(range(1 << 30))


def run_counted(cmd: list[str], **kw) -> tuple[str, list[tuple[float, float]] | None]:
    """Run ``cmd`` to completion in a cgroup of its own; its stdout and the group's CPU
    seconds sampled every SAMPLE_S as (Unix ms, seconds), or None where no group can be made."""
    try:
        group = cgroups.CpuGroup(f"gpufio-bench-{os.getpid()}-{next(_groups)}")
    except OSError:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout, None
    samples: list[tuple[float, float]] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: group.add(os.getpid()), **kw)
    try:
        while proc.poll() is None:
            t = group.times()
            samples.append((time.time() * 1e3, t.usr + t.sys))
            time.sleep(SAMPLE_S)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        group.close([])
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    return out, samples


def window_cpu(samples: list[tuple[float, float]], start_ms: float, end_ms: float) -> float:
    """CPU seconds charged between two wall-clock instants, interpolated between samples."""
    import numpy as np

    t = np.array([s[0] for s in samples])
    cpu = np.array([s[1] for s in samples])
    return float(np.interp(end_ms, t, cpu) - np.interp(start_ms, t, cpu))


def gpufio_counted(profile: str) -> tuple[dict, list[tuple[float, float]] | None]:
    """``gpufio run -f json`` on a profile's text, in a cgroup of its own (run_counted): its
    result document and the group's CPU samples."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(profile)
    try:
        out, samples = run_counted([sys.executable, "-m", "gpufio", "run", f.name, "-f", "json",
                                    "-q"], cwd=Path(__file__).resolve().parent.parent)
    finally:
        os.unlink(f.name)
    return json.loads(out), samples


def gpufio_cpu_s(job: dict, samples: list[tuple[float, float]] | None) -> float | None:
    """CPU seconds a gpufio job's cgroup was charged over its measured window (None: no
    samples)."""
    return window_cpu(samples, *job["window_unix_ms"]) if samples else None


def fio_cpu_s(doc: dict, samples: list[tuple[float, float]] | None,
              runtime_ms: float) -> float | None:
    """CPU seconds fio's cgroup was charged over its measured window: the ``runtime_ms``
    before it wrote its report (timestamp_ms). None: no samples."""
    end = doc["timestamp_ms"]
    return window_cpu(samples, end - runtime_ms, end) if samples else None


def run_gpufio(target: str, opts: dict, numjobs: int, iodepth: int, runtime: int) -> dict:
    """One gpufio run's headline numbers; ``target``: a path, or several joined with ':'
    (fio's filename syntax), I/Os spread over them round-robin."""
    prof = {"rw": "randread", "bs": "4k", "targets": target.split(":"), "numjobs": numjobs,
            "iodepth": iodepth, "runtime": f"{runtime}s", "time_based": True,
            "ramp_time": "1s", "concurrent": False, **opts}
    doc, samples = gpufio_counted("\n".join(["[global]"] + [f"{k} = {json.dumps(v)}"
                                                            for k, v in prof.items()]) + "\n")
    job = doc["jobs"][0]
    rd = job["write" if job["write"]["total_ios"] > job["read"]["total_ios"] else "read"]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    cpu_us, how = job["cpu_us_per_io"], "self"
    if (cpu_s := gpufio_cpu_s(job, samples)) is not None and ios:
        cpu_us, how = 1e6 * cpu_s / ios, "cgroup"
    return {"iops": rd["iops"], "p50": rd["lat_ns"]["percentile"]["50.000000"],
            "p99": rd["lat_ns"]["percentile"]["99.000000"], "cpu_us": cpu_us, "cpu": how,
            "mode": job.get("engine_facts", {}).get("mode"),
            "sq_thread_busy": job.get("engine_facts", {}).get("sq_thread_busy"),
            "gpu_price": job.get("engine_facts", {}).get("gpu_price")}


def run_fio(fio: str, target: str, opts: list[str], numjobs: int, iodepth: int,
            runtime: int) -> dict:
    cmd = [fio, "--name=bench", f"--filename={target}", "--rw=randread", "--bs=4k",
           "--direct=1", f"--numjobs={numjobs}", f"--iodepth={iodepth}", f"--runtime={runtime}",
           "--time_based", "--ramp_time=1", "--group_reporting", "--output-format=json",
           "--lat_percentiles=1", *opts]
    out, samples = run_counted(cmd)
    doc = json.loads(out)
    job = doc["jobs"][0]
    rd = job["write" if job["write"]["total_ios"] > job["read"]["total_ios"] else "read"]
    pct = rd["lat_ns"]["percentile"]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    if (cpu_s := fio_cpu_s(doc, samples, rd["runtime"])) is not None and ios:
        how = "cgroup"
    else:
        # with group_reporting fio's usr_cpu/sys_cpu are the average of the group's jobs
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * rd["runtime"] / 1000 * numjobs
        how = "self"
    return {"iops": rd["iops"], "p50": pct["50.000000"], "p99": pct["99.000000"],
            "cpu_us": 1e6 * cpu_s / ios if ios else 0.0, "cpu": how}


# the columns of the GPU benches' tables (bench/gpu.py, bench/writes.py)
CASE_HEADERS = ["target", "gpufio path", "jobs x qd", "gpufio IOPS", "GB/s", "peer",
                "peer IOPS", "ratio", "p50 us g/p", "p99 us g/p", "CPU us/IO g/p", "goal"]


def case_row(tname: str, c: dict, jobs_qd: str, peer: str, bs: int, g_runs: list[dict],
             p_runs: list[dict], missed: list[str], raw: list[dict]) -> list:
    """One case of a GPU bench: the medians of its runs, the verdict of its goals (``goal``:
    ratio, ``abs_goal``: IOPS, ``bw_goal``: bytes/s; a miss is added to ``missed``), its runs
    added to ``raw``, and its CASE_HEADERS row."""
    g, p = ({k: statistics.median(r[k] for r in runs) for k in ("iops", "p50", "p99", "cpu_us")}
            for runs in (g_runs, p_runs))
    ratio = g["iops"] / p["iops"] if p["iops"] else 0.0
    verdict = []
    if c.get("goal") is not None and ratio < c["goal"]:
        verdict.append(f"MISS ratio<{c['goal']}")
    if c.get("abs_goal") and g["iops"] < c["abs_goal"]:
        verdict.append(f"MISS <{c['abs_goal'] / 1e6:g}M IOPS")
    if c.get("bw_goal") and g["iops"] * bs < c["bw_goal"]:
        verdict.append(f"MISS <{c['bw_goal'] / 1e9:g} GB/s")
    if verdict:
        missed.append(f"{tname} {c['path']}: {', '.join(verdict)}")
    elif c.get("goal") is not None or c.get("abs_goal") or c.get("bw_goal"):
        verdict.append("ok")
    label = c["path"] + (f" ({g_runs[0]['mode']})" if g_runs[0].get("mode") else "")
    raw.append({"target": tname, "path": c["path"], "gpufio": g_runs, "peer": peer,
                "peer_runs": p_runs})
    print(f"bench: {tname} {c['path']}: gpufio {g['iops']:.0f} peer {p['iops']:.0f} "
          f"ratio {ratio:.2f}", file=sys.stderr, flush=True)
    return [tname, label, jobs_qd, round(g["iops"]), f"{g['iops'] * bs / 1e9:.2f}", peer,
            round(p["iops"]), f"{ratio:.2f}", f"{g['p50'] / 1e3:.0f}/{p['p50'] / 1e3:.0f}",
            f"{g['p99'] / 1e3:.0f}/{p['p99'] / 1e3:.0f}", f"{g['cpu_us']:.2f}/{p['cpu_us']:.2f}",
            " ".join(verdict)]


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def fio_and_root_args(ap: argparse.ArgumentParser, fio_help: str, runtime: int,
                      repeat: int) -> None:
    """The options of the GPU machine's benches that run fio and may use a root-disk file."""
    ap.add_argument("--fio", required=True, help=fio_help)
    ap.add_argument("--runtime", type=int, default=runtime, help="measured seconds per run")
    ap.add_argument("--repeat", type=int, default=repeat, help="runs per tool; medians are reported")
    ap.add_argument("--root-dir", default=str(Path.home()), help="where the root-disk file goes")
    ap.add_argument("--root-size", default="4g", help="size of the root-disk file")


def clean_up_on_sigterm() -> None:
    """timeout(1) and batch systems stop a bench with SIGTERM: leave through the finally
    blocks, so its zram devices, mounts and files are released as after Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


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
    fio_version = subprocess.run([args.fio, "--version"], capture_output=True, text=True).stdout.strip()
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
                        f_runs.append(run_fio(args.fio, target, f_opts, numjobs, depth, args.runtime))
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
    return report(f"{fio_version} · 4 KiB randread, O_DIRECT, {args.runtime}s runs, median of "
                  f"{args.repeat}", rows,
                  ["target", "path", "jobs", "qd", "gpufio IOPS", "fio IOPS", "ratio",
                   "p50 us g/f", "p99 us g/f", "CPU us/IO g/f", "target"],
                  {"fio": fio_version, "runs": raw}, args.json, missed if args.check else [])


def report(settings: str, rows: list, headers: list[str], raw: dict, json_path: str | None,
           missed: list[str]) -> int:
    """Print the dated header line and the ratio table, save the raw runs; 1 if a goal in
    ``missed`` (only passed with --check) was not met."""
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} · {platform.node()} · {os.cpu_count()} cores · "
          f"kernel {platform.release()} · {settings}")
    print(tabulate(rows, headers=headers, tablefmt="github"))
    if json_path:
        Path(json_path).write_text(json.dumps(raw, indent=2))
    if missed:
        print("bench: goals missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
