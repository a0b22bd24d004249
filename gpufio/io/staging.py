"""Staging data between GPU memory and page-locked host memory, segment by segment.

Shared by the CPU-mediated GPU paths (loops/block_staged's block loop, mmap): host slots are grouped in segments;
a full segment goes to GPU memory in one asynchronous copy on its own CUDA stream, recorded
by an event, so many small reads share a copy and filling the next segment overlaps it. An
I/O counts as done only when its segment's copy is done; with verify, the check runs on the
GPU copy (gpuverify), where the data landed: the check is queued on the segment's stream
right behind its copy, with its parameters staged in page-locked memory, so verifying adds
no synchronisation; it marks bad I/Os in mapped host memory, read when the segment is done.
Writes go the other way (``stage_out``): the segment's pattern is generated in GPU memory and
copied down to its host slots in one transfer, from which the engine writes.
"""

from __future__ import annotations

import numpy as np

from gpufio.core.options import Option
from gpufio.io import gpu
from gpufio.io import verify as gpuverify
from gpufio.native import memory

# An engine whose host-memory requests land in GPU memory through segments offers this
# option; without it the loop takes its default.
SEGMENTS = Option("segments", "int", 3, "slot groups copied as one H2D transfer each "
                  "(3: triple buffering)", minimum=1)
SPARE = 2  # landing slots per request that may be in flight


def segment_shape(segments: int, iodepth: int) -> tuple[int, int]:
    """(segments the ``iodepth`` requests in flight are grouped in, slots per segment: enough
    that the segments hold all ``iodepth``); there are SPARE times as many segments in all,
    so one waiting for its slowest request or its copy does not hold back new ones."""
    nseg = min(segments, iodepth)
    return nseg, -(-iodepth // nseg)


class SegmentedStaging:
    """``segments`` x ``per_segment`` slots of ``bs`` bytes, in host and GPU memory."""

    def __init__(self, gpu_index: int, segments: int, per_segment: int, bs: int,
                 verify: bool, writes: bool = False) -> None:
        cp = gpu.use(gpu_index)
        self._cp = cp
        self.segments, self.per_segment, self.bs = segments, per_segment, bs
        nbytes = segments * per_segment * bs
        self._verify = verify
        self._slots = gpu.PinnedBuffer(nbytes)
        self.host, self.host_addr = self._slots.array, self._slots.addr
        self._marks: gpu.PinnedBuffer | None = None
        with gpu.undone_on_failure(self._release, f"gpu {gpu_index}: out of memory for "
                                   f"{nbytes} bytes of buffers"):
            self.dev = cp.empty(nbytes, dtype=cp.uint8)
            self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(segments)]
            self._events = [cp.cuda.Event(disable_timing=True) for _ in range(segments)]
            if verify or writes:
                self._setup_params(cp)
            if verify:
                self._setup_verify(cp)
            if writes:
                self._rows = cp.arange(per_segment, dtype=cp.uint64)

    def _setup_params(self, cp: object) -> None:
        """Per segment and slot: the offset and seed the check (or the fill) needs, staged
        in pinned memory so one copy carries a segment's. Every CUDA call is queued per
        segment: fewer of them is more segments per second."""
        import cupyx

        gpuverify.compile_kernel()
        shape = (self.segments, 2, self.per_segment)
        self._params_host = cupyx.zeros_pinned(shape, dtype=np.uint64)
        self._params = cp.zeros(shape, dtype=cp.uint64)

    def _setup_verify(self, cp: object) -> None:
        """The mark the check leaves on a bad I/O, in host memory mapped into the GPU, so the
        host reads it with no copy back and nothing needs clearing (each use of a segment
        checks with a new mark)."""
        n = self.segments * self.per_segment
        self._marks = gpu.PinnedBuffer(n * 4, mapped=True)
        self._marked = self._marks.array.view(np.uint32)[:n].reshape(self.segments,
                                                                     self.per_segment)
        self._uses = [0] * self.segments

    def _mark(self, seg: int) -> int:
        """The mark of segment ``seg``'s current check: never 0, what unmarked memory holds."""
        return self._uses[seg] % 0xFFFFFFFF + 1

    def copy(self, seg: int, k: int, offs: np.ndarray | None = None,
             seeds: np.ndarray | None = None) -> None:
        """Start copying the first ``k`` slots of segment ``seg`` to GPU memory, and when
        verifying, checking them there against the pattern at ``offs`` with ``seeds``."""
        lo = seg * self.per_segment * self.bs
        stream = self._streams[seg]
        self.dev[lo:lo + k * self.bs].data.copy_from_host_async(
            memory.pointer(self.host_addr + lo), k * self.bs, stream)
        if self._verify and offs is not None:
            dev = self._stage_params(seg, k, offs, seeds)
            self._uses[seg] += 1
            words = self.dev[lo:lo + k * self.bs].view(self._cp.uint64)
            gpuverify.launch(words, dev[0], dev[1], k, self.bs, self._mark(seg),
                             self._marked[seg].ctypes.data, stream)
        self._events[seg].record(stream)

    def _stage_params(self, seg: int, k: int, offs: np.ndarray, seeds: np.ndarray) -> object:
        """Queue the copy of segment ``seg``'s offsets and seeds to the GPU; their device rows."""
        host, dev = self._params_host[seg], self._params[seg]
        host[0, :k], host[1, :k] = offs, seeds
        dev.data.copy_from_host_async(memory.pointer(host.ctypes.data), host.nbytes,
                                      self._streams[seg])
        return dev

    def stage_out(self, seg: int, k: int, offs: np.ndarray, seeds: np.ndarray) -> None:
        """Start filling the first ``k`` slots of segment ``seg`` with the pattern at ``offs``
        in GPU memory and copying them down to the host slots, where the writes read them."""
        lo = seg * self.per_segment * self.bs
        stream = self._streams[seg]
        dev = self._stage_params(seg, k, offs, seeds)
        gpuverify.fill(self.dev[lo:lo + k * self.bs].view(self._cp.uint64), self._rows,
                       dev[0], dev[1], k, self.bs, stream)
        self.dev[lo:lo + k * self.bs].data.copy_to_host_async(
            memory.pointer(self.host_addr + lo), k * self.bs, stream)
        self._events[seg].record(stream)

    def done(self, seg: int) -> bool:
        """True once segment ``seg``'s last copy has finished."""
        return self._events[seg].done

    def wait(self, seg: int) -> None:
        """Block until segment ``seg``'s last copy has finished."""
        self._events[seg].synchronize()

    def mismatches(self, seg: int, res: np.ndarray) -> list[int]:
        """Indices of the I/Os of a finished segment that the queued check found bad; only
        I/Os that brought all their bytes count (the others are already failures)."""
        marked = self._marked[seg, :len(res)] == self._mark(seg)
        return np.flatnonzero(marked & (np.asarray(res) == self.bs)).tolist()

    def close(self) -> None:
        """Wait for outstanding copies, then release the buffers."""
        for stream in self._streams:
            stream.synchronize()
        self.dev = None
        self._release()

    def _release(self) -> None:
        """Unregister and free the host buffers (our views of them go first)."""
        self.host = self._marked = None
        self._slots.close()
        if self._marks is not None:
            self._marks.close()
