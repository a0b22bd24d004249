"""The staged block loop (loops/block_staged) over cpu-gpu's io_uring channel, its staging
in host memory (conftest.host_cpugpu): the bytes that land are the bytes at each offset, and
the segments issued in one pass go to the channel in one call."""

import pytest

from gpufio.io.uring_channel import UringChannel
from gpufio.profile import from_dict
from gpufio.workloads.block import runner


@pytest.fixture
def calls(monkeypatch):
    """The number of requests of each call to the io_uring channel's submit, in order."""
    made = []
    submit = UringChannel.submit

    def counted(self, tgt, off, *rest):
        made.append(len(off))
        return submit(self, tgt, off, *rest)

    monkeypatch.setattr(UringChannel, "submit", counted)
    return made


def _run(path, **opts):
    glob = {"engine": "test-cpu-gpu", "targets": [str(path)], "bs": "4k", "direct": True, **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_every_read_lands_the_bytes_at_its_offset(host_cpugpu, pattern_file):
    r = _run(pattern_file, rw="randread", verify=True, iodepth=16, segments=4, io_size="2m")
    assert r.ok and r.verify_failures == 0 and r.ios == 512 and r.bytes == 512 * 4096
    assert r.lat.n == r.ios
    # every segment landed whole: 512 reads in copies of at most 16 / 4 slots
    copies = [k for s in host_cpugpu for _, k in s.copies]
    assert sum(copies) == 512 and max(copies) == 4


def test_a_corrupted_block_is_caught_and_named(host_cpugpu, pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(12288)
        f.write(b"\0" * 4096)
    r = _run(pattern_file, rw="read", verify=True, iodepth=8, segments=2, io_size="64k")
    assert r.verify_failures == 1 and r.ios == 16
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 12288}]


def test_segments_issued_in_one_pass_go_out_in_one_channel_call(host_cpugpu, pattern_file,
                                                                 calls):
    r = _run(pattern_file, rw="read", verify=True, iodepth=8, segments=4, io_size="256k")
    assert r.ok and r.verify_failures == 0 and r.ios == 64
    # the first pass issues all four segments of 2 reads: one call of 8, not four of 2
    assert calls[0] == 8 and sum(calls) == 64


def test_a_rate_capped_pass_hands_each_segment_over_as_it_is_issued(host_cpugpu, pattern_file,
                                                                    calls):
    """Under a rate cap the next batch may wait for its due time: the segments issued
    before it must not wait with it."""
    r = _run(pattern_file, rw="read", verify=True, iodepth=8, segments=4, io_size="64k",
             rate_iops=20_000)
    assert r.ok and r.verify_failures == 0 and r.ios == 16
    assert max(calls) <= 2 and sum(calls) == 16


def test_mmap_keeps_its_one_gather_a_segment(host_mmap, pattern_file, monkeypatch):
    """A synchronous channel gets each segment alone, its slots one run of rows: mmap's
    one-gather path (engines/mmap._rows) takes every call, none falls back to a copy per
    request."""
    from gpufio.engines.mmap import MmapChannel

    shapes = []
    rows = MmapChannel._rows

    def watched(self, *args):
        got = rows(self, *args)
        shapes.append(got is not None)
        return got

    monkeypatch.setattr(MmapChannel, "_rows", watched)
    glob = {"engine": "test-mmap", "targets": [str(pattern_file)], "bs": "4k", "rw": "randread",
            "iodepth": 16, "segments": 4, "io_size": "2m", "verify": True}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    assert r.ok and r.verify_failures == 0 and r.ios == 512
    assert shapes and all(shapes)


@pytest.mark.parametrize("iodepth,segments", [(1, 1), (3, 2), (4, 3), (7, 3), (16, 16)])
def test_a_landed_segment_is_checked_as_it_landed_though_checked_later(
        host_cpugpu, pattern_file, iodepth, segments):
    """A landed segment is checked and recorded after the next reads go out (or before its
    slots are reused): whatever the shapes, the one bad block is found at its offset and
    every read is recorded once."""
    with open(pattern_file, "r+b") as f:
        f.seek(40960)
        f.write(b"\0" * 4096)
    r = _run(pattern_file, rw="read", verify=True, iodepth=iodepth, segments=segments,
             io_size="512k")
    assert r.ios == 128 and r.lat.n == 128 and r.verify_failures == 1
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 40960}]
