"""The one block loop (loops/block_host.py): the CPU engines define a channel and no loop over
the context's batches, and a new engine gets block jobs (reads, verify, writes, a mix,
fsync) by implementing only ``channel``."""

from __future__ import annotations

import ast

import pytest

from gpufio.engines import all_engines
from gpufio.profile import from_dict
from gpufio.core.requests import CHANNEL
from gpufio.workloads.block import runner

from checkout import REPO

ENGINES = REPO / "gpufio" / "engines"
CHANNEL_ENGINES = ["uring", "psync", "null", "uring_cmd"]


@pytest.mark.parametrize("module", CHANNEL_ENGINES)
def test_the_cpu_engines_define_a_channel_and_no_loop_over_batches(module):
    """Nothing in these modules asks the context for I/Os or defines an engine's run: the
    block loop does, once, for all of them."""
    tree = ast.parse((ENGINES / f"{module}.py").read_text())
    loops = [f"line {n.lineno}: {n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in ("next_batch", "last_writes", "due")]
    runs = [f"line {n.lineno}: {n.name}" for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name in ("run", "_run", "_run_compiled")]
    channels = [n.name for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and n.name == "channel"]
    assert loops == [] and runs == [] and channels == ["channel"]


def _job(engine: str, **opts):
    return from_dict({"global": {"engine": engine, "size": "1m", **opts}}, "p.toml", {}).jobs[0]


@pytest.mark.parametrize("name", ["uring", "psync", "null", "uring-cmd"])
def test_their_block_jobs_run_in_the_block_loop(name):
    assert all_engines()[name].primitive(_job(name)) == CHANNEL


@pytest.mark.parametrize("opts, loop", [({}, True), ({"submitter": "cpu"}, True),
                                        ({"submitter": "gpu"}, False),
                                        ({"controller": "model"}, False)])
def test_bam_s_cpu_stand_in_runs_in_the_block_loop_and_gpu_threads_in_its_own(opts, loop):
    assert (all_engines()["bam"].primitive(_job("bam", **opts)) == CHANNEL) is loop


def _run(path, **opts):
    glob = {"engine": "test-pread", "targets": [str(path)], "iodepth": 4, **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_a_new_engine_gets_block_jobs_by_implementing_only_its_channel(pread_engine,
                                                                       pattern_file, tmp_path):
    assert pread_engine.primitive(_job("test-pread")) == CHANNEL
    r = _run(pattern_file, rw="randread", verify=True, numjobs=2, io_size="1m")
    assert r.ok and r.verify_failures == 0 and r.ios == 2 * 256 and r.bytes == r.ios * 4096
    assert r.lat.n == r.ios

    # a corrupted block is caught by the loop's verify
    with open(pattern_file, "r+b") as f:
        f.seek(8192)
        f.write(b"\0" * 4096)
    r = _run(pattern_file, rw="read", verify=True, io_size="64k")
    assert r.verify_failures == 1
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 8192}]

    out = tmp_path / "w.dat"
    r = _run(out, rw="write", size="256k", fsync=16, verify=True)
    assert r.ok and r.write.ios == 64 and r.syncs == 4
    r = _run(out, rw="randrw", rwmixread=50, size="256k", io_size="256k", verify=True)
    assert r.ok and r.read.ios + r.write.ios == 64 and r.verify_failures == 0
