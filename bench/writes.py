#!/usr/bin/env python3
"""gpufio's writes on every engine against fio's, in one run, on the GPU machine.

On a tmpfs file, a file on ext4 on a zram device (``--targets zram``) and a file on the root
disk (each carrying gpufio's pattern), each engine
writes 4 KiB random and 1 MiB sequential blocks, verified by its read-back, beside fio's
io_uring writing from host memory at the same queue depth; gpu-uring's 4 KiB random writes
also stand beside fio io_uring with 16 jobs. Medians and ratios are printed; the
goals live in ``goal`` / ``bw_goal`` here, and ``--check`` exits 1 when one is missed.

    . bench/gpu_env.sh && python3 -m bench.writes --fio .peers/fio --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench._common import (
    CASE_HEADERS,
    GpufioFailed,
    case_row,
    clean_up_on_sigterm,
    fio_and_root_args,
    fio_version,
    report,
    run_fio,
    run_gpufio,
    setup_rootfile,
    setup_tmpfs,
    zram_ext4_file,
)
from gpufio import api

URING = ["--ioengine=io_uring", "--fixedbufs=1", "--registerfiles=1"]
FILES = 8
SHAPES = {"4k randwrite": (["--rw=randwrite", "--bs=4k"], {"rw": "randwrite", "bs": "4k"}),
          "1m write": (["--rw=write", "--bs=1m"], {"rw": "write", "bs": "1m"})}


def cases(ram: bool) -> list[dict]:
    """(engine options, jobs, depth, fio jobs, goal) per path; every engine at fio's depth."""
    depth = 64 if ram else 128
    out = []
    # cuFile's own batch API cannot register tmpfs files (no udev record): root disk only
    raw_api = () if ram else ({"engine": "cufile", "api": "batch"},)
    for engine in ({"engine": "psync"}, {"engine": "uring", "fixedbufs": True},
                   {"engine": "cpu-gpu", "segments": 4}, {"engine": "mmap"},
                   {"engine": "cufile"}, *raw_api,
                   {"engine": "gpu-uring", "rings": 1 if not ram else 8}):
        d = 1 if engine["engine"] in ("psync",) else depth
        name = " ".join([engine["engine"]] + ([engine["api"]] if "api" in engine else []))
        for shape in SHAPES:
            out.append({"path": f"{name} {shape}", "g": engine, "shape": shape,
                        "depth": d if engine["engine"] != "gpu-uring" or not ram else 128,
                        "fio_jobs": 1, "fio_depth": d, "goal": None if ram else 0.9})
    if not ram:
        # the loaders' path beside fio's own mmap engine (stores through a shared mapping, a
        # synchronous engine: one I/O at a time), not a goal: what the path itself costs
        for shape in SHAPES:
            out.append({"path": f"mmap {shape} vs fio mmap", "g": {"engine": "mmap"},
                        "shape": shape, "depth": depth, "fio_jobs": 1, "fio_depth": 1,
                        "fio_engine": ["--ioengine=mmap"], "goal": None})
    if ram:
        out.append({"path": "gpu-uring 4k randwrite vs 16 jobs", "g": {"engine": "gpu-uring",
                                                                      "rings": 8},
                    "shape": "4k randwrite", "depth": 128, "fio_jobs": 16, "fio_depth": 64,
                    "goal": 0.6})
        out.append({"path": "cpu-gpu 1m write GB/s", "g": {"engine": "cpu-gpu", "segments": 4,
                                                          "sqe_async": True},
                    "shape": "1m write", "depth": 64, "fio_jobs": 1, "fio_depth": 64,
                    "bw_goal": 20e9})
        # tmpfs serialises writes into one file on its inode lock (fio's one job makes about
        # 4 GB/s into one): the same writes spread over FILES files, fio's too
        out.append({"path": f"cpu-gpu 1m write GB/s, {FILES} files",
                    "g": {"engine": "cpu-gpu", "segments": 4, "sqe_async": True},
                    "shape": "1m write", "depth": 64, "fio_jobs": 1, "fio_depth": 64,
                    "bw_goal": 20e9, "files": FILES})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fio_and_root_args(ap, "fio (with io_uring)", runtime=2, repeat=1)
    ap.add_argument("--targets", nargs="+", default=["tmpfs", "rootdisk"],
                    choices=("tmpfs", "zram", "rootdisk"))
    ap.add_argument("--paths", nargs="+", help="only cases whose name starts with one of these")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    clean_up_on_sigterm()
    version = fio_version(args.fio)
    cleanups, tgts, rows, raw, missed = [], {}, [], [], []
    try:
        if "tmpfs" in args.targets:
            path, clean = setup_tmpfs()
            cleanups.append(clean)
            tgts["tmpfs"] = (path, True)
            extra = [f"{path}.{i}" for i in range(1, FILES)]
            for p in extra:
                api.lay_out(p, 1 << 30, 7)
                cleanups.append(lambda p=p: os.unlink(p))
            many = ":".join([path, *extra])
        if "zram" in args.targets and (z := zram_ext4_file()):
            cleanups.append(z[1])
            tgts["zram"] = (z[0], True)
        if "rootdisk" in args.targets:
            path, clean = setup_rootfile(Path(args.root_dir),
                                         api.parse_size(args.root_size, "--root-size"))
            cleanups.append(clean)
            tgts["rootdisk"] = (path, False)
        for tname, (target, ram) in tgts.items():
            for c in cases(ram):
                if args.paths and not any(c["path"].startswith(p) for p in args.paths):
                    continue
                if (c.get("files") or "bw_goal" in c) and tname != "tmpfs":
                    continue  # tmpfs's own cases: its inode lock, the GB/s goal set on it
                fio_shape, g_shape = SHAPES[c["shape"]]
                target_of = many if c.get("files") else target
                g_runs, p_runs = [], []
                for _ in range(args.repeat):
                    try:
                        # fio's writes replace the pattern: gpufio writes it again (overwrite)
                        # and its read-back checks exactly the blocks it wrote
                        g_runs.append(run_gpufio(target_of, {**c["g"], **g_shape, "verify": True,
                                                          "overwrite": True},
                                                 1, c["depth"], args.runtime))
                    except GpufioFailed as e:
                        print(f"bench: {tname} {c['path']}: gpufio failed: {e}",
                              file=sys.stderr, flush=True)
                        break
                    p_runs.append(run_fio(args.fio, target_of, c.get("fio_engine", URING)
                                          + fio_shape, c["fio_jobs"], c["fio_depth"],
                                          args.runtime))
                if not g_runs:
                    missed.append(f"{tname} {c['path']}: failed")
                    continue
                bs = 1 << 20 if c["shape"] == "1m write" else 4096
                peer = "fio mmap" if "fio_engine" in c else "fio io_uring"
                rows.append(case_row(tname, c, f"1x{c['depth']}",
                                     f"{peer} {c['fio_jobs']}x{c['fio_depth']}", bs,
                                     g_runs, p_runs, missed, raw))
    finally:
        for clean in cleanups:
            clean()
    return report(f"{version} · writes, gpufio verified by read-back · {args.runtime}s runs, "
                  f"median of {args.repeat}", rows,
                  CASE_HEADERS, {"fio": version, "runs": raw}, args.json, missed if args.check else [])


if __name__ == "__main__":
    sys.exit(main())
