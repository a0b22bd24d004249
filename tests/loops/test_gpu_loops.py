"""The GPU-memory block loops of run/ are written over any channel of the right capability,
not over one engine's: an engine made here of nothing but a channel gets its block jobs
landed in GPU memory, reads are the pattern where they land (a corrupted block named at its
offset), and writes land as the pattern (fsyncs and the read-back included).

Without a GPU the GPU side (io/staging's segments, the slots of GPU memory, io/verify's
kernels) is replaced by stand-ins over host memory, so the loops' bookkeeping runs here over
real channels (psync's, uring's) and real files; the cases marked gpu run the same loops on
a GPU: psync's channel staged into GPU memory, and a bounce-copy channel on device
pointers."""

from __future__ import annotations

import mmap
import os
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np
import pytest

from gpufio import engines
from gpufio.core import pattern, targets
from gpufio.core.requests import GPU, HOST, Capability, Channel, ChannelSpec, File
from gpufio.engines import all_engines
from gpufio.engines.base import Engine
from gpufio.profile import from_dict
from gpufio.loops import block_gpu_slots as gpu_slots, block_staged as staged
from gpufio.workloads.block import runner


def _bad(rows: np.ndarray, seeds: np.ndarray, offs: np.ndarray, res: np.ndarray) -> list[int]:
    """Which I/Os that moved all their bytes hold other bytes than the pattern."""
    bs = rows.shape[1]
    return [i for i in range(len(offs)) if res[i] == bs and rows[i].tobytes()
            != pattern.fill(int(seeds[i]), int(offs[i]), bs)]


class HostStaging:
    """io/staging.SegmentedStaging's interface over host memory alone: the copy to the GPU
    is the check of the slots (when verifying), done the second time it is asked after."""

    def __init__(self, gpu_index: int, segments: int, per_segment: int, bs: int,
                 verify: bool, writes: bool = False) -> None:
        self.per_segment, self.bs = per_segment, bs
        self._mem = targets.aligned_buffer(segments * per_segment * bs)  # for O_DIRECT
        self.host = np.frombuffer(self._mem, np.uint8)[:segments * per_segment * bs]
        self.host_addr = self.host.ctypes.data
        self._rows = self.host.reshape(segments, per_segment, bs)
        self._marked: list[list[int]] = [[] for _ in range(segments)]
        self._asked = [0] * segments

    def copy(self, seg: int, k: int, offs: Any = None, seeds: Any = None) -> None:
        self._asked[seg] = 0
        self._marked[seg] = ([] if offs is None else
                             _bad(self._rows[seg, :k], seeds, offs, np.full(k, self.bs)))

    def stage_out(self, seg: int, k: int, offs: np.ndarray, seeds: np.ndarray) -> None:
        self._asked[seg] = 0
        for i in range(k):
            self._rows[seg, i] = np.frombuffer(pattern.fill(int(seeds[i]), int(offs[i]),
                                                            self.bs), np.uint8)

    def done(self, seg: int) -> bool:
        self._asked[seg] += 1
        return self._asked[seg] > 1

    def wait(self, seg: int) -> None:
        self._asked[seg] = 2

    def mismatches(self, seg: int, res: np.ndarray) -> list[int]:
        return [i for i in self._marked[seg] if res[i] == self.bs]

    def close(self) -> None:
        self.host = self._rows = None
        self._mem.close()


class HostArray:
    """A NumPy array as the slot loop uses a CuPy one (``.data.ptr``, slices, views)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.data = a, SimpleNamespace(ptr=a.ctypes.data)

    def __getitem__(self, key: Any) -> "HostArray":
        return HostArray(self.a[key.a if isinstance(key, HostArray) else key])

    def reshape(self, *shape: int) -> "HostArray":
        return HostArray(self.a.reshape(*shape))

    def view(self, dtype: Any) -> "HostArray":
        return HostArray(self.a.view(dtype))


HOST_CUPY = SimpleNamespace(
    empty=lambda n, dtype: HostArray(np.zeros(n, np.uint8)), uint8=np.uint8, uint64=np.uint64,
    asarray=lambda a: HostArray(np.asarray(a)),
    cuda=SimpleNamespace(memory=SimpleNamespace(OutOfMemoryError=MemoryError),
                         Stream=SimpleNamespace(null=SimpleNamespace(synchronize=lambda: None))))


def _host_fill(words: HostArray, rows: HostArray, offs: HostArray, seeds: HostArray, n: int,
               bs: int) -> None:
    slots = words.a.view(np.uint8).reshape(-1, bs)
    for r, off, seed in zip(rows.a.tolist(), offs.a.tolist(), seeds.a.tolist()):
        slots[r] = np.frombuffer(pattern.fill(seed, off, bs), np.uint8)


HOST_VERIFY = SimpleNamespace(
    compile_kernel=lambda: None, fill=_host_fill,
    landed_mismatches=lambda rows, seeds, offs, res: _bad(rows.a, seeds, offs, res))


def _channel_of(engine: str) -> Any:
    """``engine``'s channel for a job of the test's engine: with ``engine``'s own settings
    (its defaults), as its own jobs would have them."""
    cls = all_engines()[engine]
    return lambda job, files, spec: cls.channel(
        replace(job, engine=engine, engine_options={}, engine_settings=cls.Settings()),
        files, spec)


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
            if w:
                rt.memcpy(host, a, n, rt.memcpyDeviceToHost)
                got = os.pwrite(self._fds[t], self._host[:n], o)
            else:
                got = os.preadv(self._fds[t], [self._host[:n]], o)
                rt.memcpy(a, host, n, rt.memcpyHostToDevice)
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


def _engine(memory: str, channel: Any, stand_in: bool) -> type[Engine]:
    class Test(Engine):
        name = f"test-{memory}-{'stand-in' if stand_in else 'gpu'}"
        summary = "a channel, its block jobs landing in GPU memory (a test)"
        uses_gpu = True
        worker_kind = "thread"
        capability = Capability(memory=(memory,))

        @classmethod
        def unavailable(cls) -> str | None:
            return None if stand_in else super().unavailable()

        @classmethod
        def channel(cls, job: Any, files: Sequence[File], spec: ChannelSpec) -> Channel:
            assert spec.memory == memory and spec.region[1] > 0
            return channel(job, files, spec)

    return Test


@pytest.fixture(params=[
    (HOST, _channel_of("psync"), True), (HOST, _channel_of("uring"), True),
    (GPU, _channel_of("uring"), True), (GPU, _channel_of("psync"), True),
    pytest.param((HOST, _channel_of("psync"), False), marks=pytest.mark.gpu),
    pytest.param((GPU, lambda job, files, spec: BounceChannel(files, spec), False),
                 marks=pytest.mark.gpu),
], ids=["staged-psync", "staged-uring", "slots-uring", "slots-psync", "gpu-staged-psync",
        "gpu-slots-bounce"])
def engine(request, monkeypatch):
    memory, channel, stand_in = request.param
    cls = _engine(memory, channel, stand_in)
    all_engines()
    monkeypatch.setitem(engines._REGISTRY, cls.name, cls)
    if stand_in:
        monkeypatch.setattr(staged, "SegmentedStaging", HostStaging)
        monkeypatch.setattr(gpu_slots.gpu, "use", lambda index: HOST_CUPY)
        monkeypatch.setattr(gpu_slots, "gpuverify", HOST_VERIFY)
    elif why := cls.unavailable():
        pytest.skip(why)
    return cls.name


def run(engine, paths, **opts):
    glob = {"engine": engine, "targets": [str(p) for p in paths], **opts}
    return runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True)


@pytest.mark.parametrize("opts", [
    {"rw": "randread", "bs": "4k", "iodepth": 16},
    {"rw": "read", "bs": "12k", "iodepth": 5, "numjobs": 2},
    {"rw": "randread", "bs": "4k", "iodepth": 1},
])
def test_reads_are_the_pattern_where_they_land(engine, opts, pattern_file, tmp_path):
    other = tmp_path / "other.dat"
    targets.create_file(str(other), 1 << 20, 99)
    (r,) = run(engine, [pattern_file, other], verify=True, io_size="1m", **opts).results
    assert r.ok, (r.failure, r.errors, r.bad_offsets)
    assert r.verify_failures == 0 and r.lat.n == r.ios
    assert r.ios == r.job.numjobs * ((1 << 20) // r.job.bs)
    assert all(p["ios"] > 0 for p in r.per_target)


def test_a_corrupted_block_is_named_at_its_offset(engine, pattern_file):
    with open(pattern_file, "r+b") as f:
        f.seek(6 * 4096 + 100)
        f.write(b"\x00\xff")
    (r,) = run(engine, [pattern_file], verify=True, rw="read", size="64k", iodepth=4).results
    assert r.verify_failures == 1 and not r.ok
    assert r.bad_offsets == [{"target": str(pattern_file), "offset": 6 * 4096}]


def test_writes_land_as_the_pattern_with_fsyncs_and_read_back(engine, tmp_path):
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(1 << 20))
    (w,) = run(engine, [path], rw="write", overwrite=True, verify=True, iodepth=8,
               fsync=16).results
    assert w.ok, (w.failure, w.errors, w.bad_offsets)
    assert w.write.ios == 256 and w.verify_failures == 0 and w.phases[0]["ok"]
    assert path.read_bytes() == pattern.fill(0x89, 0, 1 << 20)


def test_a_time_based_mix_ends_cleanly_when_its_runtime_is_over(engine, tmp_path, request):
    """Once the runtime is over the context hands out no I/Os, while its write flags are
    still the last batch's: the loop must issue nothing then, not fill zero slots."""
    if "staged" in request.node.callspec.id:
        pytest.skip("the staged loop moves a segment one way at a time: no mixes")
    path = tmp_path / "zeros.img"
    path.write_bytes(bytes(1 << 20))
    (r,) = run(engine, [path], rw="randrw", overwrite=True, iodepth=8, time_based=True,
               runtime="200ms").results
    assert r.ok, (r.failure, r.errors)
    assert r.read.ios > 0 and r.write.ios > 0
