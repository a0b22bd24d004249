"""The GNN row gather (loops/rows) and the checkpoint mover
(loops/tensors), written once over the engines' channels: with psync, uring,
mmap and null, the bytes are exactly those at each row's and each piece's offset, a row
that does not come back names its node, a short piece names shard and file, and the null
engine runs GNN and checkpoint jobs by its channel alone (rows and bytes counted, nothing
verified, and the result says so)."""

import os

import numpy as np
import pytest

from gpufio.core.errors import BadInput
from gpufio.core.requests import Channel
from gpufio.core.rows import Layout, RowFetchError, RowRequest, RowTable
from gpufio.core.targets import aligned_buffer
from gpufio.core.tensors import Extent, TensorIOError, TensorRequest
from gpufio.engines import all_engines
from gpufio.engines.null import Null
from gpufio.profile import from_dict
from gpufio.loops.tensors import ChannelMover
from gpufio.loops.rows import Gather, fetcher

ENGINES = ["psync", "uring", "mmap", "null"]
MOVING = ENGINES[:-1]


def _job(engine, **keys):
    return from_dict({"global": {"engine": engine, **keys}}, "t.toml", {}).jobs[0]


def _table(tmp_path, nodes, row_bytes, header=0, files=2):
    """A striped table of random bytes: its RowTable and each file's bytes."""
    rng = np.random.default_rng(5)
    layout = Layout(files, row_bytes, header)
    paths, data = [], []
    for t in range(files):
        raw = rng.integers(0, 256, layout.bytes_needed(t, nodes), dtype=np.uint8)
        path = tmp_path / f"feat{t}.bin"
        raw.tofile(path)
        paths.append(str(path))
        data.append(raw)
    return RowTable(tuple(paths), layout, nodes), data


def _want(data, layout, nodes, dim):
    tgt, off = layout.locate(nodes)
    return np.stack([data[t][o:o + dim * 4] for t, o in zip(tgt.tolist(), off.tolist())]
                    ).view(np.float32)


@pytest.mark.parametrize("engine", MOVING)
@pytest.mark.parametrize("row_bytes,dim,header", [(4096, 1024, 4096), (256, 40, 100)])
def test_gathered_rows_are_the_bytes_at_each_rows_offset(tmp_path, engine, row_bytes, dim,
                                                         header):
    table, data = _table(tmp_path, 500, row_bytes, header)
    nodes = np.random.default_rng(2).integers(0, 500, 300)
    g = fetcher(all_engines()[engine], _job(engine), table, np,
                RowRequest(dim=dim, max_rows=100, direct=True, iodepth=8))
    try:
        assert isinstance(g, Gather)
        for batch in (nodes[:50], nodes, nodes[::-1]):  # past max_rows: the buffers grow
            got = g.fetch(batch)
            assert got.shape == (len(batch), dim)
            assert np.array_equal(got.view(np.uint8), _want(data, table.layout, batch, dim)
                                  .view(np.uint8))
        assert g.rows == 650
    finally:
        g.close()


def test_the_mapping_takes_the_advice_and_says_so(tmp_path):
    table, _ = _table(tmp_path, 64, 4096)
    g = fetcher(all_engines()["mmap"], _job("mmap"), table, np,
                RowRequest(dim=1024, max_rows=8, direct=False, advice="random"))
    try:
        g.fetch(np.arange(8))
        assert g.facts["mmap_advice"] == "random" and g.page_cache
    finally:
        g.close()


@pytest.mark.parametrize("engine", MOVING)
def test_a_row_past_the_end_of_its_file_names_its_node(tmp_path, engine):
    table, _ = _table(tmp_path, 100, 512)
    os.truncate(table.paths[1], 40 * 512 + 100)  # node 81 (file 1, row 40) is cut short
    g = Gather(all_engines()[engine], _job(engine), table, np,
               RowRequest(dim=128, max_rows=8, direct=False))
    try:
        with pytest.raises(RowFetchError, match=r"feature row of node 81 \(short read of 100 "
                                                r"bytes\)"):
            g.fetch(np.array([2, 81, 3]))
    finally:
        g.close()


class _Wedged(Channel):
    """Takes requests and never completes one."""

    n = 0

    @property
    def inflight(self):
        return self.n

    def submit(self, tgt, off, length, addr, write, tag):
        k = min(self.room(), len(off))
        self.n += k
        return k

    def reap(self, wait_ns):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    def state(self):
        return "wedged on purpose"


class _WedgedEngine(Null):
    @classmethod
    def channel(cls, job, files, spec):
        return _Wedged(spec)


def test_a_stalled_gather_and_a_stalled_save_say_where_the_path_stood(tmp_path, monkeypatch):
    from gpufio.loops import steps

    monkeypatch.setattr(steps, "STALL_LIMIT_NS", 50_000_000)  # the one rule, at 0.05 s
    table, _ = _table(tmp_path, 10, 512)
    g = Gather(_WedgedEngine, _job("null"), table, np, RowRequest(dim=8, max_rows=4, direct=False))
    with pytest.raises(RowFetchError, match="feature rows: 4 I/Os in flight and none completed for 0.05 s: wedged"):
        g.fetch(np.arange(4))
    g.close()
    files = _files(tmp_path, 1)
    mover = ChannelMover(_WedgedEngine, _job("null"), files, [Extent(0, 0, 0, 8192)], np,
                         TensorRequest(4096, 2, False))
    with pytest.raises(TensorIOError, match="save: 2 I/Os in flight and none completed for 0.05 s: wedged"):
        mover.save([np.zeros(8192, np.uint8)])
    _close(files)


class _File:
    def __init__(self, path, fd):
        self.path, self.fd = path, fd


def _files(tmp_path, n, size=0):
    out = []
    for i in range(n):
        path = str(tmp_path / f"ckpt{i}.dat")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, size)
        out.append(_File(path, fd))
    return out


def _close(files):
    for f in files:
        os.close(f.fd)


def _shards(sizes, seed):
    """Page-aligned host shards (O_DIRECT-ready) of random bytes (each array keeps its
    memory)."""
    shards = [np.frombuffer(aligned_buffer(n), np.uint8)[:n] for n in sizes]
    rng = np.random.default_rng(seed)
    for shard in shards:
        shard[:] = rng.integers(0, 256, len(shard), dtype=np.uint8)
    return shards


@pytest.mark.parametrize("engine", MOVING)
def test_saved_pieces_land_at_their_offsets_and_restore_exactly(tmp_path, engine):
    extents = [Extent(0, 0, 0, 3 * 4096), Extent(1, 1, 8192, 4096), Extent(2, 0, 16384, 8192)]
    files = _files(tmp_path, 2, 32768)
    saved = _shards([e.nbytes for e in extents], 1)
    restored = _shards([e.nbytes for e in extents], 2)
    mover = ChannelMover(all_engines()[engine], _job(engine), files, extents, np,
                         TensorRequest(chunk=4096, iodepth=4, direct=False))
    try:
        assert mover.save(saved) > 0
        mover.sync()
        for e, s in zip(extents, saved):
            with open(files[e.file].path, "rb") as f:
                f.seek(e.offset)
                assert f.read(e.nbytes) == s.tobytes()
        assert mover.restore(restored) > 0
        assert all(np.array_equal(a, b) for a, b in zip(saved, restored))
        assert mover.facts["chunk"] == 4096
    finally:
        mover.close()
        _close(files)


@pytest.mark.parametrize("engine", MOVING)
def test_a_short_piece_names_shard_and_file(tmp_path, engine):
    extents = [Extent(0, 0, 0, 4096), Extent(7, 0, 4096, 8192)]
    files = _files(tmp_path, 1, 4096 + 4096 + 1000)  # the second piece of shard 7 is short
    shards = _shards([e.nbytes for e in extents], 3)
    mover = ChannelMover(all_engines()[engine], _job(engine), files, extents, np,
                         TensorRequest(chunk=4096, iodepth=2, direct=False))
    try:
        with pytest.raises(TensorIOError, match=rf"restore of shard 7: {files[0].path} at byte "
                                                r"8192: 1000 of 4096 bytes"):
            mover.restore(shards)
    finally:
        mover.close()
        _close(files)


def test_the_mmap_sync_unmaps_so_a_restore_maps_the_files_again(tmp_path):
    files = _files(tmp_path, 1, 8192)
    shards = _shards([8192], 4)
    mover = ChannelMover(all_engines()["mmap"], _job("mmap"), files, [Extent(0, 0, 0, 8192)],
                         np, TensorRequest(chunk=4096, iodepth=2, direct=False))
    try:
        mover.save(shards)
        assert any(m is not None for m in mover.channel._maps)
        mover.sync()
        assert all(m is None for m in mover.channel._maps)
        assert mover.page_cache
    finally:
        mover.close()
        _close(files)


def test_a_gnn_job_on_the_null_engine_counts_its_rows_and_verifies_none(tmp_path):
    from gpufio.workloads.gnn.run import run_job

    g = {"workload": "gnn", "engine": "null", "device": "cpu", "nodes": 2000,
         "feature_dim": 32, "hidden": 8, "batch_size": 32, "fanout": [4, 2], "iterations": 3,
         "warmup": 1, "directory": str(tmp_path)}
    r = run_job(from_dict({"global": g}, "g.toml", {}).jobs[0])
    assert r["error"] == 0 and r["iterations_done"] == 3 and r["moves_data"] is False
    assert r["aggregation"]["rows"] > 0
    assert r["aggregation"]["bytes"] == r["aggregation"]["rows"] * 128
    assert r["verify"]["rows_checked"] == 0 and "moves no data" in r["verify"]["skipped"]


def test_a_checkpoint_job_on_the_null_engine_moves_its_bytes_uncompared(tmp_path):
    from gpufio.workloads.checkpoint import driver

    glob = {"workload": "checkpoint", "engine": "null", "device": "cpu", "state_size": "1m",
            "iterations": 2, "bs": "256k", "naive": False, "targets": [str(tmp_path)]}
    doc = driver.run_profile(from_dict({"global": glob}, "ck.toml", {}), quiet=True)
    (job,) = doc["jobs"]
    assert job["error"] == 0 and job["iterations_done"] == 2 and job["moves_data"] is False
    assert [r["bytes"] for r in job["rounds"]] == [1 << 20, 1 << 20]
    assert job["verify"]["bytes"] == 0 and "moves no data" in job["verify"]["skipped"]


def test_what_the_channels_offer_is_derived_from_their_capability():
    e = all_engines()
    assert e["null"].row_support() is not None and not e["null"].row_support().gpu_only
    assert e["mmap"].row_support().advice and e["mmap"].row_support().baseline
    assert e["uring"].tensor_support().host and not e["uring"].tensor_support().gpu
    assert e["mmap"].tensor_support().gpu  # a GPU engine's host channel: pinned rounds
    assert e["gpu-uring"].tensor_support() is None  # its gather is its own, on the GPU
    assert "rows" in e["psync"].host_memory() and "tensors" in e["null"].host_memory()
    with pytest.raises(BadInput, match="engine 'null': moves shards in host memory only, so "
                                       "it needs device = \"cpu\""):
        from_dict({"global": {"workload": "checkpoint", "engine": "null", "device": "gpu"}},
                  "ck.toml", {})
