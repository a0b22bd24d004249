#!/usr/bin/env python3
"""gpufio's start-up against fio's: the start-up goals as one command.

Two figures, each a median of runs of this checkout's ``python3 -m gpufio`` (the
interpreter running this script) and of fio, interleaved:

- ``--help``: the wall time of ``gpufio --help`` (and, for scale, of ``python3 -c pass``,
  the interpreter's own start, of ``python3 -S -c pass``, that start without ``site`` and
  the ``.pth`` hooks a machine may add to every interpreter, and of ``fio --help``);
- first I/O: the time from the ``execve`` of the tool to its first I/O system call (a
  ``pread64`` of one block, or an ``io_uring_enter`` that submits), read from an
  ``strace -f --seccomp-bpf`` of a one-job 4 KiB random-read run of a small tmpfs file,
  for the psync and the uring engine against fio's psync and io_uring.

The runs take Python's bytecode cache as an installed gpufio has it: PYTHONDONTWRITEBYTECODE
is dropped from their environment and one untimed run of each command comes first.
``--check`` exits 1 if a goal (``HELP_S``, ``FIRST_IO_RATIO``) is missed; ``--quick`` runs
each figure 3 times, to prove the bench works, and its numbers are no measurement.

    python3 -m bench.startup --check      # 10 --help runs, 5 first-I/O runs a tool and engine
    python3 -m bench.startup --quick

It spawns ``python3 -m gpufio`` and writes its profile to a file, as no other bench does:
what it times is the command's own start.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import clean_up_on_sigterm, fio_version, report

REPO = Path(__file__).resolve().parent.parent
# the goals: --help within HELP_S; the first I/O no later than FIRST_IO_RATIO x fio's
HELP_S, FIRST_IO_RATIO = 0.15, 1.5
# gpufio engine -> fio's ioengine of the same path
ENGINES = {"psync": "psync", "uring": "io_uring"}
BS = 4096
# an I/O call in strace's output: a pread64 of one block, or an io_uring_enter submitting
_IO_CALL = re.compile(rf"pread64\(\d+, .*, {BS}, \d+\)|io_uring_enter\(\d+, [1-9]")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def wall(cmd: list[str]) -> float:
    """Seconds ``cmd`` takes to exit, its output discarded."""
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def first_io(cmd: list[str], strace: str) -> float:
    """Seconds from the exec of ``cmd`` to its first I/O system call, as strace saw them."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        subprocess.run([strace, "-f", "--seccomp-bpf", "-qq", "-ttt", "-o", log.name,
                        "-e", "trace=execve,pread64,io_uring_enter", *cmd], cwd=REPO,
                       env=_env(), stdout=subprocess.DEVNULL, check=True)
        lines = log.read().splitlines()
    start = next(float(ln.split()[1]) for ln in lines if "execve(" in ln)
    try:
        return next(float(ln.split()[1]) for ln in lines if _IO_CALL.search(ln)) - start
    except StopIteration:
        raise SystemExit(f"bench: no I/O call seen in an strace of {' '.join(cmd)}") from None


def gpufio_run(engine: str, target: Path, profile_dir: Path) -> list[str]:
    """The gpufio command of one job of ``engine`` reading 2 MiB of ``target``."""
    prof = profile_dir / f"startup-{engine}.toml"
    prof.write_text(f'[global]\ntargets = ["{target}"]\nrw = "randread"\nbs = "{BS}"\n'
                    f'direct = true\nio_size = "2m"\n[[job]]\nname = "first-io"\n'
                    f'engine = "{engine}"\n')
    return [sys.executable, "-m", "gpufio", "run", str(prof), "-q", "-f", "json"]


def fio_run(fio: str, engine: str, target: Path) -> list[str]:
    """fio's command of the same job."""
    return [fio, "--name=first-io", f"--ioengine={ENGINES[engine]}", f"--filename={target}",
            "--direct=1", "--rw=randread", f"--bs={BS}", "--io_size=2m",
            "--output-format=json"]


def median_of(runs: int, measure, cmd: list[str]) -> tuple[float, list[float]]:
    """One untimed run, then the median of ``runs``."""
    measure(cmd)
    times = [measure(cmd) for _ in range(runs)]
    return statistics.median(times), times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", default=shutil.which("fio"), help="fio binary (default: on PATH)")
    ap.add_argument("--strace", default=shutil.which("strace"), help="strace binary")
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--help-runs", type=int, default=10, help="--help runs a command")
    ap.add_argument("--io-runs", type=int, default=5, help="first-I/O runs a tool and engine")
    ap.add_argument("--quick", action="store_true", help="3 runs each: proves the bench runs")
    ap.add_argument("--json", help="also write every run's time here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    if not args.fio or not args.strace:
        raise SystemExit("bench: needs fio and strace (apt-get install fio strace)")
    if args.quick:
        args.help_runs = args.io_runs = 3
    clean_up_on_sigterm()
    rows, raw, missed = [], {}, []
    helps = {"gpufio": [sys.executable, "-m", "gpufio", "--help"], "fio": [args.fio, "--help"],
             "python3 -c pass": [sys.executable, "-c", "pass"],
             "python3 -S -c pass": [sys.executable, "-S", "-c", "pass"]}
    raw["--help"] = {name: median_of(args.help_runs, wall, cmd)[1] for name, cmd in helps.items()}
    g, f = (statistics.median(raw["--help"][n]) for n in ("gpufio", "fio"))
    floor, bare = (statistics.median(raw["--help"][n])
                   for n in ("python3 -c pass", "python3 -S -c pass"))
    rows.append(("--help", f"{g * 1e3:.0f}", f"{f * 1e3:.0f}", f"{g / f:.2f}",
                 f"{floor * 1e3:.0f}", f"{bare * 1e3:.0f}", f"< {HELP_S * 1e3:.0f} ms",
                 "ok" if g < HELP_S else "MISSED"))
    if g >= HELP_S:
        missed.append(f"--help {g * 1e3:.0f} ms >= {HELP_S * 1e3:.0f} ms")
    with tempfile.TemporaryDirectory(dir=args.tmpfs_dir) as tmp:
        target = Path(tmp) / "startup.dat"
        target.write_bytes(os.urandom(16 << 20))
        for engine in ENGINES:
            cmds = {"gpufio": gpufio_run(engine, target, Path(tmp)),
                    "fio": fio_run(args.fio, engine, target)}
            for cmd in cmds.values():
                first_io(cmd, args.strace)
            times: dict[str, list[float]] = {"gpufio": [], "fio": []}
            for i in range(args.io_runs):  # interleaved, the order swapped every run
                for name in (("gpufio", "fio") if i % 2 == 0 else ("fio", "gpufio")):
                    times[name].append(first_io(cmds[name], args.strace))
            raw[f"first I/O {engine}"] = times
            g, f = statistics.median(times["gpufio"]), statistics.median(times["fio"])
            ok = g <= FIRST_IO_RATIO * f
            rows.append((f"first I/O, {engine}", f"{g * 1e3:.0f}", f"{f * 1e3:.0f}",
                         f"{g / f:.2f}", "", "", f"<= {FIRST_IO_RATIO}x fio",
                         "ok" if ok else "MISSED"))
            if not ok:
                missed.append(f"first I/O {engine} {g / f:.2f}x > {FIRST_IO_RATIO}x fio's")
    settings = (f"{fio_version(args.fio)} · load {os.getloadavg()[0]:.1f} · medians of "
                f"{args.help_runs} (--help) and {args.io_runs} (first I/O) runs"
                + (" · --quick: not a measurement" if args.quick else ""))
    return report(settings, rows, ["measure", "gpufio ms", "fio ms", "ratio",
                                   "python3 -c pass ms", "python3 -S -c pass ms", "goal",
                                   "met"], raw, args.json,
                  missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
