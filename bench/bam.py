#!/usr/bin/env python3
"""BaM's mechanism measured: GPU threads driving NVMe queues, against the software controller
and, given a drive, against the other paths onto it.

Without ``--drive`` (any GPU machine): the software NVMe controller (gpufio/io/nvme/model.py,
a Python process polling its doorbells) serves 4 KiB reads from a tmpfs file three ways: its
own CPU driver (io/nvme/model.QueuePair: the model's ceiling), GPU agents ringing doorbells
through the CPU relay, GPU agents ringing them directly. The mechanism's ceiling, as
bench/nop.py is io_uring's: goal (``--check``), each GPU mode >= GOAL x the CPU-driven rate,
i.e. the GPU side does not limit the model. The numbers are the model's, not a drive's.
Then ``engine = "bam"`` itself on the model (controller = "model"), relay and direct: the
engine's own GPU block loop end to end (``--runtime`` seconds each).

With ``--drive /dev/nvmeXnY`` (a machine with an NVMe drive and a GPU; reads only): 4 KiB
random reads through fio io_uring, fio io_uring_cmd (/dev/ngXnY), gpufio gpu-uring and gpufio
bam (its CPU stand-in, GPU threads with relayed and with direct doorbells; a refusal, such
as CUDA not registering the BAR, is a row saying why), IOPS and CPU us per I/O.

With ``--controller compiled`` (any GPU machine; ``--cpu-only`` anywhere): the compiled
software controller (gpufio/io/nvme/controller.c, ``--backend none``: no data moved, the
queues' ceiling; ``ram``: the namespace memory-mapped) swept over queue pairs, depth and
transfer size (512 B, 4 KiB): at each point its own CPU-driven ceiling (as many compiled CPU driver
threads as the controller has poller threads, each driving its share of the pairs) beside GPU agents with
relayed and with direct doorbells, in the same run. Goal (``--check``): each GPU mode >=
GOAL x the CPU-driven ceiling at every point, and, for ``none`` at 512 B, NONE_512_GOAL
commands/s. The numbers are a software controller's, not a drive's.

With ``--drive-model NAME`` as well (a model of gpufio/io/nvme/drives.toml): every
completion is held to that drive's published rates, each namespace's by a rate model of its
own, so the sweep shows an emulated drive (the title says so, with the rates' source): each
point's observed IOPS beside the model's rated IOPS and the most the model allows there
(the least of its IOPS, sequential read / size, link / size, pairs x depth / latency).

    python3 -m bench.bam --quick            # from the repository root
    python3 -m bench.bam --check --json bam.json
    python3 -m bench.bam --controller compiled --backend none --check --json bam-none.json
    python3 -m bench.bam --controller compiled --backend ram --cpu-only
    python3 -m bench.bam --controller compiled --backend ram --drive-model micron-9550
    python3 -m bench.bam --drive /dev/nvme0n1 --runtime 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench import _nvme_rates as rates
from gpufio import api

GOAL = 0.9
BS = 4096
NONE_512_GOAL = 45.8e6  # BaM's own I/O stack on one H100 (512 B, ten drives)
RAM_4K_FLOOR = 2e6  # the seed article's observed IOPS
H2D_GOAL = 0.7  # verified 4 KiB reads/s over the pinned host-to-device copy ceiling's
PRICE_GOAL, PRICE_RATE = 0.9, 10e6  # a compute kernel's share kept beside this many reads/s


def model_rows(args: argparse.Namespace) -> tuple[list[list], list[dict], list[str]]:
    rows, raw, missed = [], [], []
    cpu = [rates.cpu_rate(args.n, args.depth, args.size) for _ in range(args.repeat)]
    c = statistics.median(cpu)
    rows.append(["model, CPU driver (its ceiling)", f"1 x {args.depth}", round(c), "", ""])
    raw.append({"path": "cpu", "rates": cpu})
    for mode in () if args.cpu_only else ("relay", "direct"):
        g = [rates.gpu_rate(mode, args.n, args.depth, args.pairs, args.size)
             for _ in range(args.repeat)]
        r = statistics.median(g)
        ratio = r / c if c else 0.0
        ok = ratio >= GOAL
        if not ok:
            missed.append(f"GPU {mode} doorbells: {ratio:.2f} of the CPU-driven rate")
        rows.append([f"model, GPU agents, {mode} doorbells", f"{args.pairs} x {args.depth}",
                     round(r), f"{ratio:.2f}", "ok" if ok else f"MISS ratio<{GOAL}"])
        raw.append({"path": mode, "rates": g})
    return rows, raw, missed


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _point(text: str) -> tuple[int, int]:
    """--price's PAIRS,DEPTH: two positive integers."""
    try:
        pairs, depth = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give PAIRS,DEPTH, e.g. 16,64") from None
    if pairs < 1 or depth < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: pairs and depth are at least 1")
    return pairs, depth


def model_bound(drive: dict, bs: int, inflight: int) -> float | None:
    """The most reads/s of ``bs`` bytes the drive model (rates.drive_model) allows with
    ``inflight`` commands outstanding: the least of its published limits (None: none is)."""
    limits = [drive["iops"]] if drive["iops"] else []
    limits += [drive[k] / bs for k in ("read_bw", "link_bw") if drive[k]]
    if drive["latency_ns"]:
        limits.append(inflight / (drive["latency_ns"] / 1e9))  # Little's law
    return min(limits) if limits else None


def compiled_rows(args: argparse.Namespace) -> tuple[list[list], list[dict], list[str]]:
    """The compiled controller swept: per (size, pairs, depth) its CPU-driven ceiling and,
    unless --cpu-only, GPU agents with relayed and with direct doorbells, medians of
    --repeat runs, each run ``--n`` reads per pair; with --drive-model, the model's rated
    IOPS and its bound at the point beside them."""
    rows, raw, missed = [], [], []
    drive = rates.drive_model(args.drive_model) if args.drive_model else None
    best_512, best_4k = 0.0, 0.0
    for bs in _ints(args.sizes):
        for pairs in _ints(args.pairs_list):
            pollers = min(pairs, args.pollers)
            for depth in _ints(args.depths):
                point = f"{bs} B, {pairs} x {depth}, {pollers} poller(s)"
                cpu = [rates.compiled_cpu_rate(args.n, depth, pairs, bs, pollers,
                                               args.backend, args.size, args.drive_model)
                       for _ in range(args.repeat)]
                c = statistics.median(cpu)
                row = [f"{bs} B", f"{pairs} x {depth}", pollers]
                entry = {"bs": bs, "pairs": pairs, "depth": depth, "pollers": pollers,
                         "cpu": cpu}
                if drive is not None:
                    bound = model_bound(drive, bs, pairs * depth)
                    row += [round(drive["iops"]) if drive["iops"] else "unpublished",
                            round(bound) if bound else "none"]
                    entry["rated_iops"], entry["model_bound"] = drive["iops"], bound
                row.append(round(c))
                verdict = ""
                for mode in () if args.cpu_only else ("relay", "direct"):
                    g = [_gpu(args, mode, args.n * pairs, depth, pairs, bs, pollers, entry)
                         for _ in range(args.repeat)]
                    r = statistics.median(g)
                    if bs == 4096:
                        best_4k = max(best_4k, r)
                    ratio = r / c if c else 0.0
                    row += [round(r), f"{ratio:.2f}"]
                    entry[mode] = g
                    if bs == 512:
                        best_512 = max(best_512, r)
                    if ratio < GOAL:
                        missed.append(f"{point}, {mode} doorbells: {ratio:.2f} of the "
                                      "CPU-driven ceiling")
                        verdict = f"MISS ratio<{GOAL}"
                rows.append(row + ([] if args.cpu_only else [verdict or "ok"]))
                raw.append(entry)
    if not args.cpu_only and args.backend == "none" and 512 in _ints(args.sizes) \
            and best_512 < NONE_512_GOAL and drive is None:
        missed.append(f"none, 512 B: {best_512 / 1e6:.2f} M commands/s at best, the goal "
                      f"{NONE_512_GOAL / 1e6:g} M")
    if args.verify and best_4k:
        ceiling = args.h2d / 4096
        for what, ok in ((f"{RAM_4K_FLOOR / 1e6:g} M (the seed's observed IOPS)",
                          best_4k >= RAM_4K_FLOOR),
                         (f"{H2D_GOAL} x the pinned H2D ceiling ({ceiling / 1e6:.2f} M "
                          "4 KiB copies/s)", best_4k >= H2D_GOAL * ceiling)):
            if not ok:
                missed.append(f"verified 4 KiB reads: {best_4k / 1e6:.2f} M/s at best, the "
                              f"goal {what}")
    return rows, raw, missed


def _gpu(args: argparse.Namespace, mode: str, n: int, depth: int, pairs: int, bs: int,
         pollers: int, entry: dict) -> float:
    """One GPU run's reads/s; with --verify each read is copied into GPU memory and checked
    there, and a read that failed or landed wrong bytes ends the bench."""
    if not args.verify:
        return rates.gpu_rate(mode, n, depth, pairs, args.size, bs, pollers, args.backend,
                              args.drive_model)
    v = rates.gpu_verified_rate(mode, n, depth, pairs, args.size, bs, pollers, args.backend)
    entry.setdefault(f"{mode}_verified", []).append(v)
    if v["failed"] or v["mismatches"]:
        raise SystemExit(f"bench: {v['failed']} failed and {v['mismatches']} wrong of "
                         f"{v['checked']} verified reads ({mode} doorbells)")
    return v["rate"]


def price_rows(args: argparse.Namespace) -> tuple[list[list], list[dict], list[str]]:
    """The SM price: a 4096 x 4096 float32 matrix product's rate alone and beside GPU agents
    (direct doorbells) serving --price's pairs x depth on the compiled controller."""
    pairs, depth = args.price
    pollers = min(pairs, args.pollers)
    bs = _ints(args.sizes)[0]
    p = rates.sm_price("direct", args.n * pairs, depth, pairs, args.size, bs, pollers,
                       args.backend, pack=args.pack)
    missed = []
    if p["rate"] < PRICE_RATE:
        missed.append(f"SM price: the agents made {p['rate'] / 1e6:.2f} M reads/s beside the "
                      f"product, under the {PRICE_RATE / 1e6:g} M the goal asks")
    if p["kept"] < PRICE_GOAL:
        missed.append(f"SM price: the product kept {p['kept']:.2f} of its solo rate")
    row = [f"{bs} B", f"{pairs} x {depth}", pollers, f"{p['matmul_solo']:.1f}",
           f"{p['matmul_beside_idle_blocks']:.1f}", f"{p['kept_idle_blocks']:.2f}",
           f"{p['matmul_beside']:.1f}", f"{p['kept']:.2f}", round(p["rate"]),
           f"{p['agent_warps']} agent warps in {p['agent_blocks']} blocks + "
           f"{p['requester_blocks']} requester blocks / {p['sms']} SMs"]
    return [row], [p], missed


def _fio(target: str, engine: str, runtime: int, iodepth: int) -> dict:
    extra = ["--cmd_type=nvme"] if engine == "io_uring_cmd" else ["--direct=1"]
    out = subprocess.run(["fio", "--name=bam-bench", f"--filename={target}", "--rw=randread",
                          f"--bs={BS}", f"--ioengine={engine}", f"--iodepth={iodepth}",
                          f"--runtime={runtime}", "--time_based", "--output-format=json",
                          *extra], capture_output=True, text=True, check=True).stdout
    job = json.loads(out)["jobs"][0]
    ios = job["read"]["total_ios"]
    cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["read"]["runtime"] / 1000
    return {"iops": job["read"]["iops"], "cpu_us": 1e6 * cpu_s / ios if ios else 0.0}


def _gpufio(target: str, engine: str, runtime: int, iodepth: int, **opts: object) -> dict:
    """One time-based 4 KiB random-read job through the CLI; a refusal (exit 2) is a row
    that says why instead of numbers."""
    prof = {"engine": engine, "rw": "randread", "bs": "4k", "targets": [target],
            "iodepth": iodepth, "runtime": f"{runtime}s", "time_based": True, **opts}
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write("[global]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in prof.items()))
    try:
        res = subprocess.run([sys.executable, "-m", "gpufio", "run", f.name, "-f", "json", "-q"],
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if res.returncode == 2:
        return {"iops": 0, "cpu_us": 0.0, "refused": res.stderr.strip()}
    res.check_returncode()
    job = json.loads(res.stdout)["jobs"][0]
    facts = job.get("engine_facts", {})
    return {"iops": job["read"]["iops"], "cpu_us": job["cpu_us_per_io"],
            "mode": facts.get("mode") if facts.get("submitter") else facts.get("doorbells")}


def engine_rows(args: argparse.Namespace) -> tuple[list[list], list[dict]]:
    """engine = "bam" end to end on the software controller, relay and direct: the engine's
    GPU block loop over the same model (rates are the model's, and the runner's)."""
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="gpufio-bam-bench-", dir="/dev/shm") as where:
        path = os.path.join(where, "ns.dat")
        api.lay_out(path, args.size, 1)
        for mode in ("relay", "direct"):
            r = _gpufio(path, "bam", args.runtime, args.depth, controller="model",
                        doorbells=mode)
            rows.append([f"engine bam ({r.get('mode') or r.get('refused')})",
                         f"1 x {args.depth}", round(r["iops"]), "", ""])
            raw.append({"path": f"engine bam {mode}", **r})
    return rows, raw


def drive_rows(args: argparse.Namespace) -> tuple[list[list], list[dict]]:
    name = os.path.basename(args.drive)
    generic = args.generic or f"/dev/{name.replace('nvme', 'ng', 1)}"
    engines = subprocess.run([sys.executable, "-m", "gpufio", "engines"], capture_output=True,
                             text=True).stdout.split()
    runs = [("fio io_uring", lambda: _fio(args.drive, "io_uring", args.runtime, args.depth)),
            ("fio io_uring_cmd", lambda: _fio(generic, "io_uring_cmd", args.runtime,
                                              args.depth)),
            ("gpufio gpu-uring", lambda: _gpufio(args.drive, "gpu-uring", args.runtime,
                                                 args.depth))]
    if "bam" in engines:  # the drive must be free to take (gpufio doctor says)
        for who, bells in (("cpu", "auto"), ("gpu", "relay"), ("gpu", "direct")):
            runs.append((f"gpufio bam {who}", lambda w=who, b=bells: _gpufio(
                args.drive, "bam", args.runtime, args.depth, submitter=w, doorbells=b)))
    rows, raw = [], []
    for label, go in runs:
        r = go()
        if r.get("refused"):
            rows.append([f"{label}: {r['refused']}", f"1 x {args.depth}", "", "", ""])
            raw.append({"path": label, **r})
            continue
        rows.append([label + (f" ({r['mode']})" if r.get("mode") else ""), f"1 x {args.depth}",
                     round(r["iops"]), f"{r['cpu_us']:.2f}", ""])
        raw.append({"path": label, **r})
    return rows, raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few reads, one repetition")
    ap.add_argument("--n", type=int, default=200_000, help="reads per model run")
    ap.add_argument("--depth", type=int, default=64, help="outstanding commands per queue")
    ap.add_argument("--pairs", type=int, default=1, help="queue pairs the GPU drives")
    ap.add_argument("--size", type=int, default=64 << 20, help="the model's namespace bytes")
    ap.add_argument("--repeat", type=int, default=3, help="runs per path; medians reported")
    ap.add_argument("--drive", help="an NVMe namespace (block device) to compare paths on")
    ap.add_argument("--generic", help="its generic char device (default: from --drive)")
    ap.add_argument("--runtime", type=int, default=5, help="seconds per drive run")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    ap.add_argument("--controller", choices=("model", "compiled"), default="model",
                    help="the software controller measured without --drive")
    ap.add_argument("--backend", choices=("none", "ram", "file"), default="none",
                    help="the compiled controller's data (none: no data moved)")
    ap.add_argument("--pairs-list", default="1,2,4,8,16,32,64",
                    help="queue pairs swept (compiled)")
    ap.add_argument("--depths", default="32,128", help="commands in flight per pair (compiled)")
    ap.add_argument("--sizes", default="512,4096", help="transfer sizes in bytes (compiled)")
    ap.add_argument("--pollers", type=int, default=os.cpu_count() or 1,
                    help="the compiled controller's poller threads, at most one per pair")
    ap.add_argument("--cpu-only", action="store_true",
                    help="only the CPU-driven ceiling (no GPU needed)")
    ap.add_argument("--drive-model", help="compiled: hold completions to this drive model's "
                    "published rates (gpufio/io/nvme/drives.toml): an emulated drive")
    ap.add_argument("--verify", action="store_true", help="compiled: GPU reads copied into "
                    "GPU memory and checked there, beside the pinned H2D copy ceiling")
    ap.add_argument("--price", metavar="PAIRS,DEPTH", type=_point, help="compiled: a matrix product's "
                    "rate alone and beside the agents at this point, instead of the sweep")
    ap.add_argument("--pack", type=int, help="--price: agent warps and requester warps to a "
                    "block (else the queue's agents, as few blocks as fit, and requesters a "
                    "warp to a block); each block holds a share of an SM")
    args = ap.parse_args()
    # a bench stopped by SIGTERM (timeout(1)) unwinds as from Ctrl-C: the controllers stop
    # and their files in /dev/shm go
    api.stop_on_sigterm()
    if args.quick:
        args.n, args.repeat, args.runtime = 5_000, 1, 2
    if args.drive_model and (args.controller != "compiled" or args.drive):
        print("bench: --drive-model emulates a drive on the compiled controller "
              "(--controller compiled, no --drive)", file=sys.stderr)
        return 2
    if args.pack is not None and (not 1 <= args.pack <= 32 or not args.price):
        print(f"bench: --pack {args.pack}: 1 to 32 warps to a block, with --price",
              file=sys.stderr)
        return 2
    if (args.price or args.verify) and (args.controller != "compiled" or args.drive
                                        or args.cpu_only):
        print("bench: --price and --verify measure GPU agents on the compiled controller "
              "(--controller compiled, no --drive, no --cpu-only)", file=sys.stderr)
        return 2
    if args.controller == "compiled" and not args.drive:
        try:
            drive = rates.drive_model(args.drive_model) if args.drive_model else None
        except api.BadInput as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        if not args.cpu_only:
            count, why = api.gpu_probe()
            if not count:
                print(f"bench: no usable GPU: {why} (--cpu-only measures the CPU side)",
                      file=sys.stderr)
                return 2
        if args.price:
            rows, raw, missed = price_rows(args)
            head = ["size", "pairs x depth", "pollers", "products/s alone",
                    "beside idle blocks", "kept (idle)", "beside the agents", "kept",
                    "reads/s beside", "blocks"]
            title = (f"the SM price of the GPU side ({args.backend} backend, not a drive): "
                     "4096^2 float32 products beside the agents, direct doorbells")
            return _report(args, rows, raw, missed, head, title)
        args.h2d = rates.h2d_ceiling() if args.verify else 0.0
        rows, raw, missed = compiled_rows(args)
        head = ["size", "pairs x depth", "pollers"] + (
            [] if drive is None else ["rated IOPS", "model bound"]) + ["CPU reads/s"] + (
            [] if args.cpu_only else ["relay reads/s", "relay / CPU", "direct reads/s",
                                      "direct / CPU", "goal"])
        what = "not a drive" if drive is None else drive["label"]
        title = (f"compiled software NVMe controller ({args.backend} backend, {what}): "
                 f"{args.n} reads a pair a run, medians of {args.repeat}"
                 + (f"; GPU reads verified in GPU memory; pinned H2D ceiling "
                    f"{args.h2d / 1e9:.1f} GB/s" if args.verify else ""))
    elif args.drive:
        rows, raw = drive_rows(args)
        missed: list[str] = []
        head = ["path", "queues x depth", "IOPS", "CPU us/IO", ""]
        title = f"{args.drive}: 4 KiB random reads, {args.runtime} s a run"
    else:
        # the probe also asks CUDA for eager module loading: agents spin
        count, why = (1, None) if args.cpu_only else api.gpu_probe()
        if not count:
            print(f"bench: no usable GPU: {why}", file=sys.stderr)
            return 2
        rows, raw, missed = model_rows(args)
        if not args.cpu_only:
            more, extra = engine_rows(args)
            rows, raw = rows + more, raw + extra
        head = ["path", "queues x depth", "reads/s", "GPU / CPU", "goal"]
        title = (f"software NVMe controller (Python model, not a drive): {args.n} 4 KiB reads "
                 f"a run, medians of {args.repeat}")
    return _report(args, rows, raw, missed, head, title)


def _report(args: argparse.Namespace, rows: list[list], raw: list[dict], missed: list[str],
            head: list[str], title: str) -> int:
    """The table, the JSON (--json), the missed goals; exit 1 for a miss with --check."""
    api.render_rows([dict(zip(head, r)) for r in rows], "table", title=title,
                    left=(head[0],), columns=head)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "runs": raw, **({"h2d_bytes_per_s": args.h2d}
                                                      if getattr(args, "h2d", 0) else {})},
                      f, indent=1)
    for m in missed:
        print(f"bench: goal missed: {m}", file=sys.stderr)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
