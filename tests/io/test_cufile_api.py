"""cuFile's batch API queue (io/cufile_api) against a stand-in for cuda.bindings.cufile that
moves real bytes between real files and host memory: the C structs as laid out, entries
completing a few at a time, failures, the driver's batch limit, a refused handle."""

from __future__ import annotations

import ctypes
import errno
import os
from types import SimpleNamespace

import numpy as np
import pytest

from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.engines import cufile
from gpufio.io import cufile_api

BS = 4096


class FakeCuFile:
    """cuFile's batch calls over pread/pwrite; at most ``per_poll`` completions a poll."""

    SizeTConfigParameter = SimpleNamespace(PROPERTIES_IO_BATCHSIZE=9)

    def __init__(self, limit: int = 128, per_poll: int = 3, fail_offset: int = -1) -> None:
        self.limit, self.per_poll, self.fail_offset = limit, per_poll, fail_offset
        self.fds: dict[int, int] = {}
        self.batches: dict[int, list[tuple[int, int, int]]] = {}
        self.submits: list[int] = []
        self.destroyed: list[int] = []
        self.deregistered: list[int] = []

    def get_parameter_size_t(self, param: int) -> int:
        assert param == 9
        return self.limit

    def handle_register(self, descr: int) -> int:
        d = np.frombuffer((ctypes.c_char * 24).from_address(descr), cufile_api.DESCR)[0]
        assert d["type"] == cufile_api.HANDLE_TYPE_FD
        if d["fd"] < 0:
            raise RuntimeError("HANDLE_NOT_REGISTERED (5027)")
        handle = 1000 + len(self.fds)
        self.fds[handle] = int(d["fd"])
        return handle

    def handle_deregister(self, handle: int) -> None:
        self.deregistered.append(handle)

    def batch_io_set_up(self, nr: int) -> int:
        assert nr <= self.limit
        h = 500 + len(self.batches)
        self.batches[h] = []
        return h

    def batch_io_submit(self, h: int, nr: int, ptr: int, flags: int) -> None:
        assert not self.batches[h], "a handle takes a batch only when its last one is reaped"
        params = np.frombuffer((ctypes.c_char * (64 * nr)).from_address(ptr), cufile_api.PARAMS)
        self.submits.append(nr)
        for p in params:
            assert p["mode"] == cufile_api.BATCH_MODE
            mem = (ctypes.c_char * int(p["size"])).from_address(int(p["base"] + p["buf_offset"]))
            fd, off = self.fds[int(p["fh"])], int(p["file_offset"])
            if off == self.fail_offset:
                self.batches[h].append((int(p["cookie"]), cufile_api.FAILED, -errno.EIO))
                continue
            if p["opcode"] == cufile_api.OP_WRITE:
                n = os.pwrite(fd, bytes(mem), off)
            else:
                n = os.preadv(fd, [memoryview(mem).cast("B")], off)
            self.batches[h].append((int(p["cookie"]), cufile_api.COMPLETE, n))

    def batch_io_get_status(self, h: int, min_nr: int, nr: int, events: int, timeout: int) -> None:
        assert min_nr == 0
        want = np.frombuffer((ctypes.c_char * 4).from_address(nr), np.uint32)
        assert np.frombuffer((ctypes.c_char * 16).from_address(timeout), np.int64).tolist() == [0, 0]
        got = self.batches[h][:min(int(want[0]), self.per_poll)]
        del self.batches[h][:len(got)]
        ev = np.frombuffer((ctypes.c_char * (24 * max(len(got), 1))).from_address(events),
                           cufile_api.EVENTS)
        for i, (cookie, status, ret) in enumerate(got):
            ev[i] = (cookie, status, ret)
        want[0] = len(got)

    def batch_io_cancel(self, h: int) -> None:
        self.batches[h].clear()

    def batch_io_destroy(self, h: int) -> None:
        self.destroyed.append(h)


@pytest.fixture(autouse=True)
def fresh_handles(monkeypatch):
    """Each test its own process-wide handle table (each has its own stand-in cuFile)."""
    monkeypatch.setattr(cufile_api, "_handles", {})


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "t.dat"
    path.write_bytes(pattern.fill(77, 0, 64 * BS))
    fd = os.open(path, os.O_RDWR)
    yield path, fd
    os.close(fd)


def _queue(cf, fd, depth, batch):
    buf = np.zeros(depth * BS, np.uint8)
    handles = [cufile_api.register_handle(cf, fd, "t.dat")]
    return buf, cufile_api.BatchQueue(cf, handles, buf.ctypes.data, depth, batch)


def _submit(q, buf, slots, offs, write=False):
    """Requests of one target, each into its own BS slot of ``buf``, tagged by slot."""
    slots = np.asarray(slots, np.int64)
    n = len(slots)
    addr = np.uint64(buf.ctypes.data) + slots.astype(np.uint64) * np.uint64(BS)
    return q.submit(np.zeros(n, np.int64), np.asarray(offs, np.int64), np.full(n, BS),
                    addr, write, slots)


def _drain(q):
    slots, res = [], []
    while q.busy():
        s, r = q.poll()
        slots += s.tolist()
        res += r.tolist()
    return slots, res


def test_batches_read_every_block_to_its_slot(target):
    path, fd = target
    cf = FakeCuFile(per_poll=3)
    buf, q = _queue(cf, fd, depth=10, batch=4)
    assert q.room() == 12  # three handles of four: enough for the depth
    slots = np.arange(10, dtype=np.int64)
    offs = np.array([9, 3, 0, 63, 17, 5, 5, 40, 1, 2], np.int64) * BS
    assert _submit(q, buf, slots, offs) == 10
    assert cf.submits == [4, 4, 2] and q.room() == 0 and q.busy() == 10
    done, res = _drain(q)
    assert sorted(done) == list(range(10)) and res == [BS] * 10
    rows = buf.reshape(10, BS)
    for s, off in zip(slots, offs):
        assert rows[s].tobytes() == pattern.fill(77, int(off), BS)
    assert q.room() == 12
    q.close()
    assert len(cf.destroyed) == 3


def test_a_handle_is_reused_only_once_its_batch_is_reaped(target):
    _, fd = target
    cf = FakeCuFile(per_poll=1)
    buf, q = _queue(cf, fd, depth=4, batch=2)
    _submit(q, buf, np.arange(4), np.arange(4) * BS)
    q.poll()  # one entry of each handle reaped: neither is idle yet
    assert q.room() == 0 and q.busy() == 2
    q.poll()
    assert q.room() == 4
    _submit(q, buf, [1, 3], np.array([8, 9]) * BS)  # the fake asserts its handle is idle
    assert _drain(q)[1] == [BS, BS]


def test_writes_land_at_their_offsets(target):
    path, fd = target
    cf = FakeCuFile()
    buf, q = _queue(cf, fd, depth=2, batch=2)
    rows = buf.reshape(2, BS)
    rows[0] = np.frombuffer(pattern.fill(5, 20 * BS, BS), np.uint8)
    rows[1] = np.frombuffer(pattern.fill(5, 30 * BS, BS), np.uint8)
    _submit(q, buf, [0, 1], np.array([20, 30]) * BS, write=True)
    assert _drain(q)[1] == [BS, BS]
    data = path.read_bytes()
    assert data[20 * BS:21 * BS] == pattern.fill(5, 20 * BS, BS)
    assert data[30 * BS:31 * BS] == pattern.fill(5, 30 * BS, BS)
    assert data[21 * BS:22 * BS] == pattern.fill(77, 21 * BS, BS)


def test_a_failed_entry_is_minus_errno(target):
    _, fd = target
    cf = FakeCuFile(fail_offset=3 * BS)
    buf, q = _queue(cf, fd, depth=3, batch=3)
    _submit(q, buf, np.arange(3), np.array([2, 3, 4]) * BS)
    done, res = _drain(q)
    assert dict(zip(done, res)) == {0: BS, 1: -errno.EIO, 2: BS}


def test_batch_size_over_the_drivers_limit_is_one_line_naming_it():
    cf = FakeCuFile(limit=64)
    job = SimpleNamespace(name="j", iodepth=256)
    with pytest.raises(BadInput, match=r"^job 'j': iodepth_batch 100 is more than cuFile's "
                                       r"max_batch_io_size here \(64, properties.io_batchsize"):
        cufile.batch_size(job, SimpleNamespace(iodepth_batch=100), cf)
    assert cufile.batch_size(job, SimpleNamespace(iodepth_batch=0), cf) == 64  # the limit
    assert cufile.batch_size(SimpleNamespace(name="j", iodepth=18),
                             SimpleNamespace(iodepth_batch=0), cf) == 5  # four batches or so


def test_cufile_io_threads_outside_the_drivers_range_are_one_line(monkeypatch):
    class Binding(FakeCuFile):
        SizeTConfigParameter = SimpleNamespace(PROPERTIES_IO_BATCHSIZE=9,
                                               EXECUTION_MAX_IO_THREADS=2)

        def get_parameter_min_max_value(self, param):
            assert param == 2
            return 0, 32

        def set_parameter_size_t(self, param, value):
            self.threads = value

        def driver_open(self):
            self.opened = True

    import sys
    import types

    fake = Binding()
    for name in ("cuda", "cuda.bindings"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cuda.bindings.cufile", fake)
    monkeypatch.setattr(cufile_api, "_open", {})
    with pytest.raises(BadInput, match=r"threads 64 is outside cuFile's execution.max_io_threads "
                                       r"range here \(0 to 32\)"):
        cufile_api.binding(64)
    assert not hasattr(fake, "opened")
    assert cufile_api.binding(32) is fake and fake.threads == 32 and fake.opened


def test_a_refused_handle_names_the_target_and_what_to_check():
    with pytest.raises(BadInput, match=r"^target /mnt/x: cuFileHandleRegister refused it "
                                       r"\(HANDLE_NOT_REGISTERED \(5027\)\).*allow_compat_mode"):
        cufile_api.register_handle(FakeCuFile(), -1, "/mnt/x")


def test_workers_sharing_a_descriptor_share_its_handle(target):
    _, fd = target
    cf = FakeCuFile()
    a = cufile_api.register_handle(cf, fd, "t.dat")
    b = cufile_api.register_handle(cf, fd, "t.dat")  # cuFile itself refuses a second (5028)
    assert a == b and len(cf.fds) == 1
    cufile_api.deregister_handle(cf, fd)
    assert cf.deregistered == []
    cufile_api.deregister_handle(cf, fd)
    assert cf.deregistered == [a]


def test_results_map_cufile_statuses_to_errno():
    status = np.array([cufile_api.COMPLETE, cufile_api.FAILED, cufile_api.CANCELED,
                       cufile_api.TIMEOUT, cufile_api.FAILED])
    ret = np.array([4096, -errno.ENOSPC, 0, 0, 7])
    assert cufile_api._result(status, ret).tolist() == [
        4096, -errno.ENOSPC, -errno.ECANCELED, -errno.ETIMEDOUT, -errno.EIO]


@pytest.mark.parametrize("key,value,api,msg", [
    ("iodepth_batch", 8, "kvikio", "iodepth_batch is for api 'batch'"),
    ("streams", 4, "batch", "streams is for api 'async'"),
])
def test_api_options_out_of_place_are_one_line_errors(write_profile, pattern_file, run_quietly,
                                                      key, value, api, msg):
    path = write_profile(f'[global]\nengine = "cufile"\ntargets = ["{pattern_file}"]\n'
                         f'api = "{api}"\n{key} = {value}\n')
    res = run_quietly(path)
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and msg in res.stderr


def test_the_api_is_part_of_the_label():
    from gpufio.engines.base import label

    assert label("cufile", {"mode": "compat", "api": "batch"}) == "cufile batch (compat)"


class PoolBinding:
    """cuFile's POSIX pool parameters as libcufile keeps them (size_t arrays by address);
    ``closed_get``: libcufile 1.15 reports the pool only once its driver is open; ``keeps``:
    the counts it holds whatever was set."""

    def __init__(self, sizes=(4, 1024, 16384), counts=(128, 64, 32), get_error=None,
                 set_error=None, closed_get=False, keeps=None):
        self.sizes, self.counts = list(sizes), list(counts)
        self.get_error, self.set_error, self.sets = get_error, set_error, []
        self.closed_get, self.keeps, self.open = closed_get, keeps, False

    def get_parameter_posix_pool_slab_array(self, sizes, counts, n):
        if self.get_error or (self.closed_get and not self.open):
            raise self.get_error or RuntimeError("INVALID_VALUE (5022)")
        assert n == len(self.sizes)
        (ctypes.c_size_t * n).from_address(sizes)[:] = self.sizes
        (ctypes.c_size_t * n).from_address(counts)[:] = self.keeps or self.counts

    def set_parameter_posix_pool_slab_array(self, sizes, counts, n):
        if self.set_error:
            raise self.set_error
        self.sets.append((list((ctypes.c_size_t * n).from_address(sizes)),
                          list((ctypes.c_size_t * n).from_address(counts))))
        self.sizes, self.counts = self.sets[-1]

    def driver_open(self):
        self.open = True


def test_the_bounce_buffer_class_of_the_io_gets_a_buffer_per_io_in_flight():
    """128 writes of 1 MiB in flight hung cuFile's submit with the 1 MiB class's default 64
    buffers: that class is raised to 128; a class already large enough is left alone."""
    cf = PoolBinding()
    assert cufile_api.size_pool(cf, 1 << 20, 128) == {
        "asked_from": "libcufile", "slab_kb": [4, 1024, 16384], "count": [128, 128, 32],
        "sized": True}
    assert cf.sets == [([4, 1024, 16384], [128, 128, 32])]
    cf = PoolBinding()
    assert cufile_api.size_pool(cf, 4096, 128)["count"] == [128, 64, 32] and cf.sets == []
    assert cufile_api.size_pool(PoolBinding(), 8192, 16)["count"] == [128, 64, 32]
    assert cufile_api.size_pool(PoolBinding(), 2 << 20, 40)["count"] == [128, 64, 40]


def test_a_pool_not_reported_before_the_driver_opens_is_sized_from_cufile_json(
        monkeypatch, tmp_path):
    """On the H200 machine libcufile refused to report the pool before cuFileDriverOpen
    (INVALID_VALUE), so the counts to raise come from cufile.json (comments and all)."""
    conf = tmp_path / "cufile.json"
    conf.write_text('{ // the admin\'s\n "properties": {"posix_pool_slab_size_kb": [4, 2048, 8192],'
                    ' "posix_pool_slab_count": [16, 8, 4]}}')
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(conf))
    assert cufile_api.configured_pool() == ([4, 2048, 8192], [16, 8, 4])
    cf = PoolBinding(closed_get=True)
    assert cufile_api.size_pool(cf, 1 << 20, 128) == {
        "asked_from": "cufile.json", "slab_kb": [4, 2048, 8192], "count": [16, 128, 4],
        "sized": True}
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", str(tmp_path / "none.json"))
    assert cufile_api.configured_pool() == cufile_api.DEFAULT_POOL


def test_what_the_open_driver_holds_is_recorded_and_a_count_not_taken_is_not_sized():
    asked = {"asked_from": "cufile.json", "slab_kb": [4, 1024, 16384], "count": [128, 128, 64],
             "sized": True}
    cf = PoolBinding(sizes=[4, 1024, 16384], counts=[128, 128, 64])
    cf.driver_open()
    assert cufile_api.pool_opened(cf, asked) == asked
    kept = PoolBinding(keeps=[128, 64, 64])
    kept.driver_open()
    assert cufile_api.pool_opened(kept, asked) == {
        **asked, "count": [128, 64, 64], "sized": False,
        "why": "cuFile kept [128, 64, 64] buffers of [4, 1024, 16384] KiB, not the "
               "[128, 128, 64] asked for before its driver opened"}
    assert cufile_api.pool_opened(PoolBinding(closed_get=True), asked) == asked  # unknown


def test_a_pool_that_cannot_be_sized_or_hold_the_io_says_why(monkeypatch):
    refused = cufile_api.size_pool(PoolBinding(set_error=RuntimeError("busy")), 1 << 20, 128)
    assert refused == {"asked_from": "libcufile", "slab_kb": [4, 1024, 16384],
                       "count": [128, 128, 32], "sized": False,
                       "why": "cuFile refused 128 buffers of 1024 KiB (busy)"}
    assert cufile_api.size_pool(PoolBinding(), 32 << 20, 4)["why"] == (
        "no slab class holds an I/O of 33554432 bytes")
    monkeypatch.setattr(cufile_api, "configured_pool", lambda: ([4, 1024], [8, 8]))
    assert cufile_api.size_pool(PoolBinding(closed_get=True), 4096, 4) == {
        "asked_from": "cufile.json", "sized": False, "why": "cuFile's pool has 2 classes, not 3"}


def test_a_pool_short_of_the_ios_in_flight_is_named_with_the_way_out(monkeypatch):
    monkeypatch.setattr(cufile_api, "_open", {"pool": {
        "slab_kb": [4, 1024, 16384], "count": [128, 64, 32], "sized": True}})
    assert cufile_api.pool_shortfall(1 << 20, 64) is None
    assert cufile_api.pool_shortfall(4096, 128) is None
    assert cufile_api.pool_shortfall(1 << 20, 128) == (
        "128 I/Os of 1048576 bytes in flight need as many of cuFile's 1024 KiB bounce buffers "
        "and it has 64 (its driver was opened for an earlier job of this run); cuFile's "
        "submit would wait for ever: keep at most 64 in flight, or raise "
        "properties.posix_pool_slab_count in cufile.json")
    monkeypatch.setattr(cufile_api, "_open", {"pool": {
        "slab_kb": [4, 1024], "count": [128, 64], "sized": False, "why": "cuFile refused"}})
    assert "and it has 64 (cuFile refused);" in cufile_api.pool_shortfall(1 << 20, 100)
    monkeypatch.setattr(cufile_api, "_open", {"pool": {"sized": False, "why": "unread"}})
    assert cufile_api.pool_shortfall(1 << 20, 1000) is None  # nothing known to be short


def test_the_pool_is_sized_before_the_driver_opens_and_recorded(monkeypatch):
    import sys
    import types

    class Binding(PoolBinding):
        opened_after = None

        def driver_open(self):
            self.opened_after = list(self.sets)
            super().driver_open()

    fake = Binding()
    for name in ("cuda", "cuda.bindings"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cuda.bindings.cufile", fake)
    monkeypatch.setattr(cufile_api, "_open", {})
    assert cufile_api.binding(0, 1 << 20, 96) is fake
    assert fake.opened_after == [([4, 1024, 16384], [128, 96, 32])]
    assert cufile_api.pool_facts() == {"asked_from": "libcufile", "slab_kb": [4, 1024, 16384],
                                       "count": [128, 96, 32], "sized": True}


class _File:
    def __init__(self, path, fd):
        self.path, self.fd = path, fd


def _cufile_job(**opts):
    from gpufio.profile import from_dict

    return from_dict({"global": {"engine": "cufile", "size": "256k", "iodepth": 8, **opts}},
                     "t.toml", {}).jobs[0]


@pytest.mark.parametrize("region", [True, False])
def test_the_engines_batch_channel_moves_each_request_both_ways(target, monkeypatch, region):
    """The cufile engine's channel (core/requests) over cuFile's batch API: the bytes of each
    request at its offset, in its own buffer, whether or not the loop names the region its
    buffers lie in; a request cut short is named."""
    from gpufio.core.requests import GPU, ChannelSpec, RequestFailed
    from gpufio.loops.steps import move_all

    path, fd = target
    cf = FakeCuFile(per_poll=2, fail_offset=50 * BS)
    monkeypatch.setattr(cufile_api, "_open", {"cf": cf})
    buf = np.zeros(9 * BS, np.uint8)
    spec = ChannelSpec(depth=4, memory=GPU, largest=BS, writes=True,
                       region=(buf.ctypes.data, buf.nbytes) if region else (0, 0))
    ch = cufile.CuFile.channel(_cufile_job(api="batch", iodepth_batch=2), [_File(str(path), fd)],
                               spec)
    offs = np.array([7, 1, 63, 0, 30, 2, 9, 11, 4]) * BS
    addr = np.uint64(buf.ctypes.data) + np.arange(9, dtype=np.uint64) * np.uint64(BS)
    try:
        assert move_all(ch, np.zeros(9), offs, np.full(9, BS), addr, False) > 0
        rows = buf.reshape(9, BS)
        for row, off in zip(rows, offs):
            assert row.tobytes() == pattern.fill(77, int(off), BS)
        rows[:2] = 0xCD
        move_all(ch, [0, 0], np.array([40, 41]) * BS, [BS, BS], addr[:2], True)
        with pytest.raises(RequestFailed) as e:
            move_all(ch, [0, 0, 0], np.array([3, 50, 5]) * BS, [BS] * 3, addr[:3], False)
    finally:
        ch.close()
    assert e.value.index == 1 and e.value.res == -errno.EIO and ch.inflight == 0
    assert path.read_bytes()[40 * BS:42 * BS] == b"\xcd" * (2 * BS)
    assert len(cf.destroyed) == 2 and cf.deregistered == [1000]


def test_block_loops_are_chosen_by_the_primitive_and_the_memory():
    from gpufio.core.requests import GPU, HOST, Capability
    from gpufio.engines import all_engines
    from gpufio.loops.block import loop_class
    from gpufio.loops.block_gpu_slots import GpuSlotLoop
    from gpufio.loops.block_staged import StagedLoop

    from gpufio.loops.block_host import BlockLoop
    from gpufio.profile import from_dict

    def job(name):
        return from_dict({"global": {"engine": name, "size": "1m"}}, "p.toml", {}).jobs[0]

    engines = all_engines()
    assert engines["cufile"].capability == Capability(memory=(GPU,))
    assert loop_class(engines["cufile"], job("cufile")) is GpuSlotLoop
    assert engines["cpu-gpu"].capability == Capability(memory=(HOST,))
    assert loop_class(engines["cpu-gpu"], job("cpu-gpu")) is StagedLoop
    # a host engine's block jobs stay in host memory: the host loop, no GPU one
    assert loop_class(engines["uring"], job("uring")) is BlockLoop
    assert loop_class(engines["null"], job("null")) is BlockLoop
