"""What every GPU engine must do (needs a GPU): land the right bytes in GPU memory for odd
shapes (12 KiB blocks, a target that is not a multiple of bs, several targets), catch a
planted bad block, spread workers over GPUs, and leave nothing behind when interrupted."""

import os

import numpy as np
import pytest

from gpufio.core import targets
from gpufio.engines import all_engines
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

from gpu_cases import GPU_ENGINES, IDS, run_case as run

pytestmark = pytest.mark.gpu


@pytest.fixture
def odd_targets(tmp_path):
    """Two pattern targets whose sizes are not multiples of 12 KiB."""
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), (3 << 20) + 4096, 11)
    targets.create_file(str(b), (2 << 20) + 8192, 12)
    return a, b


@pytest.mark.parametrize("engine", GPU_ENGINES, ids=IDS)
@pytest.mark.parametrize("rw", ["randread", "read"])
def test_odd_sizes_and_several_targets_land_verified(engine, rw, odd_targets):
    (r,) = run(engine, odd_targets, rw=rw, bs="12k", verify=True, io_size="3m").results
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    assert r.ios == (3 << 20) // (12 << 10) and r.verify_failures == 0
    assert r.bytes == r.ios * 12288 and r.lat.n == r.ios
    assert sum(p["ios"] for p in r.per_target) == r.ios
    assert all(p["ios"] > 0 for p in r.per_target)
    assert r.engine_facts["lands_in"] == "gpu memory"


@pytest.mark.parametrize("engine", GPU_ENGINES, ids=IDS)
def test_a_planted_bad_block_is_caught(engine, pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(9 * 4096 + 2048)
        f.write(b"\xde\xad")
    (r,) = run(engine, [pattern_file], rw="read", size="128k", verify=True).results
    assert not r.ok and r.verify_failures == 1
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 9 * 4096}]
    assert r.ios == 32


@pytest.mark.parametrize("engine", GPU_ENGINES, ids=IDS)
def test_a_bad_block_read_again_and_again_counts_each_time_and_taints_no_other(engine,
                                                                             pattern_file):
    """Four passes over the file: buffers and their check marks are reused many times, and
    the bad block fails each pass, no other block ever."""
    with open(pattern_file, "r+b") as f:
        f.seek(5 * 4096 + 512)
        f.write(b"\xde\xad")
    (r,) = run(engine, [pattern_file], rw="read", size="128k", io_size="512k",
               verify=True).results
    assert r.ios == 128 and r.verify_failures == 4
    assert {b["offset"] for b in r.bad_offsets} == {5 * 4096}


@pytest.mark.parametrize("engine", GPU_ENGINES, ids=IDS)
def test_workers_spread_over_gpus_round_robin(engine, pattern_file):
    (r,) = run(engine, [pattern_file], numjobs=2, gpus=[0, 0], verify=True, io_size="1m").results
    assert r.ok and r.ios == 2 * 256
    assert r.engine_facts["gpus"] == [0, 0]


def _uring_fds() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if "io_uring" in _link(fd))


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.mark.parametrize("engine", GPU_ENGINES, ids=IDS)
def test_ctrl_c_keeps_results_and_frees_rings_and_gpu_memory(engine, pattern_file):
    import cupy

    pool = cupy.get_default_memory_pool()
    run(engine, [pattern_file], io_size="256k")  # warm up CuPy and compile kernels
    before = (pool.used_bytes(), _uring_fds())
    ticks = []

    def interrupt(snapshots):
        ticks.append(snapshots)
        if len(ticks) == 6:
            raise KeyboardInterrupt

    if why := all_engines()[engine["engine"]].unavailable():
        pytest.skip(why)
    prof = from_dict({"global": {**engine, "targets": [str(pattern_file)], "runtime": "30s",
                                 "time_based": True, "verify": True}}, "t.toml", {})
    out = runner.run_profile(prof, on_tick=interrupt, quiet=True, tick_every_s=0.1)
    (r,) = out.results
    assert out.interrupted and r.interrupted and r.ios > 0 and r.verify_failures == 0
    assert r.runtime_ns < 5e9
    assert (pool.used_bytes(), _uring_fds()) == before
    assert np.isfinite(r.lat.mean)


def test_gpu_targets_limit_each_gpus_reads_and_spawned_workers_sit_on_its_node(odd_targets):
    a, b = odd_targets
    engine = {"engine": "cpu-gpu", "iodepth": 8, "processes": True}
    (r,) = run(engine, odd_targets, rw="randread", verify=True, io_size="1m", numjobs=2,
               gpu_targets={"0": [str(a)]}).results
    assert r.ok and [p["ios"] for p in r.per_target] == [r.ios, 0]
    assert r.engine_facts["gpu_targets"] == {"0": [str(a)]}
    from gpufio.io.gpu import gpu_facts
    from gpufio.run.placement import gpu_cpus

    want = gpu_cpus(gpu_facts(), 0)
    pinned = r.engine_facts["worker_cpus"]
    assert len(pinned) == 2 and all(w["cpus"] == (want or w["cpus"]) for w in pinned)
