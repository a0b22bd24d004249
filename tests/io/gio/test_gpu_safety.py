"""The GPU path's safety nets, tested on the CPU with the CUDA parts stood in for: what a
stuck or failing GPU-initiated run leaves behind, and what it refuses to start under.
tests/io/gio/test_gpu_teardown.py runs the same paths on a GPU."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from gpufio.core.errors import BadInput
from gpufio.io import cuda, gpu, uring
from gpufio.io.gio import queue as gioqueue
from gpufio.io.gio.backends import rings as gpuring
from gpufio.io.gio.backends import uring as gpuqueue


@pytest.mark.parametrize("env,reason", [
    ({"CUDA_LAUNCH_BLOCKING": "1"}, "CUDA_LAUNCH_BLOCKING=1 runs kernels one at a time"),
    ({"CUDA_INJECTION64_PATH": "/opt/nvidia/compute-sanitizer/libsanitizer-collection.so"},
     "compute-sanitizer runs kernels one at a time"),
    ({"CUDA_INJECTION64_PATH": "/opt/nsight-compute/target/linux/libTreeLauncherTargetInjection.so"},
     "Nsight Compute runs kernels one at a time"),
    ({"CUDA_INJECTION64_PATH": "/opt/nsight-systems/libToolsInjection64.so"}, None),
    ({"CUDA_LAUNCH_BLOCKING": "0"}, None),
    ({}, None),
])
def test_tools_that_serialise_kernels_are_named(env, reason):
    got = gpu.serialising_reason(env)
    assert got == reason if reason is None else got.startswith(reason)


def test_a_queue_refuses_to_start_under_launch_blocking(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    with pytest.raises(BadInput, match="^GPU-initiated I/O cannot run here: CUDA_LAUNCH_BLOCKING"):
        gpuqueue.UringQueue(nrings=1, depth=4, slot_bytes=4096, sq_entries=4, cq_entries=8,
                             idle_ms=10, cpus=(), sqe_async=False, fds=[], registered=False)


def test_lazy_module_loading_is_warned_about(monkeypatch):
    assert gpu.module_loading_warning({"CUDA_MODULE_LOADING": "LAZY"}).startswith(
        "CUDA_MODULE_LOADING=LAZY")
    assert gpu.module_loading_warning({"CUDA_MODULE_LOADING": "EAGER"}) is None
    from gpufio.engines.gpu_uring import GpuUring
    from gpufio.profile import from_dict
    from gpufio.run.jobrun import job_advice

    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    job = from_dict({"global": {"engine": "gpu-uring", "targets": ["x"]}}, "t.toml", {}).jobs[0]
    facts = GpuUring.describe(job)
    assert job_advice(job, facts).startswith("gpufio: job 't': CUDA_MODULE_LOADING=LAZY")


def test_the_kernel_cache_key_covers_every_included_file(tmp_path, monkeypatch):
    kernels = tmp_path / "kernels"
    shutil.copytree(cuda.KERNELS, kernels)
    before = cuda.kernels_digest(kernels)
    (kernels / "pattern.cuh").write_text((kernels / "pattern.cuh").read_text() + "\n// edit\n")
    assert cuda.kernels_digest(kernels) != before  # a header edit changes every module's key
    seen = []

    class FakeModule:
        def __init__(self, code, options):
            seen.append(code)

        def compile(self):
            pass

    import cupy

    monkeypatch.setattr(cupy, "RawModule", FakeModule)
    cuda.module.__wrapped__("gnn_gather")
    assert seen[0].split("\n", 1)[0] == f"// gpufio kernels {cuda.kernels_digest()}"


def test_no_mmap_rings_over_a_page_are_refused_before_linux_6_10(monkeypatch):
    monkeypatch.setattr(uring, "kernel_version", lambda: (6, 8))
    with pytest.raises(uring.UringError, match=r"NO_MMAP rings over one page needs Linux >= "
                       r"6\.10 \(this kernel is 6\.8\): 128 SQ and 256 CQ entries"):
        uring.check_user_memory_size(128, 256, sqarray=False)
    uring.check_user_memory_size(64, 128, sqarray=False)  # one page each: fine
    monkeypatch.setattr(uring, "kernel_version", lambda: (6, 10))
    uring.check_user_memory_size(4096, 8192, sqarray=False)


def test_a_ring_whose_memory_would_not_fit_says_so(monkeypatch):
    if not uring.probe().get("no_mmap"):
        pytest.skip("this kernel has no NO_MMAP rings")
    monkeypatch.setattr(uring, "kernel_version", lambda: (6, 8))
    with pytest.raises(uring.UringError, match="at most 64 SQ entries"):
        uring.Ring(128, cq_entries=256, sqpoll=True, user_memory=True, no_sqarray=True)
    ring = uring.Ring(32, cq_entries=64, sqpoll=True, user_memory=True, no_sqarray=True)
    ring.close()


def test_a_wedged_gpu_is_refused_for_the_rest_of_the_process(monkeypatch):
    monkeypatch.setattr(gpu, "probe", lambda: (1, None))
    monkeypatch.setattr(gpu, "_WEDGED", {})
    gpu.mark_wedged(0, "a GPU-initiated I/O kernel never stopped")
    with pytest.raises(gpu.GpuWedged, match="gpu 0: a GPU-initiated I/O kernel never stopped; "
                       "this process cannot use it again"):
        gpu.use(0)


class FakeRing:
    def __init__(self, flags=0):
        self.sq_flags, self.cq_entries, self.entered = flags, 256, 0

    def enter(self, *args):
        self.entered += 1


def _rings(*rings):
    out = gpuring.GpuRings.__new__(gpuring.GpuRings)
    out.rings = list(rings)
    return out


def test_a_cq_overflow_is_named_not_left_to_hang():
    rings = _rings(FakeRing(), FakeRing(uring.SQ_CQ_OVERFLOW | uring.SQ_NEED_WAKEUP))
    with pytest.raises(gpuring.RingOverflow, match="ring 1: its completion queue overflowed"):
        rings.wake()
    assert rings.wake(check=False) == 1  # while aborting: wake, do not raise again


class FakeStates:
    """Rings whose in-flight count goes down one per look, to ``floor``."""

    def __init__(self, inflight, floor=0):
        self.inflight, self.floor, self.closed_at = inflight, floor, None
        self.rings, self.log = [FakeRing()], []

    def states(self):
        self.inflight = max(self.inflight - 1, self.floor)
        return [gpuring.RingState(0, self.inflight, 0, 0, 0)]

    def wake(self, check=True):
        return 0

    def close(self):
        self.log.append("rings")


class FakeSlots:
    def __init__(self, log):
        self.log = log

    def close(self):
        self.log.append("slots")


def _queue(rings, kernels_done=True):
    q = gpuqueue.UringQueue.__new__(gpuqueue.UringQueue)
    q.rings, q.kernels_done, q._dev, q._kept, q._launch_kept = rings, kernels_done, {}, [], ()
    q._slots = FakeSlots(rings.log)
    q._cp = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0)))
    return q


def test_close_drains_then_closes_the_rings_before_freeing_the_slots(monkeypatch):
    monkeypatch.setattr(gioqueue, "WEDGED", [])
    rings = FakeStates(inflight=3)
    _queue(rings).close()
    assert rings.log == ["rings", "slots"] and gioqueue.WEDGED == []


def test_slots_a_read_may_still_land_in_are_never_freed(monkeypatch):
    monkeypatch.setattr(gioqueue, "WEDGED", [])
    monkeypatch.setattr(gpuqueue, "DRAIN_S", 0.05)
    rings = FakeStates(inflight=3, floor=1)  # one read never completes
    q = _queue(rings)
    slots = q._slots
    q.close()
    assert rings.log == ["rings"] and gioqueue.WEDGED == [slots]  # mapped for good


def test_a_queue_whose_kernels_never_stopped_keeps_everything(monkeypatch):
    monkeypatch.setattr(gioqueue, "WEDGED", [])
    monkeypatch.setattr(gpu, "_WEDGED", {})
    rings = FakeStates(inflight=0)
    q = _queue(rings, kernels_done=False)
    q.keep_alive("bench arrays")
    q.close()
    assert rings.log == [] and gioqueue.WEDGED == [q] and q._kept == ["bench arrays"]
    assert 0 in gpu._WEDGED


def test_any_error_after_start_stops_the_agents():
    from gpufio.loops.block_device import DeviceBench

    calls = []
    bench = DeviceBench.__new__(DeviceBench)
    bench.queue = SimpleNamespace(start=lambda requesters: calls.append("start"),
                                  abort_quietly=lambda streams: calls.append("abort") or True,
                                  kernels_done=False)
    bench.blocks, bench.stream = 1, "stream"

    def broken(*args):
        raise uring.UringError("io_uring_enter failed: EBADF")

    bench._drive = broken
    with pytest.raises(uring.UringError):
        bench.run(10**9)
    assert calls == ["start", "abort"]


def test_a_queue_refuses_rings_whose_cq_is_smaller_than_its_sq(monkeypatch):
    """depth <= SQ <= CQ, checked against what the kernel made of the sizes asked for."""
    class Rings:
        def __init__(self, n, sq, cq, **kwargs):
            self.rings = [SimpleNamespace(sq_entries=sq, cq_entries=cq)]
            self.closed = False

        def states(self):
            return []

        def close(self):
            self.closed = True

    monkeypatch.setattr(gpuqueue, "GpuRings", Rings)
    monkeypatch.setattr(gpu, "serialising_reason", lambda: None)
    monkeypatch.setattr(gpuqueue.kernels, "function", lambda kernel: None)
    with pytest.raises(BadInput, match="needs depth <= SQ entries <= CQ entries, got SQ 8, CQ 4"):
        gpuqueue.UringQueue(nrings=1, depth=8, slot_bytes=4096, sq_entries=8, cq_entries=4,
                             idle_ms=10, cpus=(), sqe_async=False, fds=[], registered=False)
    with pytest.raises(BadInput, match="got SQ 4, CQ 8"):  # fewer SQ entries than slots
        gpuqueue.UringQueue(nrings=1, depth=8, slot_bytes=4096, sq_entries=4, cq_entries=8,
                             idle_ms=10, cpus=(), sqe_async=False, fds=[], registered=False)
