"""KvikIO alone, the peer of gpufio's cufile engine: ``iodepth`` futures of 4 KiB random
reads into GPU memory, time-based, through its futures API and no gpufio code. Prints one
JSON line: IOPS, p50/p99 latency (ns), I/Os, the measured window (Unix ms) and KvikIO's
mode. bench/gpu.py runs it in a cgroup of its own to count its CPU:

    python3 -m bench.kvikio_peer TARGET IODEPTH RUNTIME_S
"""

from __future__ import annotations

import argparse
import json
import os
import time

BS = 4096


def _size(target: str) -> int:
    """The bytes a file or block device holds."""
    size = os.stat(target).st_size
    if size == 0:  # a block device: its sysfs size, in 512-byte sectors
        with open(f"/sys/block/{os.path.basename(target)}/size") as f:
            size = int(f.read()) * 512
    return size


def run(target: str, iodepth: int, runtime: float) -> dict:
    """Keep ``iodepth`` reads in flight for ``runtime`` seconds; the numbers."""
    import cupy as cp
    import kvikio
    import kvikio.defaults
    import numpy as np

    kvikio.defaults.set({"num_threads": iodepth, "task_size": BS, "gds_threshold": 0,
                         "bounce_buffer_size": BS, "auto_direct_io_read": True})
    f = kvikio.CuFile(target, "r")
    buf = cp.empty((iodepth, BS), cp.uint8)
    offs = (np.random.default_rng(1).integers(0, _size(target) // BS, 1 << 22) * BS).tolist()
    futs: list = [None] * iodepth
    t_issue = [0] * iodepth
    lats: list[int] = []
    k = 0

    def issue(s: int) -> None:
        nonlocal k
        t_issue[s] = time.perf_counter_ns()
        futs[s] = f.pread(buf[s], BS, offs[k % len(offs)], task_size=BS)
        k += 1

    end = time.perf_counter() + runtime
    for s in range(iodepth):
        issue(s)
    done = 0
    t0, t0_ms = time.perf_counter(), time.time() * 1e3
    while time.perf_counter() < end:
        for s in range(iodepth):
            if futs[s].done():
                futs[s].get()
                lats.append(time.perf_counter_ns() - t_issue[s])
                done += 1
                issue(s)
    dt, t1_ms = time.perf_counter() - t0, time.time() * 1e3
    for fu in futs:
        fu.get()
    mode = "compat" if kvikio.defaults.is_compat_mode_preferred() else "gds"
    return {"iops": done / dt, "p50": float(np.percentile(lats, 50)),
            "p99": float(np.percentile(lats, 99)), "ios": done, "window": [t0_ms, t1_ms],
            "mode": mode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", help="file or block device to read")
    ap.add_argument("iodepth", type=int, help="futures in flight")
    ap.add_argument("runtime", type=float, help="seconds")
    args = ap.parse_args()
    print(json.dumps(run(args.target, args.iodepth, args.runtime)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
