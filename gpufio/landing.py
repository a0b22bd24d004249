"""Landing data in GPU memory from page-locked host memory, segment by segment.

Shared by the CPU-mediated GPU engines (cpu-gpu, mmap): host slots are grouped in segments;
a full segment goes to GPU memory in one asynchronous copy on its own CUDA stream, recorded
by an event, so many small reads share a copy and filling the next segment overlaps it. An
I/O counts as done only when its segment's copy is done; with verify, the check runs on the
GPU copy (gpuverify), where the data landed.
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
        if verify:
            gpuverify.compile_kernel()

    def copy(self, seg: int, k: int) -> None:
        """Start copying the first ``k`` slots of segment ``seg`` to GPU memory."""
        lo = seg * self.per_segment * self.bs
        self.dev[lo:lo + k * self.bs].data.copy_from_host_async(
            ctypes.c_void_p(self.host_addr + lo), k * self.bs, self._streams[seg])
        self._events[seg].record(self._streams[seg])

    def done(self, seg: int) -> bool:
        """True once segment ``seg``'s last copy has finished."""
        return self._events[seg].done

    def wait(self, seg: int) -> None:
        """Block until segment ``seg``'s last copy has finished."""
        self._events[seg].synchronize()

    def verify(self, seg: int, ctx: WorkerContext, tgt: np.ndarray, offs: np.ndarray,
               res: np.ndarray) -> None:
        """Check the landed copies of a segment's complete I/Os against the pattern."""
        lo = seg * self.per_segment * self.bs
        rows = self.dev[lo:lo + len(res) * self.bs].reshape(len(res), self.bs)
        gpuverify.check_landed(rows, ctx, tgt, offs, res)

    def close(self) -> None:
        """Wait for outstanding copies, then release the buffers."""
        for stream in self._streams:
            stream.synchronize()
        gpu.unregister_host(self.host_addr)
        self.host = None
        self.dev = None
        self._mem.close()
