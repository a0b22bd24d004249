"""Writes from GPU memory on every GPU engine (needs a GPU): the pattern generated on the GPU
lands at its offsets, a read-back through the same engine proves it, a torn block is caught
at its offset, fsyncs are counted; plus the combinations each engine refuses (no GPU needed)."""

import pytest

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.profile import from_dict

from gpu_cases import GPU_ENGINES, IDS as GPU_IDS, run_case as run

# the cases up to cpu-gpu's process workers: mmap's and cufile's in processes are
# test_gpu_engines.py's alone
ENGINES, IDS = GPU_ENGINES[:8], GPU_IDS[:8]


@pytest.fixture
def zero_file(tmp_path):
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(1 << 20))
    return path


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_writes_from_gpu_memory_land_as_the_pattern(engine, zero_file):
    (w,) = run(engine, zero_file, rw="write", overwrite=True, verify=True).results
    assert w.ok, (w.failure, w.errors, w.bad_offsets)
    assert w.write.ios == 256 and w.read.ios == 0 and w.verify_failures == 0
    assert w.phases[0]["ios"] == 256 and w.phases[0]["ok"]
    assert zero_file.read_bytes() == pattern.fill(0x89, 0, 1 << 20)
    (r,) = run(engine, zero_file, rw="randread", verify=True, io_size="1m").results
    assert r.ok and r.verify_failures == 0


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES, ids=IDS)
def test_random_writes_verified_by_read_back(engine, pattern_file):
    (w,) = run(engine, pattern_file, rw="randwrite", bs="8k", verify=True,
               io_size="2m").results
    assert w.ok and w.write.ios == 256 and w.verify_failures == 0
    assert w.write.lat.n == 256 and w.phases[0]["ios"] == 256


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES[:4], ids=IDS[:4])
def test_a_torn_block_is_caught_by_the_read_back(engine, zero_file, torn_on_read_back):
    torn = 7 * 4096

    with torn_on_read_back(zero_file, torn + 9, b"\xff"):
        (w,) = run(engine, zero_file, quiet=False, rw="write", overwrite=True,
                   verify=True).results
    assert w.verify_failures == 1
    assert w.bad_offsets == [{"target": str(zero_file), "offset": torn}]


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES[:3], ids=IDS[:3])
def test_fsync_every_n_writes_from_gpu_memory(engine, pattern_file):
    (w,) = run(engine, pattern_file, rw="write", io_size="256k", fsync=16).results
    assert w.ok and w.write.ios == 64 and w.syncs == 4


@pytest.mark.gpu
def test_cufile_mixes_reads_and_writes(pattern_file):
    (r,) = run({"engine": "cufile", "iodepth": 8}, pattern_file, rw="randrw", verify=True,
               io_size="1m").results
    assert r.ok and r.read.ios + r.write.ios == 256 and r.read.ios and r.write.ios
    assert r.verify_failures == 0


@pytest.mark.parametrize("engine,opts,why", [
    ("gpu-uring", {"rw": "randrw"}, "either read or write"),
    ("gpu-uring", {"rw": "write", "fsync": 4}, "use end_fsync"),
    ("cpu-gpu", {"rw": "readwrite"}, "one way at a time"),
    ("mmap", {"rw": "randrw"}, "one way"),
])
def test_engines_say_what_they_cannot_write(engine, opts, why):
    with pytest.raises(BadInput, match=why):
        from_dict({"global": {"engine": engine, "size": "1m", **opts}}, "t.toml", {})
