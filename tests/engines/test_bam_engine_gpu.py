"""engine = "bam" on a GPU against the software NVMe controllers (controller = "model",
"compiled") and, for block jobs, QEMU's (controller = "qemu", relayed doorbells as qtest
register writes): block jobs whose commands GPU threads write, with relay and direct
doorbells, verified in GPU memory; writes read back verified; end_fsync as one NVMe Flush
from a GPU thread; the result names the submitter, the doorbells and the controller. A few
thousand I/Os each (the model is a Python loop).

    python3 -m pytest -q -p no:cacheprovider tests/engines/test_bam_engine_gpu.py
"""

from __future__ import annotations

import pytest

from gpufio.core import pattern, targets
from gpufio.io.nvme import qemu
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

pytestmark = pytest.mark.gpu
CONTROLLERS = [
    {"controller": "model"},
    {"controller": "compiled", "controller_threads": 2},
    pytest.param({"controller": "qemu", "submitter": "gpu"}, marks=[
        pytest.mark.qemu,
        pytest.mark.skipif(qemu.binary() is None, reason="no qemu-system-x86_64 here")]),
]


def _relay_only(ctl: dict, doorbells: str) -> None:
    if ctl["controller"] == "qemu" and doorbells == "direct":
        pytest.skip("QEMU's doorbells are reached over qtest only (the relay)")


def run(path, **opts):
    glob = {"engine": "bam", "controller": "model", "targets": [str(path)], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


@pytest.mark.parametrize("ctl", CONTROLLERS, ids=["model", "compiled", "qemu"])
@pytest.mark.parametrize("doorbells", ["relay", "direct"])
@pytest.mark.parametrize("opts", [
    {"rw": "randread", "iodepth": 16, "numjobs": 2},
    {"rw": "read", "iodepth": 5, "bs": "12k"},
    {"rw": "randread", "iodepth": 8, "bs": "64k", "model_lba": 4096},
])
def test_block_reads_through_gpu_threads_verify_in_gpu_memory(tmp_path, ctl, doorbells, opts):
    _relay_only(ctl, doorbells)
    path = tmp_path / "ns.dat"
    targets.create_file(str(path), 4 << 20, 7)
    r = run(path, **ctl, doorbells=doorbells, verify=True, io_size="2m", **opts)
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    bs = r.job.bs
    assert r.ios == opts.get("numjobs", 1) * (2 << 20) // bs and r.verify_failures == 0
    f = r.engine_facts
    assert f["submitter"] == "gpu" and f["doorbells"] == doorbells
    assert f["controller"] == ctl["controller"]
    assert f["mode"] == f"gpu, {doorbells} doorbells, {ctl['controller']} controller"
    if doorbells == "relay":
        assert sum(f["relay_writes"]) > 0
    else:
        assert "relay_writes" not in f


@pytest.mark.parametrize("ctl", CONTROLLERS, ids=["model", "compiled", "qemu"])
@pytest.mark.parametrize("doorbells", ["relay", "direct"])
def test_writes_land_as_the_pattern_flushed_and_read_back_verified(tmp_path, ctl, doorbells):
    _relay_only(ctl, doorbells)
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(1 << 20))
    w = run(path, **ctl, doorbells=doorbells, rw="write", bs="8k", iodepth=8, overwrite=True,
            verify=True, end_fsync=True)
    assert w.ok, (w.failure, w.errors, w.bad_offsets)
    assert w.write.ios == 128 and w.verify_failures == 0 and w.phases[0]["ok"]
    assert w.syncs == 1  # one NVMe Flush from a GPU thread
    assert path.read_bytes() == pattern.fill(0x89, 0, 1 << 20)
    r = run(path, **ctl, doorbells=doorbells, rw="randread", iodepth=8, verify=True,
            io_size="1m")
    assert r.ok and r.verify_failures == 0, (r.failure, r.bad_offsets)


@pytest.mark.parametrize("doorbells", ["relay", "direct"])
def test_gnn_rows_through_gpu_threads_land_verified(tmp_path, doorbells):
    from gpufio.workloads.gnn.run import run_job

    prof = from_dict({"global": {
        "workload": "gnn", "engine": "bam", "controller": "model", "doorbells": doorbells,
        "device": "gpu", "nodes": 4_000, "feature_dim": 128, "hidden": 32, "batch_size": 64,
        "fanout": [3, 2], "iterations": 4, "warmup": 1, "verify_rows": 100_000,
        "iodepth": 16, "directory": str(tmp_path)}}, "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0, r.get("failure")
    assert r["verify"]["mismatches"] == 0 and r["verify"]["rows_checked"] >= 4 * 64


def test_gnn_rows_through_the_gpu_cache(tmp_path):
    import cupy as cp
    import numpy as np

    from gpufio.core.rows import RowRequest
    from gpufio.engines.bam import Bam
    from gpufio.loops.rows import fetcher
    from gpufio.workloads.gnn import dataset, features

    job = from_dict({"global": {
        "workload": "gnn", "engine": "bam", "controller": "model", "device": "gpu",
        "nodes": 4_000, "feature_dim": 128, "batch_size": 16, "iodepth": 8,
        "directory": str(tmp_path)}}, "g.toml", {}).jobs[0]
    ds = dataset.prepare(job)
    request = RowRequest(dim=128, max_rows=4_000, direct=True, cache_bytes=1 << 20, iodepth=8)
    f = fetcher(Bam, job, ds.table, cp, request)
    try:
        nodes = np.random.default_rng(3).choice(4_000, 500, replace=False)
        for _ in range(2):
            got = f.fetch(cp.asarray(nodes))
            want = features.values(job.randseed, cp.asarray(nodes), 128, cp)
            assert not bool((got != want).any())
        assert f.counters() == {"hits": 500, "reads": 500, "coalesced": 0}
        assert f.facts["mode"] == "gpu, direct doorbells, model controller"
    finally:
        f.close()


def test_gnn_rows_over_several_queue_pairs_land_verified_from_every_pair(tmp_path):
    """row_pairs = 3 on the compiled controller (2 poller threads) over a table striped on
    two files: every row lands as the table holds it, every pair completed reads, and the
    facts name the 3 pairs."""
    import cupy as cp
    import numpy as np

    from gpufio.core.rows import RowRequest
    from gpufio.engines.bam import Bam
    from gpufio.loops.rows import fetcher
    from gpufio.workloads.gnn import dataset, features

    job = from_dict({"global": {
        "workload": "gnn", "engine": "bam", "controller": "compiled", "controller_threads": 2,
        "row_pairs": 3, "device": "gpu", "nodes": 4_000, "feature_dim": 128, "stripes": 2,
        "batch_size": 16, "iodepth": 8, "directory": str(tmp_path)}}, "g.toml", {}).jobs[0]
    ds = dataset.prepare(job)
    assert ds.table.layout.ntargets == 2
    request = RowRequest(dim=128, max_rows=4_000, direct=True, iodepth=8)
    f = fetcher(Bam, job, ds.table, cp, request)
    try:
        nodes = np.random.default_rng(4).choice(4_000, 1_000, replace=False)
        got = f.fetch(cp.asarray(nodes))
        want = features.values(job.randseed, cp.asarray(nodes), 128, cp)
        assert not bool((got != want).any())
        assert f.facts["queue_pairs"] == 3 and f.facts["iodepth"] == 8
        done = f.queue.progress[:, 1]  # completions per pair (NvmeQueues)
        assert len(done) == 3 and (done > 0).all() and int(done.sum()) == 1_000
    finally:
        f.close()
    # close read the pollers' busy time before the controller stopped: both threads serve
    assert f.facts["controller_threads"] == 2 and f.facts["controller_busy_ns"] > 0


def test_doctor_probes_the_io_memory_registration_on_a_gpu():
    from gpufio.io.gio.backends import nvme

    (probe, relay) = nvme.gpu_doctor_checks("bam", [], 16, None)
    assert probe.name == "BAR as CUDA I/O memory" and probe.status in ("ok", "warn")
    assert ("taken" in probe.found) is (probe.status == "ok")  # either way, CUDA's answer
    assert relay.name == "doorbell relay"
