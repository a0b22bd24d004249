"""The CPU-mediated GPU engines, cpu-gpu and mmap: bytes checked in GPU memory (needs a GPU)."""

import json

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import targets
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

pytestmark = pytest.mark.gpu
cli = CliRunner()


def run(path, engine="cpu-gpu", **opts):
    glob = {"engine": engine, "targets": [str(path)], **opts}
    return runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True)


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "bs": "4k", "iodepth": 32},
    {"rw": "read", "bs": "64k", "iodepth": 8, "segments": 2},
    {"rw": "randread", "bs": "4k", "iodepth": 1},
    {"rw": "randread", "bs": "16k", "iodepth": 30, "numjobs": 2},
])
def test_bytes_in_gpu_memory_match_the_pattern(opts, pattern_file):
    (r,) = run(pattern_file, verify=True, io_size="2m", **opts).results
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    assert r.verify_failures == 0
    assert r.ios == r.job.numjobs * (2 << 20) // r.job.bs
    assert r.lat.n == r.ios and r.lat.min > 0
    assert r.engine_facts["lands_in"] == "gpu memory"


def test_a_corrupted_block_is_caught_in_gpu_memory(pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(5 * 4096 + 999)
        f.write(b"\xff\xfe")
    (r,) = run(pattern_file, verify=True, rw="read", size="64k", iodepth=4).results
    assert r.verify_failures == 1 and not r.ok
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 5 * 4096}]


def test_two_targets_time_based(tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 1 << 20, 1)
    targets.create_file(str(b), 1 << 20, 2)
    out = runner.run_profile(from_dict({"global": {
        "engine": "cpu-gpu", "targets": [str(a), str(b)], "verify": True, "iodepth": 16,
        "runtime": "500ms", "time_based": True}}, "t.toml", {}), quiet=True)
    (r,) = out.results
    assert r.ok and r.ios > 0 and 0.45e9 < r.runtime_ns < 0.8e9
    assert abs(r.per_target[0]["ios"] - r.per_target[1]["ios"]) <= 16


def test_gpu_index_out_of_range_is_bad_input(write_profile, pattern_file):
    path = write_profile(f'[global]\nengine = "cpu-gpu"\ntargets = ["{pattern_file}"]\ngpu = 99\n')
    res = cli.invoke(app, ["run", str(path), "-q"])
    assert res.exit_code == 2
    assert "key 'gpu'/'gpus': GPU 99 is out of range" in res.stderr


def test_cli_json_reports_gpu_facts(write_profile, pattern_file):
    path = write_profile(f'[global]\nengine = "cpu-gpu"\ntargets = ["{pattern_file}"]\n'
                         'io_size = "1m"\niodepth = 16\n')
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["gpus"] and doc["gpus"][0]["name"]
    assert doc["jobs"][0]["read"]["total_ios"] == 256


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "bs": "4k", "iodepth": 32},
    {"rw": "read", "bs": "64k", "iodepth": 4, "drop_cache": True},
    {"rw": "randread", "bs": "4k", "iodepth": 1, "numjobs": 2},
])
def test_mmap_bytes_in_gpu_memory_match_the_pattern(opts, pattern_file):
    (r,) = run(pattern_file, engine="mmap", verify=True, io_size="1m", **opts).results
    assert r.ok, (r.failure, r.bad_offsets)
    assert r.ios == r.job.numjobs * (1 << 20) // r.job.bs and r.lat.n == r.ios
    assert r.engine_facts["page_cache"] is True


def test_mmap_catches_a_corrupted_block_and_reads_two_targets(pattern_file, tmp_path):
    with open(pattern_file, "r+b") as f:
        f.seek(7 * 4096 + 12)
        f.write(b"\x00\x01")
    other = tmp_path / "other.dat"
    targets.create_file(str(other), 1 << 20, 9)
    out = runner.run_profile(from_dict({"global": {
        "engine": "mmap", "targets": [str(pattern_file), str(other)], "verify": True,
        "rw": "read", "size": "64k", "iodepth": 8}}, "t.toml", {}), quiet=True)
    (r,) = out.results
    assert r.verify_failures == 1 and r.per_target[1]["verify_failures"] == 0
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 7 * 4096}]
    assert [p["ios"] for p in r.per_target] == [16, 16]
