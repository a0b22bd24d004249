#!/usr/bin/env python3
"""gpufio's GPU paths against their peers, in one run, on the GPU machine.

Targets it sets up itself: a tmpfs file (O_DIRECT), zram when free, and a file on the root
disk (the "slow SSD"). On each it runs gpufio's GPU engines and, with comparable settings,
fio (io_uring into host memory, and libcufile with cuda_io=posix: fio's own GPU path) and
KvikIO (its futures API straight into GPU memory, without gpufio), interleaved and repeated,
and prints medians with the ratio of each gpufio path to its peer. Every gpufio GPU run
verifies its data in GPU memory. Speed targets (the goals) live in ``GOALS`` here,
never in unit tests; ``--check`` exits 1 when one is missed.

    LD_LIBRARY_PATH=... PYTHONPATH=/tmp/site python3 -m bench.gpu --fio .peers/fio --json out.json

Run it as root on a machine with a GPU; the cuFile peers need libcufile on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from bench._common import (
    CASE_HEADERS,
    GpufioFailed,
    case_row,
    clean_up_on_sigterm,
    fio_and_root_args,
    fio_version,
    report,
    run_counted,
    run_fio,
    run_gpufio,
    setup_rootfile,
    setup_tmpfs,
    setup_zram,
    window_cpu,
    zram_ext4_file,
)
from gpufio import api

FIO_CUFILE = ["--ioengine=libcufile", "--cuda_io=posix", "--gpu_dev_ids=0"]


def api_cases() -> list[dict]:
    """On RAM with a filesystem cuFile can register (zram ext4): cuFile's own batch and stream
    APIs against the kvikio api, gpufio against gpufio, 4 KiB random reads at qd 64."""
    kvikio = {"peer": "gpufio cufile kvikio api qd64", "peer_g": {"engine": "cufile"}}
    return [
        {"path": "cufile batch", "g": {"engine": "cufile", "api": "batch"}, "depth": 64,
         "jobs": 1, **kvikio, "goal": 1.5},
        {"path": "cufile async", "g": {"engine": "cufile", "api": "async"}, "depth": 64,
         "jobs": 1, **kvikio, "goal": 1.5},
        {"path": "cufile", "g": {"engine": "cufile"}, "depth": 64, "jobs": 1,
         "peer": "fio io_uring qd64 (host memory)", "fio": ["--ioengine=io_uring"],
         "fio_jobs": 1, "fio_depth": 64},
    ]


def cases(ram: bool) -> list[dict]:
    """Each gpufio path with its peer and goal. RAM-backed targets get the deep queues the
    sweeps found best; the root disk the queue depth it saturates at (fio qd128). A case with
    ``mps`` runs under the CUDA MPS daemon, started for it and stopped after it."""
    posix16 = {"fio": FIO_CUFILE, "fio_jobs": 16, "fio_depth": 1,
                "peer": "fio libcufile posix 16 jobs"}
    seq = ["--rw=read", "--bs=1m"]
    procs = {"engine": "cpu-gpu", "segments": 4, "processes": True}
    if ram:
        uring16 = {"peer": "fio io_uring 16 jobs x qd64 (host memory)",
                   "fio": ["--ioengine=io_uring", "--fixedbufs=1", "--registerfiles=1"],
                   "fio_jobs": 16, "fio_depth": 64, "abs_goal": 4e6}
        return [
            # the defaults: 8 rings (half the cores: each SQPOLL thread hands its reads of a
            # RAM-backed target to one io-wq worker, which needs the other core), inline
            {"path": "gpu-uring", "g": {"engine": "gpu-uring", "rings": 8}, "depth": 128,
             "jobs": 1, **uring16},
            {"path": "gpu-uring IOSQE_ASYNC", "g": {"engine": "gpu-uring", "rings": 8,
                                                    "sqe_async": True},
             "depth": 512, "jobs": 1, **uring16},
            {"path": "cpu-gpu", "g": {"engine": "cpu-gpu", "segments": 4, "sqe_async": True},
             "depth": 512, "jobs": 1, **posix16, "goal": 10.0},
            # one spawned process (and CUDA context) per worker; without MPS the GPU
            # time-slices the processes' contexts, and each copy waits for its turn
            {"path": "cpu-gpu processes", "g": {**procs, "sqe_async": True}, "depth": 128,
             "jobs": 8, **posix16, "goal": 10.0, "abs_goal": 2e6},
            # the fio peer runs under the daemon too: it makes 0.54 M there, not 8 K
            {"path": "cpu-gpu processes MPS", "g": {**procs, "sqe_async": False}, "depth": 256,
             "jobs": 12, **posix16, "goal": 10.0, "abs_goal": 2e6, "mps": True},
            {"path": "cufile", "g": {"engine": "cufile"}, "depth": 64, "jobs": 1,
             "peer": "KvikIO futures qd64", "kvikio": True, "goal": 0.9},
            {"path": "mmap processes", "g": {"engine": "mmap", "processes": True}, "depth": 64,
             "jobs": 8, **posix16},
            {"path": "cpu-gpu 1m seq", "g": {"engine": "cpu-gpu", "segments": 4,
                                            "sqe_async": True, "rw": "read", "bs": "1m"},
             "depth": 64, "jobs": 1, **posix16, "fio": FIO_CUFILE + seq, "bw_goal": 20e9},
        ]
    qd = {"fio": ["--ioengine=io_uring"], "fio_jobs": 1, "fio_depth": 128,
          "peer": "fio io_uring qd128"}
    return [
        {"path": "gpu-uring", "g": {"engine": "gpu-uring", "rings": 1}, "depth": 128, "jobs": 1,
         **qd, "goal": 0.95},
        # profiles/gpu-uring.toml's settings on the drive, SQPOLL threads left to the default
        # (one per drive): the goal is a CPU per I/O of at most 1.5x fio's
        {"path": "gpu-uring defaults", "g": {"engine": "gpu-uring", "rings": 8}, "depth": 128,
         "jobs": 1, **qd, "goal": 0.95},
        # two rings of 64 served by one SQPOLL thread: the drive does the transfer, so one
        # thread submits for both at half the CPU of a thread each
        {"path": "gpu-uring 2 rings 1 SQPOLL thread", "g": {"engine": "gpu-uring", "rings": 2,
                                                            "sq_threads": 1},
         "depth": 64, "jobs": 1, **qd, "goal": 0.95},
        # 4 segments of 32: with spare landing slots a slow read no longer holds back new
        # reads, and smaller segments cost more Python per read
        {"path": "cpu-gpu", "g": {"engine": "cpu-gpu", "segments": 4}, "depth": 128,
         "jobs": 1, **qd, "goal": 0.9},
        {"path": "cufile", "g": {"engine": "cufile"}, "depth": 128, "jobs": 1, **qd, "goal": 0.9},
        # cuFile's own APIs (fio #1915, kvikio #204): batches of the whole depth, or streams
        {"path": "cufile batch", "g": {"engine": "cufile", "api": "batch"}, "depth": 128,
         "jobs": 1, **qd, "goal": 0.9},
        # cuFile runs compat-mode I/O on execution.max_io_threads threads: 4 by default
        {"path": "cufile batch 64 threads", "g": {"engine": "cufile", "api": "batch",
                                                  "threads": 64},
         "depth": 128, "jobs": 1, **qd, "goal": 0.9},
        {"path": "cufile async", "g": {"engine": "cufile", "api": "async"}, "depth": 128,
         "jobs": 1, **qd, "goal": 0.9},
        # one process's cuFile takes at most 32 I/O threads, so at most 32 compat-mode reads
        # reach the drive: 4 processes of 32 put fio's 128 there, their contexts sharing the
        # GPU through MPS (without it they take turns)
        {"path": "cufile batch processes MPS", "g": {"engine": "cufile", "api": "batch",
                                                     "threads": 32, "processes": True},
         "depth": 32, "jobs": 4, **qd, "goal": 0.9, "mps": True},
        # 4 x 32 left fewer than 128 reads on the drive (IOPS x p50 said so):
        # more processes, each with a thread per read it keeps in flight
        {"path": "cufile batch 8 processes MPS", "g": {"engine": "cufile", "api": "batch",
                                                       "threads": 16, "processes": True},
         "depth": 16, "jobs": 8, **qd, "goal": 0.9, "mps": True},
        # the same against KvikIO driven directly: what of the gap is KvikIO's own
        {"path": "cufile", "g": {"engine": "cufile"}, "depth": 128, "jobs": 1,
         "peer": "KvikIO futures qd128", "kvikio": True, "goal": 0.9},
        # an mmap worker has one fault in flight: 16 processes are queue depth 16
        {"path": "mmap processes", "g": {"engine": "mmap", "drop_cache": True, "processes": True},
         "depth": 16, "jobs": 16, **qd, "fio_depth": 16, "peer": "fio io_uring qd16",
         "goal": 0.9},
    ]


def start_mps(directory: Path) -> Callable[[], None]:
    """The CUDA MPS daemon, so the processes of a run share the GPU instead of being
    time-sliced; children find it through the pipe directory in their environment."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    for d in env.values():
        os.makedirs(d, exist_ok=True)
    os.environ.update(env)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], check=True)

    def stop() -> None:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True)
        for key in env:
            os.environ.pop(key, None)

    return stop


def run_kvikio(target: str, iodepth: int, runtime: int) -> dict:
    """KvikIO alone (bench/kvikio_peer.py, in a cgroup of its own): iodepth futures of 4 KiB
    random reads into GPU memory, time-based; CPU per I/O over its measured window."""
    out, samples = run_counted([sys.executable, "-m", "bench.kvikio_peer", target,
                                str(iodepth), str(runtime)])
    r = json.loads(out.strip().splitlines()[-1])
    r["cpu_us"], r["cpu"] = ((1e6 * window_cpu(samples, *r["window"]) / r["ios"], "cgroup")
                             if samples and r["ios"] else (0.0, "none"))
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fio_and_root_args(ap, "fio built with libcufile", runtime=3, repeat=3)
    ap.add_argument("--targets", nargs="+", default=["tmpfs", "zram", "rootdisk"],
                    help="tmpfs, zram, rootdisk, zram-ext4 (cuFile's own APIs on RAM)")
    ap.add_argument("--paths", nargs="+",
                    help="only these gpufio paths (an engine, or a case's full name)")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    clean_up_on_sigterm()
    version = fio_version(args.fio)
    cleanups, tgts = [], {}
    rows, raw, missed = [], [], []
    try:
        if "tmpfs" in args.targets:
            path, clean = setup_tmpfs()
            cleanups.append(clean)
            tgts["tmpfs"] = (path, True)
        if "zram" in args.targets and (z := setup_zram()):
            tgts["zram"] = (z[0], True)
            cleanups.append(z[1])
        if "rootdisk" in args.targets:
            path, clean = setup_rootfile(Path(args.root_dir),
                                         api.parse_size(args.root_size, "--root-size"))
            cleanups.append(clean)
            tgts["rootdisk"] = (path, False)
        if "zram-ext4" in args.targets and (z := zram_ext4_file()):
            tgts["zram-ext4"] = (z[0], None)
            cleanups.append(z[1])
        for tname, (target, ram) in tgts.items():
            for c in (api_cases() if ram is None else cases(ram)):
                if args.paths and not {c["path"], c["path"].split()[0]} & set(args.paths):
                    continue
                g_runs, p_runs = [], []
                stop_mps = start_mps(Path("/tmp/gpufio-bench-mps")) if c.get("mps") else None
                try:
                    for _ in range(args.repeat):
                        try:
                            g_runs.append(run_gpufio(target, {**c["g"], "verify": True},
                                                     c["jobs"], c["depth"], args.runtime))
                        except GpufioFailed as e:  # say so, and go on
                            why = [str(e)]
                            missed.append(f"{tname} {c['path']}: gpufio failed: {why[0]}")
                            rows.append([tname, c["path"], f"{c['jobs']}x{c['depth']}",
                                         f"FAILED: {why[0][:120]}"] + [""] * 8)
                            break
                        if c.get("kvikio"):
                            p_runs.append(run_kvikio(target, c["depth"], args.runtime))
                        elif c.get("peer_g"):
                            p_runs.append(run_gpufio(target, {**c["peer_g"], "verify": True},
                                                     c["jobs"], c["depth"], args.runtime))
                        else:
                            p_runs.append(run_fio(args.fio, target, c["fio"], c["fio_jobs"],
                                                  c["fio_depth"], args.runtime))
                finally:
                    if stop_mps:
                        stop_mps()
                if len(g_runs) < args.repeat:
                    continue
                bs = 1 << 20 if c["g"].get("bs") == "1m" else 4096
                rows.append(case_row(tname, c, f"{c['jobs']}x{c['depth']}", c["peer"], bs,
                                     g_runs, p_runs, missed, raw))
    finally:
        for clean in cleanups:
            clean()
    return report(f"{version} · 4 KiB randread unless named · gpufio runs verified in GPU "
                  f"memory · {args.runtime}s runs, median of {args.repeat}", rows,
                  CASE_HEADERS, {"fio": version, "runs": raw}, args.json,
                  missed if args.check else [])

if __name__ == "__main__":
    sys.exit(main())
