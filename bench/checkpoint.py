#!/usr/bin/env python3
"""Checkpoint save and restore against fio's sequential write and read, in one run.

On each storage (a tmpfs directory, a directory on the root disk, with ``--targets zram`` one
on ext4 on a zram device), gpufio's checkpoint
workload saves and restores a GPU state through each GPU engine and the naive path (layout
'single', one file like fio's, and 'files', a file per shard), every round compared on the
GPU; then fio 3.42 writes a file
of the same size sequentially (io_uring, same block size and queue depth, end_fsync) and
reads it back. Ratios: gpufio's save GB/s to fio's write, restore to read, and each engine to
the naive path. The goals live here (``GOAL_FIO``, ``GOAL_NAIVE``); ``--check`` exits 1 on a
miss.

    . bench/gpu_env.sh && python3 -m bench.checkpoint --fio .peers/fio --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench._common import (
    GpufioFailed,
    clean_up_on_sigterm,
    fio_cpu_s,
    fio_version,
    gpufio,
    report,
    run_counted,
    zram_ext4_file,
)
from gpufio import api

GOAL_FIO, GOAL_NAIVE = 0.8, 3.0
# (job name, engine options, held to the goals): mmap is the loaders' way, a baseline as the
# naive path is, measured beside them but not held to gpufio's goals
ENGINES = (("cpu-gpu", {"engine": "cpu-gpu"}, True),
           ("cpu-gpu async", {"engine": "cpu-gpu", "sqe_async": True}, True),
           ("cufile", {"engine": "cufile"}, True), ("mmap", {"engine": "mmap"}, False))


def run_gpufio(directory: str, where: str, state: str, bs: str, depth: int, iterations: int,
               direct: bool) -> list[dict]:
    """One profile: a job per engine, the naive row after the first; the document's jobs."""
    glob = {"workload": "checkpoint", "layout": where, "state_size": state, "bs": bs,
            "iodepth": depth, "iterations": iterations, "direct": direct,
            "targets": [directory]}
    try:
        return gpufio({"global": glob, "job": [{"name": name, **opts}
                                               for name, opts, _ in ENGINES]})["jobs"]
    except GpufioFailed as e:
        raise SystemExit(f"bench: gpufio failed: {e}") from None


def run_fio(fio: str, path: str, rw: str, size: int, bs: str, depth: int,
            direct: bool) -> tuple[float, float | None]:
    """fio's GB/s for one sequential pass over ``size`` bytes (bytes over the job's runtime,
    a write's end_fsync included) and its CPU seconds per GB, from its cgroup over that
    runtime (kernel threads working for it included, as gpufio's process times include its
    io-wq and pool threads); None where no cgroup can be made."""
    cmd = [fio, "--name=ckpt", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
           f"--size={size}", f"--iodepth={depth}", "--ioengine=io_uring",
           f"--direct={int(direct)}", "--output-format=json",
           *(["--end_fsync=1"] if rw == "write" else [])]
    out, samples = run_counted(cmd)
    doc = json.loads(out)
    job = doc["jobs"][0]
    gb = job[rw]["io_bytes"] / 1e9
    cpu = fio_cpu_s(doc, samples, job["job_runtime"])
    return gb / (job["job_runtime"] / 1e3), cpu / gb if cpu is not None and gb else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fio", required=True, help="fio (with io_uring)")
    ap.add_argument("--state", default="4g", help="state size (and fio's file size)")
    ap.add_argument("--bs", default="4m")
    ap.add_argument("--iodepth", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--root-dir", default=str(Path.home()), help="the root-disk directory")
    ap.add_argument("--targets", nargs="+", default=["tmpfs", "rootdisk"],
                    choices=("tmpfs", "zram", "rootdisk"))
    ap.add_argument("--layouts", nargs="+", default=["single", "files"])
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    clean_up_on_sigterm()
    version = fio_version(args.fio)
    size = api.parse_size(args.state, "--state")
    rows, raw, missed = [], [], []
    goaled = {name for name, _, held in ENGINES if held}
    # ext4 on zram: RAM like tmpfs, but with O_DIRECT; room for the state and fio's copy
    zram = zram_ext4_file(2 * size + (2 << 30)) if "zram" in args.targets else None
    bases = {"tmpfs": "/dev/shm", "rootdisk": args.root_dir,
             "zram": os.path.dirname(zram[0]) if zram else None}
    try:  # the zram device is released however the run ends (SIGTERM too)
        for tname, where in ((t, lay) for t in args.targets for lay in args.layouts):
            # tmpfs has no O_DIRECT: both tools go through its pages, which are the data
            ram = tname == "tmpfs"
            base = bases[tname]
            if base is None:
                continue  # no zram here (zram_ext4_file said why)
            directory = tempfile.mkdtemp(prefix="gpufio-ckpt-bench-", dir=base)
            try:
                jobs = run_gpufio(directory, where, args.state, args.bs, args.iodepth,
                                  args.iterations, direct=not ram)
                for name in os.listdir(directory):  # room for fio's file
                    os.unlink(os.path.join(directory, name))
                peer = os.path.join(directory, "fio-ckpt.dat")
                fio_w, fio_w_cpu = run_fio(args.fio, peer, "write", size, args.bs, args.iodepth,
                                           not ram)
                api.evict([peer])
                fio_r, fio_r_cpu = run_fio(args.fio, peer, "read", size, args.bs, args.iodepth,
                                           not ram)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            raw.append({"target": tname, "layout": where, "gpufio": jobs, "fio_write_gbps": fio_w,
                        "fio_read_gbps": fio_r, "fio_cpu_s_per_gb": [fio_w_cpu, fio_r_cpu]})
            fio_cpu = (f"{fio_w_cpu:.2f}/{fio_r_cpu:.2f}" if None not in (fio_w_cpu, fio_r_cpu)
                       else "")
            for j in jobs:
                s, r = j["save"]["gb_per_s"], j["restore"]["gb_per_s"]
                vs = j.get("vs_naive")
                verdict = []
                if j["jobname"] in goaled:
                    if s < GOAL_FIO * fio_w or r < GOAL_FIO * fio_r:
                        verdict.append(f"MISS <{GOAL_FIO}x fio")
                    if vs and min(vs.values()) < GOAL_NAIVE:
                        verdict.append(f"MISS <{GOAL_NAIVE}x naive")
                    if verdict:
                        missed.append(f"{tname} {where} {j['jobname']}: {', '.join(verdict)}")
                    else:
                        verdict.append("ok")
                path = j["path"] + (" async" if j["jobname"].endswith("async") else "")
                rows.append([tname, f"{where} ({j['files']})", path, f"{s:.2f}", f"{fio_w:.2f}",
                             f"{s / fio_w:.2f}", f"{r:.2f}", f"{fio_r:.2f}", f"{r / fio_r:.2f}",
                             f"{vs['save']:.2f}/{vs['restore']:.2f}" if vs else "",
                             f"{j['save']['ttfb_ms']:.2f}/{j['restore']['ttfb_ms']:.2f}",
                             f"{j['save']['cpu_s_per_gb']:.2f}/{j['restore']['cpu_s_per_gb']:.2f}",
                             fio_cpu,
                             f"{100 * j['save']['fsync_share']:.0f}%",
                             f"{j['verify']['bad_shards']} bad / {j['verify']['bytes'] / 1e9:.1f} GB",
                             " ".join(verdict)])
    finally:
        if zram:
            zram[1]()
    return report(f"{version} · checkpoint {args.state}, bs {args.bs}, qd {args.iodepth}, "
                  f"{args.iterations} rounds", rows,
                  ["target", "layout (files)", "gpufio path", "save GB/s", "fio write", "ratio",
                   "restore GB/s", "fio read", "ratio", "vs naive s/r", "TTFB ms s/r",
                   "CPU s/GB s/r", "fio CPU s/GB w/r", "fsync", "verify", "goal"],
                  {"fio": version, "runs": raw}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
