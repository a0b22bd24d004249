#!/usr/bin/env python3
"""Does ``gpufio check`` tell noise from a regression? Pairs of runs of one short uring job.

For each pair: a baseline (``--repeat 5``), then three candidates of the same job, each
``--repeat 5``: identical (a failure is a false alarm), slowed 10% and slowed 25% (rate_iops
at 0.9x and 0.75x the baseline's median IOPS: a pass is a missed regression), each checked
against the baseline with the issue's limits. Then the 1-run case: a 1-run baseline and a
1-run candidate, whose verdict must say it has no noise estimate. ``--check`` exits 1 when
a goal is missed: no false alarm, at least 19 of 20 10% slowdowns caught (the same share of
fewer pairs), every 25% slowdown caught, the 1-run note.

    python3 -m bench.gate --check            # 20 pairs: run it on an idle machine
    python3 -m bench.gate --quick --check    # 2 pairs: proves the bench works end to end

gpufio is driven through its command line only (``python3 -m gpufio`` from this checkout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMITS = ["--max-drop", "iops=5%", "--max-rise", "lat_p99=10%"]
SLOWDOWNS = (0.10, 0.25)
PROFILE = """\
[global]
engine = "uring"
rw = "randread"
bs = "4k"
iodepth = 8
numjobs = 1
size = "64m"
runtime = "{runtime}"
ramp_time = "200ms"
time_based = true
sample_interval = "100ms"
directory = "{directory}"

[[job]]
name = "gate"
"""


def gpufio(*args: str) -> subprocess.CompletedProcess[str]:
    """``python3 -m gpufio ARGS`` from this checkout, output captured."""
    return subprocess.run([sys.executable, "-m", "gpufio", *args], cwd=ROOT, text=True,
                          capture_output=True)


def run(profile: Path, out: Path, repeat: int, *sets: str) -> dict:
    """One (repeated) run of the profile; its result document."""
    extra = [a for s in sets for a in ("--set", s)]
    res = gpufio("run", str(profile), "-q", "-f", "json", "-o", str(out),
                 "--repeat", str(repeat), *extra)
    if res.returncode != 0:
        raise SystemExit(f"bench: gpufio run failed ({res.returncode}): {res.stderr.strip()}")
    return json.loads(out.read_text())


def check(result: Path, baseline: Path) -> tuple[int, str]:
    """``gpufio check``'s exit code and output."""
    res = gpufio("check", str(result), "--baseline", str(baseline), *LIMITS)
    if res.returncode not in (0, 1):
        raise SystemExit(f"bench: gpufio check failed ({res.returncode}): {res.stderr.strip()}")
    return res.returncode, res.stdout + res.stderr


def median_iops(doc: dict) -> float:
    job = doc["jobs"][0]
    return job["repeat"]["median"]["iops"] if "repeat" in job else job["read"]["iops"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="2 pairs, 1 s runs")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--runtime", default="1s")
    ap.add_argument("--directory", help="where the target file goes (default: a fresh "
                    "directory on /dev/shm, else the system's temporary directory)")
    ap.add_argument("--output", help="write the tallies and every verdict as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args()
    pairs = 2 if args.quick else args.pairs
    own = args.directory is None
    base_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = Path(args.directory or tempfile.mkdtemp(prefix="gpufio-gate-", dir=base_dir))
    work = Path(tempfile.mkdtemp(prefix="gpufio-gate-results-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        profile = work / "gate.toml"
        profile.write_text(PROFILE.format(runtime=args.runtime, directory=directory))
        tally = {"identical": 0, **{f"slowed {int(100 * s)}%": 0 for s in SLOWDOWNS}}
        verdicts = []
        for i in range(pairs):
            base = work / f"base-{i}.json"
            rate = median_iops(run(profile, base, args.repeat))
            cases = [("identical", [])] + [
                (f"slowed {int(100 * s)}%", [f"rate_iops={math.floor((1 - s) * rate)}"])
                for s in SLOWDOWNS]
            for name, sets in cases:
                cand = work / f"cand-{i}-{name.replace(' ', '').replace('%', '')}.json"
                run(profile, cand, args.repeat, *sets)
                rc, text = check(cand, base)
                tally[name] += rc == 1
                verdicts.append({"pair": i, "case": name, "failed": rc == 1, "output": text})
                print(f"pair {i + 1}/{pairs} {name}: {'FAIL' if rc else 'pass'}", flush=True)
        one_base, one_cand = work / "one-base.json", work / "one-cand.json"
        run(profile, one_base, 1)
        run(profile, one_cand, 1)
        rc, text = check(one_cand, one_base)
        one_run_note = "no noise estimate" in text
        print(f"1-run baseline and candidate: rc {rc}, "
              f"{'says' if one_run_note else 'does NOT say'} it has no noise estimate")
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
        if not args.output:
            shutil.rmtree(work, ignore_errors=True)
    needed10 = pairs - pairs // 20  # 19 of 20
    goals = {
        "false failures (identical)": (tally["identical"], f"0 of {pairs}",
                                       tally["identical"] == 0),
        "slowed 10% caught": (tally["slowed 10%"], f">= {needed10} of {pairs}",
                              tally["slowed 10%"] >= needed10),
        "slowed 25% caught": (tally["slowed 25%"], f"{pairs} of {pairs}",
                              tally["slowed 25%"] == pairs),
        "1-run verdict says no noise estimate": (one_run_note, "yes", one_run_note),
    }
    print(f"\ngpufio check on {pairs} pairs of {args.runtime} uring runs, --repeat "
          f"{args.repeat}, limits {' '.join(LIMITS)}; {os.cpu_count()} CPUs, {started}")
    for goal, (got, want, ok) in goals.items():
        print(f"  {'ok  ' if ok else 'MISS'} {goal}: {got} (goal {want})")
    if args.output:
        Path(args.output).write_text(json.dumps(
            {"pairs": pairs, "repeat": args.repeat, "runtime": args.runtime, "started": started,
             "tally": tally, "one_run_note": one_run_note, "verdicts": verdicts}, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    return 1 if args.check and not all(ok for _, _, ok in goals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
