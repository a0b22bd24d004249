"""Landing data in GPU memory from page-locked host memory, segment by segment.

Shared by the CPU-mediated GPU engines (cpu-gpu, mmap): host slots are grouped in segments;
a full segment goes to GPU memory in one asynchronous copy on its own CUDA stream, recorded
by an event, so many small reads share a copy and filling the next segment overlaps it. An
I/O counts as done only when its segment's copy is done; with verify, the check runs on the
GPU copy (gpuverify), where the data landed: the check is queued on the segment's stream
right behind its copy, with its parameters staged in page-locked memory, so verifying adds
no synchronisation; its per-I/O counts come back with the segment.
"""

from __future__ import annotations

import ctypes

import numpy as np

from gpufio import gpu, gpuverify
from gpufio.errors import BadInput
from gpufio.targets import aligned_buffer
from gpufio.worker import WorkerContext


class Landing:
    """``segments`` x ``per_segment`` slots of ``bs`` bytes, in host and GPU memory."""

    def __init__(self, gpu_index: int, segments: int, per_segment: int, bs: int,
                 verify: bool) -> None:
        cp = gpu.use(gpu_index)
        self._cp = cp
        self.segments, self.per_segment, self.bs = segments, per_segment, bs
        nbytes = segments * per_segment * bs
        self._mem = aligned_buffer(nbytes)
        self.host = np.frombuffer(self._mem, dtype=np.uint8)
        self.host_addr = self.host.ctypes.data
        gpu.register_host(self.host_addr, len(self._mem))
        try:
            self.dev = cp.empty(nbytes, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            gpu.unregister_host(self.host_addr)
            raise BadInput(f"gpu {gpu_index}: out of memory for {nbytes} bytes of buffers") from None
        self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(segments)]
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(segments)]
        self._verify = verify
        if verify:
            import cupyx

            gpuverify.compile_kernel()
            # per segment and slot: offset, seed, seed mix, staged in pinned memory so that one
            # copy carries a segment's parameters; and each slot's wrong-word count. Every CUDA
            # call here is queued per segment, so fewer of them is more segments per second.
            shape = (segments, 3, per_segment)
            self._params_host = cupyx.zeros_pinned(shape, dtype=np.uint64)
            self._params = cp.zeros(shape, dtype=cp.uint64)
            self._bad_host = cupyx.zeros_pinned((segments, per_segment), dtype=np.uint32)
            self._bad = cp.zeros((segments, per_segment), dtype=cp.uint32)

    def copy(self, seg: int, k: int, offs: np.ndarray | None = None,
             seeds: np.ndarray | None = None) -> None:
        """Start copying the first ``k`` slots of segment ``seg`` to GPU memory, and when
        verifying, checking them there against the pattern at ``offs`` with ``seeds``."""
        lo = seg * self.per_segment * self.bs
        stream = self._streams[seg]
        self.dev[lo:lo + k * self.bs].data.copy_from_host_async(
            ctypes.c_void_p(self.host_addr + lo), k * self.bs, stream)
        if self._verify and offs is not None:
            host, dev, bad = self._params_host[seg], self._params[seg], self._bad[seg]
            host[0, :k], host[1, :k], host[2, :k] = offs, seeds, gpuverify.seed_mixes(seeds)
            dev.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes, stream)
            bad.data.memset_async(0, bad.nbytes, stream)
            words = self.dev[lo:lo + k * self.bs].view(self._cp.uint64)
            gpuverify.launch(words, dev[0], dev[1], dev[2], k, self.bs, bad, stream)
            bad.data.copy_to_host_async(ctypes.c_void_p(self._bad_host[seg].ctypes.data),
                                        bad.nbytes, stream)
        self._events[seg].record(stream)

    def done(self, seg: int) -> bool:
        """True once segment ``seg``'s last copy has finished."""
        return self._events[seg].done

    def wait(self, seg: int) -> None:
        """Block until segment ``seg``'s last copy has finished."""
        self._events[seg].synchronize()

    def verify(self, seg: int, ctx: WorkerContext, tgt: np.ndarray, offs: np.ndarray,
               res: np.ndarray) -> None:
        """Record the mismatches the queued check found in a finished segment; only I/Os
        that brought all their bytes count (the others are already failures)."""
        counts = self._bad_host[seg, :len(res)]
        bad = np.flatnonzero((counts != 0) & (np.asarray(res) == self.bs))
        ctx.record_mismatches(tgt, offs, bad.tolist())

    def close(self) -> None:
        """Wait for outstanding copies, then release the buffers."""
        for stream in self._streams:
            stream.synchronize()
        gpu.unregister_host(self.host_addr)
        self.host = None
        self.dev = None
        self._mem.close()
