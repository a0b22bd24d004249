"""The GPU-memory block loops of run/ (needs a GPU) are written over any channel of the
right capability, not over one engine's: an engine made here of nothing but a channel gets
its block jobs landed in GPU memory, and the bytes there are the pattern (verified in GPU
memory as they land, and by the read-back after writes)."""

from __future__ import annotations

import mmap
import os
from typing import Any, Sequence

import numpy as np
import pytest

from gpufio import engines
from gpufio.core import pattern
from gpufio.core.requests import GPU, HOST, Capability, Channel, ChannelSpec, File
from gpufio.engines import all_engines
from gpufio.engines.base import Engine
from gpufio.profile import from_dict
from gpufio.run import runner

pytestmark = pytest.mark.gpu


class StagedPsyncTest(Engine):
    """pread/pwrite on host memory, its block jobs landing in GPU memory: run/staged."""

    name = "staged-psync-test"
    summary = "psync's channel, staged into GPU memory (a test)"
    uses_gpu = True
    worker_kind = "thread"
    capability = Capability(memory=(HOST,))

    @classmethod
    def channel(cls, job: Any, files: Sequence[File], spec: ChannelSpec) -> Channel:
        return all_engines()["psync"].channel(job, files, spec)


class BounceChannel(Channel):
    """Requests on device pointers, each through a page of host memory and a synchronous
    copy: the simplest GPU-memory channel, done in ``submit``."""

    def __init__(self, files: Sequence[File], spec: ChannelSpec) -> None:
        super().__init__(spec)
        import cupy

        self._runtime = cupy.cuda.runtime
        self._fds = [f.fd for f in files]
        self._map = mmap.mmap(-1, spec.largest)
        self._host = np.frombuffer(self._map, np.uint8)
        self._done: list[tuple[int, int]] = []

    @property
    def inflight(self) -> int:
        return len(self._done)

    def submit(self, tgt, off, length, addr, write, tag) -> int:
        k = min(self.room(), len(off))
        writes = np.broadcast_to(np.asarray(write, bool), (len(off),))
        rt, host = self._runtime, self._host.ctypes.data
        for t, o, n, a, w, g in zip(tgt[:k].tolist(), off[:k].tolist(), length[:k].tolist(),
                                    addr[:k].tolist(), writes[:k].tolist(), tag[:k].tolist()):
            view = memoryview(self._map)[:n]
            if w:
                rt.memcpy(host, a, n, rt.memcpyDeviceToHost)
                got = os.pwrite(self._fds[t], view, o)
            else:
                got = os.preadv(self._fds[t], [view], o)
                rt.memcpy(a, host, n, rt.memcpyHostToDevice)
            view.release()
            self._done.append((g, got))
        return k

    def reap(self, wait_ns):
        tags = np.array([g for g, _ in self._done], np.int64)
        res = np.array([r for _, r in self._done], np.int64)
        self._done = []
        return tags, res

    def close(self) -> None:
        self._host = None
        self._map.close()


class BounceTest(Engine):
    """A GPU-memory channel that is not cuFile's: run/gpu_slots."""

    name = "bounce-test"
    summary = "pread into a host page, then a copy to the request's device pointer (a test)"
    uses_gpu = True
    worker_kind = "thread"
    capability = Capability(memory=(GPU,))

    @classmethod
    def channel(cls, job: Any, files: Sequence[File], spec: ChannelSpec) -> Channel:
        return BounceChannel(files, spec)


@pytest.fixture(params=[StagedPsyncTest, BounceTest], ids=["staged", "gpu-slots"])
def engine(request, monkeypatch):
    all_engines()
    monkeypatch.setitem(engines._REGISTRY, request.param.name, request.param)
    if why := request.param.unavailable():
        pytest.skip(why)
    return request.param.name


def run(engine, paths, **opts):
    glob = {"engine": engine, "targets": [str(p) for p in paths], "direct": False, **opts}
    return runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True)


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "bs": "4k", "iodepth": 16},
    {"rw": "read", "bs": "12k", "iodepth": 5},
    {"rw": "randread", "bs": "4k", "iodepth": 1},
])
def test_reads_land_in_gpu_memory_as_the_pattern(engine, opts, pattern_file, tmp_path):
    from gpufio.core import targets

    other = tmp_path / "other.dat"
    targets.create_file(str(other), 1 << 20, 99)
    (r,) = run(engine, [pattern_file, other], verify=True, io_size="1m", **opts).results
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    assert r.verify_failures == 0 and r.ios == (1 << 20) // r.job.bs and r.lat.n == r.ios
    assert all(p["ios"] > 0 for p in r.per_target)


def test_a_corrupted_block_is_caught_in_gpu_memory(engine, pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(6 * 4096 + 100)
        f.write(b"\x00\xff")
    (r,) = run(engine, [pattern_file], verify=True, rw="read", size="64k", iodepth=4).results
    assert r.verify_failures == 1 and not r.ok
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 6 * 4096}]


def test_writes_from_gpu_memory_land_as_the_pattern_and_read_back(engine, tmp_path):
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(1 << 20))
    (w,) = run(engine, [path], rw="write", overwrite=True, verify=True, iodepth=8,
               fsync=16).results
    assert w.ok, (w.failure, w.errors, w.bad_offsets)
    assert w.write.ios == 256 and w.verify_failures == 0
    assert path.read_bytes() == pattern.fill(0x89, 0, 1 << 20)
