"""What every bench shares: gpufio run through gpufio.api (a fresh interpreter per run), the
peers (fio, KvikIO) run with their CPU counted in a cgroup of their own, the RAM-backed
targets a bench sets up and releases (tmpfs, a zram device, ext4 on zram), and the report:
a dated header line and a table drawn by gpufio's one renderer.

A bench imports gpufio only through ``gpufio.api`` (tests/test_architecture.py keeps it so)
and is run from the repository root as ``python3 -m bench.NAME``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from gpufio import api

SIZE = 1 << 30
FILL_CHUNK = 64 << 20
SAMPLE_S = 0.005
_groups = iter(range(1 << 30))


class GpufioFailed(Exception):
    """A gpufio run that ended without a document; the text is gpufio's own error line."""


def _run_child(profile: dict[str, Any], conn: Any) -> None:
    try:
        conn.send(("ok", api.run(profile)))
    except Exception as e:  # the parent reports it as the run's failure
        conn.send(("error", f"{type(e).__name__}: {e}" if not isinstance(
            e, (api.BadInput, api.RunFailed)) else str(e)))


def gpufio(profile: dict[str, Any]) -> dict[str, Any]:
    """The result document of ``profile`` (its TOML tables as a dict), run by gpufio.api in
    an interpreter of its own: each run gets a fresh CUDA context (an MPS client when the
    daemon runs), memory and page-cache state, as ``gpufio run`` would. GpufioFailed with
    gpufio's error when the run leaves no document."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run_child, args=(profile, theirs), name="gpufio")
    proc.start()
    theirs.close()
    try:
        kind, value = mine.recv()
    except EOFError:
        proc.join()
        raise GpufioFailed(f"gpufio died (exit {proc.exitcode})") from None
    proc.join()
    if kind == "error":
        raise GpufioFailed(value)
    return value


def cgroup_cpu() -> bool:
    """Whether a cgroup whose CPU use is read can be made here (root, a cgroupfs): then
    gpufio counts its own (``cpu_accounting = "cgroup"``) and the peers' are counted alike."""
    try:
        api.CpuGroup(f"gpufio-bench-{os.getpid()}-probe").close([])
    except OSError:
        return False
    return True


def run_counted(cmd: list[str], **kw: Any) -> tuple[str, list[tuple[float, float]] | None]:
    """Run a peer's ``cmd`` to completion in a cgroup of its own: its stdout and the group's
    CPU seconds sampled every SAMPLE_S as (Unix ms, seconds), or None where no group can be
    made. Kernel threads working for it (io-wq, SQPOLL) are charged to the group too."""
    try:
        group = api.CpuGroup(f"gpufio-bench-{os.getpid()}-{next(_groups)}")
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


def fio_cpu_s(doc: dict, samples: list[tuple[float, float]] | None,
              runtime_ms: float) -> float | None:
    """CPU seconds fio's cgroup was charged over its measured window: the ``runtime_ms``
    before it wrote its report (timestamp_ms). None: no samples."""
    end = doc["timestamp_ms"]
    return window_cpu(samples, end - runtime_ms, end) if samples else None


def run_gpufio(target: str, opts: dict, numjobs: int, iodepth: int, runtime: int) -> dict:
    """One gpufio block run's headline numbers; ``target``: a path, or several joined with
    ':' (fio's filename syntax), I/Os spread over them round-robin."""
    prof = {"rw": "randread", "bs": "4k", "targets": target.split(":"), "numjobs": numjobs,
            "iodepth": iodepth, "runtime": f"{runtime}s", "time_based": True,
            "ramp_time": "1s", "concurrent": False, **opts}
    if cgroup_cpu():
        prof["cpu_accounting"] = "cgroup"
    job = gpufio({"global": prof})["jobs"][0]
    rd = job["write" if job["write"]["total_ios"] > job["read"]["total_ios"] else "read"]
    facts = job.get("engine_facts", {})
    return {"iops": rd["iops"], "p50": rd["lat_ns"]["percentile"]["50.000000"],
            "p99": rd["lat_ns"]["percentile"]["99.000000"], "cpu_us": job["cpu_us_per_io"],
            "cpu": "cgroup" if job.get("cpu_accounting") == "cgroup" else "self",
            "mode": facts.get("mode"), "sq_thread_busy": facts.get("sq_thread_busy"),
            "gpu_price": facts.get("gpu_price")}


def run_fio(fio: str, target: str, opts: list[str], numjobs: int, iodepth: int,
            runtime: int) -> dict:
    """One fio run of 4 KiB random reads (``opts`` add to or override them): its medians'
    inputs, CPU per I/O from its cgroup (else fio's own figure, which counts only its job
    threads: "cpu": "self")."""
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


def fio_version(fio: str) -> str:
    return subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()


# --- targets a bench sets up itself, and releases however it ends


def setup_tmpfs(size: int = SIZE) -> tuple[str, Callable[[], None]]:
    """A pattern file on tmpfs (/dev/shm), which honours O_DIRECT."""
    base = Path("/dev/shm")
    if not base.is_dir():
        raise SystemExit("bench: no /dev/shm tmpfs here")
    path = base / f"gpufio-bench-{os.getpid()}.dat"
    api.lay_out(path, size, 7)
    return str(path), lambda: path.unlink(missing_ok=True)


def setup_zram(size: int = SIZE) -> tuple[str, Callable[[], None]] | None:
    """zram0 sized and filled with the (incompressible) pattern, if it is free to use."""
    dev = Path("/sys/block/zram0")
    if not dev.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    if not dev.exists() or (dev / "disksize").read_text().strip() != "0":
        return None
    try:
        (dev / "disksize").write_text(str(size))
        fd = os.open("/dev/zram0", os.O_WRONLY)
        try:
            for off in range(0, size, FILL_CHUNK):
                os.pwrite(fd, api.pattern(7, off, min(FILL_CHUNK, size - off)), off)
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


def zram_ext4(count: int, size: int, mounts: Path) -> tuple[list[str], Callable[[], None]]:
    """``count`` zram devices of ``size`` bytes (free ones, else new ones from hot_add), ext4
    on each, mounted under ``mounts``: RAM-backed like tmpfs, but block devices with a
    filesystem, which cuFile's own APIs can register and where O_DIRECT works. Returns the
    mount points and the release of everything made (also after a failure part way)."""
    hot_add = Path("/sys/class/zram-control/hot_add")
    if not hot_add.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    free = sorted(d for d in Path("/sys/block").glob("zram*")
                  if (d / "disksize").read_text().strip() == "0")
    added: set[str] = set()
    while len(free) < count and hot_add.exists():
        n = hot_add.read_text().strip()
        added.add(n)
        free.append(Path(f"/sys/block/zram{n}"))
    made: list[tuple[str, Path, str, Path]] = []

    def release() -> None:
        for point, control, word, udev in made:
            release_zram(point, control, word)
            udev.unlink(missing_ok=True)

    if len(free) < count:
        raise OSError(f"{count} free zram devices needed, {len(free)} found")
    try:
        for dev in free[:count]:
            n = dev.name.removeprefix("zram")
            control, word = ((Path("/sys/class/zram-control/hot_remove"), n) if n in added
                             else (dev / "reset", "1"))
            (dev / "disksize").write_text(str(size))
            point = mounts / dev.name
            point.mkdir(parents=True, exist_ok=True)
            st = os.stat(f"/dev/{dev.name}")
            udev = Path(f"/run/udev/data/b{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
            made.append((str(point), control, word, udev))
            subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/{dev.name}"], check=True)
            subprocess.run(["mount", f"/dev/{dev.name}", str(point)], check=True)
            # cuFile asks udev what a device holds (as bench/gpu_env.sh does for its mounts)
            if udev.parent.is_dir() and not udev.exists():
                udev.write_text("E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n")
    except (OSError, subprocess.CalledProcessError):
        release()
        raise
    return [m[0] for m in made], release


def zram_ext4_file(room: int = 2 * SIZE,
                   size: int = SIZE) -> tuple[str, Callable[[], None]] | None:
    """A pattern file of ``size`` bytes on ext4 on a zram device of ``room`` bytes (zram_ext4),
    or None, saying why, where none can be made."""
    try:
        (point,), release = zram_ext4(1, room, Path("/tmp/gpufio-zram"))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"bench: zram ext4 skipped: {e}", file=sys.stderr)
        return None
    path = os.path.join(point, "gpufio-bench.dat")
    try:
        api.lay_out(path, size, 7)
    except BaseException:
        release()
        raise
    return path, release


def clean_up_on_sigterm() -> None:
    """timeout(1) and batch systems stop a bench with SIGTERM: leave through the finally
    blocks, so its zram devices, mounts and files are released as after Ctrl-C."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# --- the report


# the columns of the GPU benches' tables (bench/gpu.py, bench/writes.py)
CASE_HEADERS = ["target", "gpufio path", "jobs x qd", "gpufio IOPS", "GB/s", "peer",
                "peer IOPS", "ratio", "p50 us g/p", "p99 us g/p", "CPU us/IO g/p", "goal"]


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def case_row(tname: str, c: dict, jobs_qd: str, peer: str, bs: int, g_runs: list[dict],
             p_runs: list[dict], missed: list[str], raw: list[dict]) -> list:
    """One case of a GPU bench: the medians of its runs, the verdict of its goals (``goal``:
    ratio, ``abs_goal``: IOPS, ``bw_goal``: bytes/s; a miss is added to ``missed``), its runs
    added to ``raw``, and its CASE_HEADERS row."""
    g, p = ({k: median(runs, k) for k in ("iops", "p50", "p99", "cpu_us")}
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


def fio_and_root_args(ap: argparse.ArgumentParser, fio_help: str, runtime: int,
                      repeat: int) -> None:
    """The options of the GPU machine's benches that run fio and may use a root-disk file."""
    ap.add_argument("--fio", required=True, help=fio_help)
    ap.add_argument("--runtime", type=int, default=runtime, help="measured seconds per run")
    ap.add_argument("--repeat", type=int, default=repeat,
                    help="runs per tool; medians are reported")
    ap.add_argument("--root-dir", default=str(Path.home()), help="where the root-disk file goes")
    ap.add_argument("--root-size", default="4g", help="size of the root-disk file")


def setup_rootfile(directory: Path, size: int) -> tuple[str, Callable[[], None]]:
    """A pattern file on the root disk, read with O_DIRECT: the slow drive."""
    path = directory / "gpufio-bench-root.dat"
    path.unlink(missing_ok=True)  # the bench's own file, left behind by a bench killed early
    api.lay_out(path, size, 8)
    return str(path), lambda: path.unlink(missing_ok=True)


def setup_loop_dio(directory: Path, size: int) -> tuple[str, Callable[[], None]]:
    """A loop device with direct I/O on over a new file of ``size`` bytes of data in
    ``directory``: every read goes to the disk under the file (none from a page cache), and
    both tools see the same device. Root and a file system that takes O_DIRECT needed; the
    release detaches the device and removes the file."""
    path = directory / f"gpufio-bench-loop-{os.getpid()}.dat"
    api.lay_out(path, size, 9)
    made = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(path)],
                          capture_output=True, text=True)
    dev = made.stdout.strip()

    def release() -> None:
        if dev:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        path.unlink(missing_ok=True)

    dio = Path(f"/sys/block/{Path(dev).name}/loop/dio") if dev else None
    if dio is None or not dio.exists() or dio.read_text().strip() != "1":
        release()
        raise SystemExit(f"bench: no loop device with direct I/O on over {path}: "
                         f"{made.stderr.strip() or 'its file system refuses O_DIRECT'}")
    return dev, release


def _unique(headers: list[str]) -> list[str]:
    """Column names as the renderer's row keys: a repeated name gets a trailing space."""
    out: list[str] = []
    for h in headers:
        while h in out:
            h += " "
        out.append(h)
    return out


def report(settings: str, rows: list, headers: list[str], raw: dict, json_path: str | None,
           missed: list[str]) -> int:
    """Print the dated header line and the table (gpufio's renderer, Markdown), save the raw
    runs; 1 if a goal in ``missed`` (only passed with --check) was not met."""
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} · {platform.node()} · {os.cpu_count()} cores · "
          f"kernel {platform.release()} · {settings}")
    keys = _unique(headers)
    sys.stdout.write(api.render_rows([dict(zip(keys, r)) for r in rows], "markdown",
                                     columns=keys))
    if json_path:
        Path(json_path).write_text(json.dumps(raw, indent=2))
    if missed:
        print("bench: goals missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0
