"""The pattern in GPU memory: ``verify = true`` for GPU engines checks it where the data
landed, and writes from GPU memory are filled with it there.

Copying every block back to the host to check it would measure the check, not the path. The
kernel (kernels/verify.cu) recomputes each word from (seed, offset) exactly as
gpufio.core.pattern does and marks the I/Os holding a word that differs. It is compiled once per
process, on first use, which engines do during setup, never inside a measurement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufio.core import pattern
from gpufio.io import kernels
from gpufio.io.kernels import Kernel

THREADS = 256
MAX_BLOCKS = 4096


def _kernel(kernel: Kernel = Kernel.MARK_MISMATCHES) -> Any:
    return kernels.function(kernel)


def compile_kernel() -> None:
    """Compile now (engine setup), so the first verified batch does not pay for it."""
    _kernel()


def fill(data: Any, rows: Any, offsets: Any, seeds: Any, n: int, io_len: int,
         stream: Any = None) -> None:
    """Queue on ``stream`` the pattern of ``n`` I/Os into GPU memory: I/O i's ``io_len``
    bytes (at ``offsets[i]``, seed ``seeds[i]``) into row ``rows[i]`` of ``data`` (CuPy
    arrays; rows, offsets and seeds uint64). What a write from GPU memory sends."""
    if n == 0:
        return
    total = n * (io_len // 8)
    blocks = int(min(MAX_BLOCKS, max(1, -(-total // THREADS))))
    _kernel(Kernel.FILL_PATTERN)((blocks,), (THREADS,), (
        data, rows, offsets, seeds, np.uint64(pattern.MAGIC), np.uint64(io_len // 8),
        np.uint64(pattern.BLOCK), np.uint64(pattern.HEADER_WORDS), np.uint64(total)),
        stream=stream)


def landed_mismatches(rows: Any, seeds: np.ndarray, offs: np.ndarray,
                      res: np.ndarray) -> list[int]:
    """Indices of the I/Os that brought all their bytes but not the right ones, given
    ``rows``: a CuPy (n, bs) array holding each I/O's landed bytes in order, and each I/O's
    target seed and offset."""
    import cupy

    bs = rows.shape[1]
    ok = np.flatnonzero(np.asarray(res) == bs)
    if not len(ok):
        return []
    data = (rows if len(ok) == len(res) else rows[cupy.asarray(ok)]).ravel()
    return ok[bad_ios_device(data, offs[ok], seeds[ok], bs)].tolist()


def launch(words: Any, offsets: Any, seeds: Any, n: int, io_len: int, mark: int, bad: Any,
           stream: Any = None) -> None:
    """Queue the check of ``n`` I/Os on ``stream`` (data, offsets and seeds CuPy arrays on the
    GPU): bad[i] becomes ``mark`` if I/O i holds a wrong word and is left as it was
    otherwise. ``bad``: a CuPy uint32 array, or the address of host memory mapped into the
    GPU. Nothing waits for it."""
    total = n * (io_len // 8)
    blocks = int(min(MAX_BLOCKS, max(1, -(-total // THREADS))))
    _kernel()((blocks,), (THREADS,), (
        words, offsets, seeds, np.uint64(pattern.MAGIC), np.uint64(io_len // 8),
        np.uint64(pattern.BLOCK), np.uint64(pattern.HEADER_WORDS), np.uint64(total),
        np.uint32(mark), np.uint64(bad) if isinstance(bad, int) else bad), stream=stream)


def bad_ios_device(data: Any, offsets: np.ndarray, seeds: np.ndarray, io_len: int) -> np.ndarray:
    """Indices of the I/Os in ``data`` (a CuPy array of len(offsets) * io_len bytes, one I/O
    after another) whose bytes differ from the pattern at their offset; ``seeds`` per I/O."""
    import cupy

    n = len(offsets)
    if io_len % 8 or np.any(np.asarray(offsets) % 8):
        raise ValueError("GPU verification needs 8-byte aligned offsets and lengths")
    words = data.view(cupy.uint64)
    bad = cupy.zeros(n, dtype=cupy.uint32)
    launch(words, cupy.asarray(offsets, dtype=cupy.uint64),
           cupy.asarray(np.asarray(seeds, dtype=np.uint64)), n, io_len, 1, bad)
    return np.flatnonzero(bad.get())
