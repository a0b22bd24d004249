#!/usr/bin/env python3
"""Does ``gpufio check`` tell noise from a regression? Interleaved runs of one short uring job.

Each try (a "pair" of sides) is five rounds on one runner, the way a CI job on a shared
runner should gate: a baseline run and one run of each candidate, every run ``--repeat 1``
with its own result file. The candidates are identical (a failure is a false alarm), slowed
10% and slowed 25% (``rate_iops`` at 0.9x and 0.75x the IOPS of the latest baseline run
before it: a pass is a missed regression). Rounds alternate the baseline's place, first in
even rounds and last in odd ones, so for each candidate the runs go B C C B B C C B B C: drift
hits both sides of a pair alike, and an order effect (a run that follows another being
slower) cancels too; the candidates' order rotates from round to round. Each candidate's
five runs are then checked against the five baseline runs (``gpufio check C... -b B...``),
which pairs them by their start times, with the gate's limits. Then the 1-run case: a 1-run
baseline and a 1-run candidate, whose verdict must say it has no noise estimate. ``--check``
exits 1 when a goal is missed: no false alarm, at least 19 of 20 10% slowdowns caught (the
same share of fewer tries), every 25% slowdown caught, the 1-run note.

The machine's own noise sets what any gate can do, so the bench measures it beside the goals:
after each round fio runs the same job twice on the same file (when fio is on PATH or given),
and the spread of those consecutive pairs' log ratios, and of gpufio's identical pairs', gives
the smallest slowdown that ``repeat`` pairs could catch 19 times in 20 at ``check``'s default
confidence with no false alarm, for a test that knew the noise exactly (``floor``): no
statistic on those runs does better. ``--noise-only`` measures just that (identical pairs and
fio's), e.g. to see whether longer runs would help (``--runtime 5s``).

Each candidate's achieved slowdown is the median over its pairs of 1 - candidate / baseline
IOPS; a slowed candidate more than ``TOLERANCE`` (3 points) off its target (10%: 7..13%) is
"invalid", not counted for or against the gate (the cap did not slow the job as asked, so
its verdict proves nothing), and ``--check`` fails while any case is invalid.

    python3 -m bench.gate --check            # 20 tries
    python3 -m bench.gate --quick --check    # 2 tries: proves the bench works end to end
    python3 -m bench.gate --noise-only --runtime 5s   # the noise floor of 5 s runs

gpufio is driven through its command line only (``python3 -m gpufio`` from this checkout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parent.parent

LIMITS = ["--max-drop", "iops=5%", "--max-rise", "lat_p99=10%"]
# check's default confidence, at which the gate judges (tests/bench/test_bench_gate.py holds them
# equal; importing it would load check's internals into the bench)
DEFAULT_CONFIDENCE = 0.99
SLOWDOWNS = (0.10, 0.25)
# how far a slowed candidate's achieved slowdown may be from its target (in fractions)
TOLERANCE = 0.03
# the candidates of a pair: identical (target 0), then each slowdown
CASES = ["identical", *(f"slowed {int(100 * s)}%" for s in SLOWDOWNS)]
# the gate's job, as gpufio's profile keys and fio's options alike (fio runs it beside)
JOB = {"rw": "randread", "bs": "4k", "iodepth": 8, "ramp_time": "200ms"}
PROFILE = """\
[global]
engine = "uring"
""" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in JOB.items()) + """\
numjobs = 1
size = "64m"
runtime = "{runtime}"
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


def run_fio(fio: str, target: Path, runtime: str) -> float:
    """fio running the gate's job on gpufio's laid-out file; its IOPS."""
    res = subprocess.run([fio, "--name=gate", "--ioengine=io_uring", f"--filename={target}",
                          "--direct=1", *(f"--{k}={v}" for k, v in JOB.items()),
                          f"--runtime={runtime}", "--time_based", "--output-format=json"],
                         text=True, capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"bench: fio failed ({res.returncode}): {res.stderr.strip()}")
    return json.loads(res.stdout)["jobs"][0]["read"]["iops"]


def noise(pairs: list[tuple[float, float]]) -> float | None:
    """The spread (sample standard deviation) of log(second / first) over pairs of identical
    runs: what one pair's log ratio scatters by on this machine."""
    logs = [math.log(b / a) for a, b in pairs]
    return statistics.stdev(logs) if len(logs) > 1 else None


def floor(sigma: float, pairs: int, confidence: float = DEFAULT_CONFIDENCE,
          power: float = 0.95) -> float:
    """The smallest slowdown (a fraction) that the mean of ``pairs`` log ratios, each
    scattering by ``sigma``, shows past a two-sided ``confidence`` bound with probability
    ``power``, the noise being known exactly: (z_conf + z_power) sigma / sqrt(pairs). A test
    that must estimate the noise from the same pairs (check's t interval) needs more."""
    return -math.expm1(-_z_sum(confidence, power) * sigma / math.sqrt(pairs))


def sigma_for(slowdown: float, pairs: int, confidence: float = DEFAULT_CONFIDENCE,
              power: float = 0.95) -> float:
    """The largest pair spread at which ``floor`` still reaches ``slowdown``."""
    return -math.log1p(-slowdown) * math.sqrt(pairs) / _z_sum(confidence, power)


def _z_sum(confidence: float, power: float) -> float:
    """z of a two-sided ``confidence`` bound plus z of ``power``: how many spreads of the
    mean a change must be to clear the bound that often."""
    z = NormalDist().inv_cdf
    return z((1 + confidence) / 2) + z(power)


def check(results: list[Path], baselines: list[Path]) -> tuple[int, str]:
    """``gpufio check``'s exit code and output: the result files against the baseline's."""
    res = gpufio("check", *map(str, results), *[a for b in baselines for a in ("-b", str(b))],
                 *LIMITS)
    if res.returncode not in (0, 1):
        raise SystemExit(f"bench: gpufio check failed ({res.returncode}): {res.stderr.strip()}")
    return res.returncode, res.stdout + res.stderr


def iops(doc: dict) -> float:
    """A one-run result's IOPS."""
    return doc["jobs"][0]["read"]["iops"]


def rounds(n: int, cases: list[str] = CASES) -> list[list[str]]:
    """Each round's order of runs: "base" and the cases; the baseline first in even rounds
    and last in odd ones, the cases rotated by one each round."""
    out = []
    for j in range(n):
        turned = cases[j % len(cases):] + cases[:j % len(cases)]
        out.append(["base", *turned] if j % 2 == 0 else [*turned, "base"])
    return out


def one_try(profile: Path, work: Path, t: int, repeat: int, cases: list[str],
            fio: str | None, fio_pairs: list[tuple[float, float]],
            runtime: str) -> list[dict]:
    """One try: ``repeat`` interleaved rounds, each followed by fio's pair of identical runs
    (into ``fio_pairs``) when ``fio`` is given, then each case checked against the baseline
    runs; a verdict per case."""
    files: dict[str, list[Path]] = {name: [] for name in ["base", *cases]}
    measured: dict[str, list[float]] = {name: [] for name in ["base", *cases]}
    targets = dict(zip(cases, (0.0, *SLOWDOWNS)))
    latest = None  # the IOPS of the latest baseline run
    for j, order in enumerate(rounds(repeat, cases)):
        for name in order:
            out = work / f"t{t}-r{j}-{name.replace(' ', '').replace('%', '')}.json"
            target = targets.get(name, 0.0)
            if target and latest is None:
                raise SystemExit("bench: a slowed run before any baseline run")
            sets = [f"rate_iops={math.floor((1 - target) * latest)}"] if target else []
            got = iops(run(profile, out, 1, *sets))
            files[name].append(out)
            measured[name].append(got)
            if name == "base":
                latest = got
        if fio:
            target = laid_out(json.loads(files["base"][-1].read_text()))
            fio_pairs.append((run_fio(fio, target, runtime), run_fio(fio, target, runtime)))
    verdicts = []
    for name, target in targets.items():
        # the runs of a round are a pair; the achieved slowdown is the pairs' median
        ratios = [c / b for c, b in zip(measured[name], measured["base"])]
        slowdown, valid = achieved(target, 1.0, statistics.median(ratios))
        rc, text = check(files[name], files["base"])
        verdicts.append({"pair": t, "case": name, "target": target,
                         "baseline_iops": measured["base"], "achieved_iops": measured[name],
                         "slowdown": slowdown, "valid": valid, "failed": rc == 1,
                         "output": text})
        verdict = ("FAIL" if rc else "pass") if valid else f"invalid (asked {100 * target:.0f}%)"
        print(f"try {t + 1} {name}: {verdict}; slowdown {100 * slowdown:+.1f}% "
              f"(pairs {', '.join(f'{100 * (1 - r):+.0f}' for r in ratios)})", flush=True)
    return verdicts


def laid_out(doc: dict) -> Path:
    """The file gpufio laid out for the gate's job (fio reads the same one)."""
    return Path(doc["jobs"][0]["targets"][0]["path"])


def achieved(target: float, base_iops: float, cand_iops: float) -> tuple[float, bool]:
    """The slowdown a candidate really had against its baseline (a fraction, negative when
    it was faster), and whether it counts: a slowed candidate (``target`` > 0) only within
    TOLERANCE of its target; an identical one (target 0) always, its spread being the noise
    the gate must not fail on."""
    slowdown = 1.0 - cand_iops / base_iops
    return slowdown, target == 0 or abs(slowdown - target) <= TOLERANCE + 1e-12


def tally(verdicts: list[dict], cases: list[str]) -> dict[str, dict[str, int]]:
    """Per case: the verdicts that count (valid), how many of them failed, and the invalid."""
    out = {c: {"valid": 0, "failed": 0, "invalid": 0} for c in cases}
    for v in verdicts:
        t = out[v["case"]]
        if v["valid"]:
            t["valid"] += 1
            t["failed"] += v["failed"]
        else:
            t["invalid"] += 1
    return out


def goals(counts: dict[str, dict[str, int]], pairs: int, one_run_note: bool) -> dict:
    """Each goal: (what was got, what is wanted, met). The catch goals are shares of the
    valid cases; every case must be valid."""
    ident, s10, s25 = (counts[c] for c in CASES)
    need10 = s10["valid"] - s10["valid"] // 20  # 19 of 20
    invalid = sum(c["invalid"] for c in counts.values())
    return {
        "false failures (identical)": (ident["failed"], f"0 of {ident['valid']}",
                                       ident["failed"] == 0),
        "slowed 10% caught": (s10["failed"], f">= {need10} of {s10['valid']} valid",
                              s10["failed"] >= need10),
        "slowed 25% caught": (s25["failed"], f"{s25['valid']} of {s25['valid']} valid",
                              s25["failed"] == s25["valid"]),
        "slowdowns as asked (within 3 points)": (
            f"{invalid} invalid", f"0 of {2 * pairs}", invalid == 0),
        "1-run verdict says no noise estimate": (one_run_note, "yes", one_run_note),
    }



def noise_floor(sigmas: dict[str, float | None], repeat: int) -> dict:
    """Each tool's pair spread and the floor it sets for ``repeat`` pairs, against the
    spread each slowdown goal needs; the lines to print and the numbers to keep."""
    need = {f"{int(100 * s)}%": sigma_for(s, repeat) for s in SLOWDOWNS}
    lines = [f"noise floor (a test knowing the noise exactly, {repeat} pairs, "
             f"{100 * DEFAULT_CONFIDENCE:g}% two-sided, caught 19 of 20): "
             + ", ".join(f"{k} needs a pair spread <= {v:.3f}" for k, v in need.items())]
    for tool, sigma in sigmas.items():
        if sigma is None:
            continue
        lines.append(f"{tool} identical pairs: log-ratio spread {sigma:.3f}; smallest "
                     f"slowdown catchable {100 * floor(sigma, repeat):.0f}%")
    return {"lines": lines, "noise": {"sigma": sigmas, "sigma_needed": need,
                                      "floor": {t: floor(s, repeat) for t, s in
                                                sigmas.items() if s is not None}}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20, help="tries")
    ap.add_argument("--quick", action="store_true", help="2 tries")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (runs a side) per try")
    ap.add_argument("--runtime", default="1s")
    ap.add_argument("--directory", help="where the target file goes (default: a fresh "
                    "directory on /dev/shm, else the system's temporary directory)")
    ap.add_argument("--output", help="write the tallies and every verdict as JSON here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--fio", default=shutil.which("fio"),
                    help="fio binary for the noise floor (default: on PATH; none: gpufio's "
                    "identical pairs alone)")
    ap.add_argument("--noise-only", action="store_true",
                    help="only identical pairs (gpufio's and fio's) and the noise floor; "
                    "no goals")
    args = ap.parse_args()
    pairs = 2 if args.quick else args.pairs
    if pairs < 1 or args.repeat < 1:
        ap.error("--pairs and --repeat must be at least 1")
    cases = CASES[:1] if args.noise_only else CASES
    own = args.directory is None
    base_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = Path(args.directory or tempfile.mkdtemp(prefix="gpufio-gate-", dir=base_dir))
    work = Path(tempfile.mkdtemp(prefix="gpufio-gate-results-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        profile = work / "gate.toml"
        profile.write_text(PROFILE.format(runtime=args.runtime, directory=directory))
        verdicts: list[dict] = []
        fio_pairs: list[tuple[float, float]] = []
        for i in range(pairs):
            verdicts += one_try(profile, work, i, args.repeat, cases, args.fio, fio_pairs,
                                args.runtime)
        one_run_note = False
        if not args.noise_only:
            one_base, one_cand = work / "one-base.json", work / "one-cand.json"
            run(profile, one_base, 1)
            run(profile, one_cand, 1)
            rc, text = check([one_cand], [one_base])
            one_run_note = "no noise estimate" in text
            print(f"1-run baseline and candidate: rc {rc}, "
                  f"{'says' if one_run_note else 'does NOT say'} it has no noise estimate")
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
        if not args.output:
            shutil.rmtree(work, ignore_errors=True)
    identical = [(b, c) for v in verdicts if v["case"] == "identical"
                 for b, c in zip(v["baseline_iops"], v["achieved_iops"])]
    floors = noise_floor({"gpufio": noise(identical), "fio": noise(fio_pairs)}, args.repeat)
    print(f"\ngpufio check on {pairs} tries of {args.repeat} interleaved rounds of "
          f"{args.runtime} uring runs, limits {' '.join(LIMITS)}; {os.cpu_count()} CPUs, {started}")
    for line in floors["lines"]:
        print(f"  {line}")
    if args.noise_only:
        if args.output:
            Path(args.output).write_text(json.dumps(
                {"pairs": pairs, "repeat": args.repeat, "runtime": args.runtime,
                 "started": started, "noise": floors["noise"], "fio_pairs": fio_pairs,
                 "identical_pairs": identical}, indent=2))
            shutil.rmtree(work, ignore_errors=True)
        return 0
    counts = tally(verdicts, CASES)
    met = goals(counts, pairs, one_run_note)
    for goal, (got, want, ok) in met.items():
        print(f"  {'ok  ' if ok else 'MISS'} {goal}: {got} (goal {want})")
    for name, target in zip(CASES[1:], SLOWDOWNS):
        real = sorted(v["slowdown"] for v in verdicts if v["case"] == name)
        print(f"  {name}: achieved {100 * statistics.median(real):.1f}% median, "
              f"{100 * real[0]:.1f}..{100 * real[-1]:.1f}% (valid: "
              f"{100 * (target - TOLERANCE):.0f}..{100 * (target + TOLERANCE):.0f}%)")
    if args.output:
        Path(args.output).write_text(json.dumps(
            {"pairs": pairs, "repeat": args.repeat, "runtime": args.runtime, "started": started,
             "tally": counts, "one_run_note": one_run_note, "noise": floors["noise"],
             "fio_pairs": fio_pairs, "verdicts": verdicts}, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    return 1 if args.check and not all(ok for _, _, ok in met.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
