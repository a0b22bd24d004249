"""mmap's block jobs on the one GPU-memory block loop (loops/block_staged) over its channel, checked
on the CPU: the page-locked staging stood in for by host memory whose "copy" checks the
pattern where the GPU would. tests/engines/test_cpugpu.py runs the same jobs into GPU memory."""

from __future__ import annotations

import ast
import mmap as mm
import os
from pathlib import Path

import numpy as np
import pytest

from gpufio import engines
from gpufio.core import pattern
from gpufio.core.requests import ChannelSpec
from gpufio.engines.mmap import MmapChannel, Mmap, page_runs
from gpufio.profile import from_dict
from gpufio.loops import block_staged as staged
from gpufio.core.requests import CHANNEL
from gpufio.loops.block import loop_class
from gpufio.workloads.block import runner

SEED = 1234  # conftest's pattern_file


def _run(path, **opts):
    glob = {"engine": "test-mmap", "targets": [str(path)], "iodepth": 8, **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_mmap_defines_a_channel_and_no_loop_over_batches():
    """Its block jobs run in loops/block_staged's loop over its channel, as cpu-gpu's do."""
    tree = ast.parse(Path(engines.__file__).with_name("mmap.py").read_text())
    loops = [n.attr for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in ("next_batch", "last_writes", "due")]
    runs = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert loops == [] and runs == []
    job = from_dict({"global": {"engine": "mmap", "targets": ["/x"], "size": "1m"}},
                    "t.toml", {}).jobs[0]
    assert Mmap.primitive(job) == CHANNEL and loop_class(Mmap, job) is staged.StagedLoop


def test_every_block_read_lands_the_bytes_at_its_offset(host_mmap, pattern_file):
    r = _run(pattern_file, rw="randread", verify=True, numjobs=2, io_size="1m")
    assert r.ok and r.verify_failures == 0 and r.ios == 2 * 256 and r.bytes == r.ios * 4096
    assert r.lat.n == r.ios
    # one gather and one copy a batch of iodepth blocks, as the loaders double-buffer
    assert {k for s in host_mmap for _, k in s.copies} == {8}
    assert r.engine_facts["batch"] == 8 and r.engine_facts["page_cache"] is True


def test_a_corrupted_block_is_caught_and_named(host_mmap, pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(8192)
        f.write(b"\0" * 4096)
    r = _run(pattern_file, rw="read", verify=True, io_size="64k", segments=2)
    assert r.verify_failures == 1 and r.ios == 16
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 8192}]
    assert {k for s in host_mmap for _, k in s.copies} == {4}  # segments of iodepth / 2


def test_a_replayed_log_off_the_block_grid_lands_each_ios_bytes(host_mmap, pattern_file,
                                                                 tmp_path):
    """I/Os between blocks (mmap refused such a log before): each request copied alone."""
    offs = [0, 1024, 8192, 4096 + 512, 12288]
    log = tmp_path / "t.iolog"
    log.write_text("fio version 2 iolog\n" + "".join(
        f"{pattern_file} {what}\n" for what in
        ["add", "open", *(f"read {o} 4096" for o in offs), "close"]))
    glob = {"engine": "test-mmap", "read_iolog": str(log), "iodepth": 8, "verify": True}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    assert r.ok and r.ios == len(offs) and r.verify_failures == 0


def test_writes_store_the_pattern_count_fsyncs_and_read_back_verified(host_mmap, tmp_path,
                                                                      monkeypatch):
    out = tmp_path / "w.dat"
    submit = MmapChannel.submit

    def logged(self, *args):
        host_mmap[-1].log.append("store")
        return submit(self, *args)

    monkeypatch.setattr(MmapChannel, "submit", logged)
    r = _run(out, rw="write", bs="64k", size="1m", iodepth=4, verify=True)
    # the next batch is copied down while this one is stored (double buffering)
    assert host_mmap[0].log[:3] == ["copy down", "copy down", "store"]
    assert r.ok and r.write.ios == 16 and r.verify_failures == 0
    r = _run(out, rw="write", bs="64k", size="1m", fsync=4, verify=True)
    assert r.ok and r.write.ios == 16 and r.syncs == 4 and r.verify_failures == 0
    data = out.read_bytes()
    words = np.frombuffer(data, "<u8")
    seed = pattern.read_seed(data[:4096])
    assert seed is not None
    assert np.array_equal(words, pattern.expected_words(seed, 0, len(data)))
    r = _run(out, rw="randwrite", size="1m", io_size="512k", verify=True, numjobs=2)
    assert r.ok and r.write.ios == 2 * 128 and r.verify_failures == 0


def _channel(files, **spec):
    return MmapChannel(files, ChannelSpec(depth=8, **spec), drop_cache=False)


class _File:
    def __init__(self, path, flags=os.O_RDWR):
        self.path, self.fd = str(path), os.open(path, flags)


@pytest.mark.parametrize("access,advice", [("random", mm.MADV_RANDOM),
                                           ("sequential", mm.MADV_SEQUENTIAL),
                                           (None, mm.MADV_NORMAL)])
def test_the_loops_access_pattern_becomes_the_mappings_advice(pattern_file, access, advice):
    f = _File(pattern_file, os.O_RDONLY)
    ch = _channel([f], access=access)
    buf = np.zeros(2 * 4096, np.uint8)
    try:
        assert ch._advice == advice
        addr = np.uint64(buf.ctypes.data) + np.array([0, 4096], np.uint64)
        ch.submit(np.zeros(2, np.int64), np.array([40960, 4096]), np.full(2, 4096), addr,
                  False, np.arange(2))
        assert ch.reap(None)[1].tolist() == [4096, 4096]
    finally:
        ch.close()
        os.close(f.fd)
    assert not len(pattern.bad_ios_host(buf, np.array([40960, 4096]), SEED, 4096))


def test_coming_writes_ask_for_their_pages_in_runs():
    """The pages a write batch will store into are asked for ahead (MADV_WILLNEED): one
    range per run of adjacent blocks of one target, a range per block otherwise."""
    offs = np.array([0, 4096, 8192, 40960, 12288, 16384, 512 + 65536], np.int64)
    tgt = np.array([0, 0, 0, 0, 0, 1, 1])
    runs = page_runs(tgt, offs, np.full(len(offs), 4096))
    assert runs == [(0, 0, 12288), (0, 40960, 4096), (0, 12288, 4096), (1, 16384, 4096),
                    (1, 65536, 4608)]


class _Flushes:
    """A mapping whose msyncs are counted."""

    def __init__(self, m):
        self.m, self.flushed = m, 0

    def flush(self):
        self.flushed += 1
        self.m.flush()

    def close(self):
        self.m.close()


@pytest.mark.parametrize("bs", [4096, 64 << 10])  # 64 KiB: MADV_POPULATE_WRITE first
def test_a_write_batch_is_stored_at_its_offsets_and_flushed_by_finish(tmp_path, bs):
    """expect() maps the files writable and asks for the pages; submit() stores every
    block (one store per file for blocks a whole number apart); finish() msyncs each
    mapping written through."""
    paths = [tmp_path / "a", tmp_path / "b"]
    for p in paths:
        p.write_bytes(bytes(8 * bs))
    files = [_File(p) for p in paths]
    ch = _channel(files, writes=True)
    try:
        tgt = np.array([0, 1, 0, 1], np.int64)
        offs = np.array([2, 0, 0, 4], np.int64) * bs
        lengths = np.full(4, bs, np.int64)
        ch.expect(tgt, offs, lengths, True)
        assert ch._writable == [True, True]
        src = np.zeros((4, bs), np.uint8)
        seeds = np.array([7, 8, 7, 8], np.uint64)
        pattern.fill_ios(src, offs.astype(np.uint64), seeds)
        addr = np.uint64(src.ctypes.data) + np.arange(4, dtype=np.uint64) * np.uint64(bs)
        assert ch.submit(tgt, offs, lengths, addr, True, np.arange(4)) == 4
        tags, res = ch.reap(None)
        assert tags.tolist() == [0, 1, 2, 3] and res.tolist() == [bs] * 4
        assert len(ch.times()) == 4  # each timed as its call, as a synchronous channel's
        ch._maps = [_Flushes(m) for m in ch._maps]
        ch.finish()
        assert [m.flushed for m in ch._maps] == [1, 1]
    finally:
        ch.close()
        for f in files:
            os.close(f.fd)
    data = [np.frombuffer(p.read_bytes(), np.uint8) for p in paths]
    for t, off, seed in zip(tgt.tolist(), offs.tolist(), seeds.tolist()):
        block = data[t][off:off + bs].copy()
        assert not len(pattern.bad_ios_host(block, np.array([off]), seed, bs)), (t, off)
