"""bench/gather.py's own logic, without a GPU: the profiles it writes and its verdicts."""

import argparse
import json

from bench import gather
from gpufio.api import load


def _args(**kw):
    base = dict(dir="/dev/shm/g", nodes=250_000, batch=1024, fanout=[10, 5, 5], iterations=25,
                warmup=5, runtime=3, engines=["gpu-uring", "cpu-gpu"])
    return argparse.Namespace(**{**base, **kw})


def test_the_gather_jobs_carry_no_tuning_keys_and_the_block_jobs_the_benchs():
    gnn = gather.gnn_profile(_args())
    block = gather.block_profile(_args(), "/dev/shm/g/t.f32")
    text = json.dumps(gnn)
    assert not any(key in text for key in ("iodepth", "rings", "sqe_async"))
    jobs = {j.name: j for j in load(gnn).jobs}
    assert sorted(jobs) == ["gather-cpu-gpu", "gather-gpu-uring"]
    assert jobs["gather-gpu-uring"].workload_options["batch_size"] == 1024
    reads = {j.name: j for j in load(block).jobs}
    assert list(reads["block-gpu-uring"].targets) == ["/dev/shm/g/t.f32"]
    assert reads["block-gpu-uring"].bs == 4096 and reads["block-gpu-uring"].random
    assert reads["block-cpu-gpu"].iodepth == 512


def _gnn(engine, rate, bad=0):
    return {"jobname": f"gather-{engine}", "engine": engine, "error": int(bad > 0),
            "aggregation": {"iops": rate}, "fetch": {"iodepth": 128, "rings": 8},
            "verify": {"mismatches": bad, "rows_checked": 64}}


def test_the_verdict_is_the_gathers_rows_per_s_over_its_block_reads():
    gnn = {"jobs": [_gnn("gpu-uring", 4.0e6), _gnn("cpu-gpu", 0.7e6)]}
    block = {"jobs": [{"jobname": "block-gpu-uring", "read": {"iops": 5.0e6}},
                      {"jobname": "block-cpu-gpu", "read": {"iops": 1.0e6}}]}
    rows, missed = gather.judge(gnn, block)
    assert [r[4] for r in rows] == ["0.80", "0.70"] and [r[-1] for r in rows] == ["ok", "MISS <0.8"]
    assert rows[0][1] == "iodepth 128, rings 8"
    assert missed == ["cpu-gpu: gather 0.70x its block reads"]
    gnn["jobs"][0] = _gnn("gpu-uring", 4.5e6, bad=1)  # fast but wrong rows: a miss
    assert gather.judge(gnn, block)[1][0] == "gpu-uring: gather 0.90x its block reads"
