"""The self-describing data pattern that every gpufio-made target carries.

Each 8-byte word at byte offset ``x`` of a target is a pure function of (seed, x), so any
engine, on the CPU or in GPU memory, can check that the bytes it got are the bytes of the
offset it asked for without a reference copy. Every 4 KiB block starts with a 32-byte header
(magic, its own offset, the seed, a check word) so a misplaced block is recognisable at a
glance in a hex dump; the rest is splitmix64 output, which is incompressible (zram cannot
cheat by compressing it).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

BLOCK = 4096
HEADER_WORDS = 4
MAGIC = int.from_bytes(b"GPUFIO\x01\x00", "little")
_WORDS_PER_BLOCK = BLOCK // 8
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def seed_mix(seed: int) -> np.uint64:
    """The seed times the golden ratio, mod 2**64: what every word of a seeded stream mixes in."""
    return np.uint64((seed * int(GOLDEN)) & _MASK64)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (NumPy or CuPy); arithmetic wraps as in C."""
    z = z + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def expected_words(seed: int, start: int, length: int) -> np.ndarray:
    """The pattern's words for bytes [start, start+length); both must be multiples of 8."""
    if start % 8 or length % 8:
        raise ValueError("pattern ranges must be 8-byte aligned")
    first = start - start % BLOCK
    end = -(-(start + length) // BLOCK) * BLOCK
    x = np.arange(first, end, 8, dtype=np.uint64)
    words = splitmix64(x ^ seed_mix(seed))
    blocks = words.reshape(-1, _WORDS_PER_BLOCK)
    block_off = x[::_WORDS_PER_BLOCK]
    blocks[:, 0] = MAGIC
    blocks[:, 1] = block_off
    blocks[:, 2] = seed
    blocks[:, 3] = block_off ^ np.uint64(seed ^ MAGIC)
    lo = (start - first) // 8
    return words[lo:lo + length // 8]


def fill(seed: int, start: int, length: int) -> bytes:
    """Bytes of the pattern for [start, start+length), for writing a target; any start and
    length (the words around an unaligned edge are computed and cut)."""
    lo = start - start % 8
    hi = -(-(start + length) // 8) * 8
    return expected_words(seed, lo, hi - lo).tobytes()[start - lo:start - lo + length]


def fill_ios(out: np.ndarray, offsets: np.ndarray, seeds: np.ndarray | int,
             rows: np.ndarray | None = None, threads: int = 1) -> None:
    """Write the pattern of each I/O into its row of ``out`` ((n, io_len) bytes, or the
    rows ``rows`` of it; offsets 8-byte aligned), in one vectorised pass: what a write puts
    on the target, so that any later read can prove it. Every step works in place: the
    temporaries of a plain expression would cost more than the arithmetic. With ``threads``
    the cache-sized pieces are shared out over that many threads (NumPy lets go of the
    interpreter lock inside each operation)."""
    n = len(offsets)
    if n == 0:
        return
    if rows is not None:
        block = np.empty((n, out.shape[1]), np.uint8)
        fill_ios(block, offsets, seeds, threads=threads)
        out[rows] = block
        return
    words = out[:n].view("<u8")
    offs = np.asarray(offsets, dtype=np.uint64)
    seed = np.ascontiguousarray(np.broadcast_to(np.asarray(seeds, dtype=np.uint64), (n,)))
    width = words.shape[1]
    # pieces of at most CHUNK_WORDS, which stay in the CPU's cache across the passes
    rows_per = max(1, CHUNK_WORDS // width)
    cols_per = min(width, CHUNK_WORDS)
    pieces = [(r, c) for r in range(0, n, rows_per) for c in range(0, width, cols_per)]
    native = native_fill() if words.strides[1] == 8 else None
    work = _native_work(native, words, offs, seed, rows_per, cols_per) if native else \
        _numpy_work(words, offs, seed, rows_per, cols_per)
    k = min(threads, len(pieces))
    if k > 1:
        list(_pool(k).map(work, [pieces[i::k] for i in range(k)]))
    else:
        work(pieces)
    if native is None:
        _headers(words, offs, seed)


def _numpy_work(words: np.ndarray, offs: np.ndarray, seed: np.ndarray, rows_per: int,
                cols_per: int) -> Callable[[list[tuple[int, int]]], None]:
    """Fill pieces of ``words`` with NumPy (the headers come after, in one pass)."""
    mix = (seed * GOLDEN)[:, None]  # seed_mix per I/O (wraps mod 2**64 as in C)

    def work(mine: list[tuple[int, int]]) -> None:
        tmp = np.empty(rows_per * cols_per, np.uint64)
        for r, c in mine:
            part = words[r:r + rows_per, c:c + cols_per]
            _splitmix_at(part, offs[r:r + rows_per], c, mix[r:r + rows_per],
                         tmp[:part.size].reshape(part.shape))
    return work


def _native_work(fill: Any, words: np.ndarray, offs: np.ndarray, seed: np.ndarray,
                 rows_per: int, cols_per: int) -> Callable[[list[tuple[int, int]]], None]:
    """Fill pieces of ``words`` with the compiled fill, headers included."""
    stride = words.strides[0] // 8
    base = words.ctypes.data
    n, width = words.shape

    def work(mine: list[tuple[int, int]]) -> None:
        for r, c in mine:
            rows, cols = min(rows_per, n - r), min(cols_per, width - c)
            part_offs = np.ascontiguousarray(offs[r:r + rows] + np.uint64(8 * c))
            fill(base + 8 * (r * stride + c), stride, rows, cols, part_offs.ctypes.data,
                 seed[r:r + rows].ctypes.data, MAGIC)
    return work


def native_fill() -> Any:
    """The compiled fill, or None (native/build.py)."""
    from gpufio.native.build import fill_function

    return fill_function()


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's fill threads (a forked worker makes its own: threads do not survive
    a fork)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1]._max_workers < threads:
        _POOL = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix="gpufio-fill"))
    return _POOL[1]


CHUNK_WORDS = 32768


def _splitmix_at(part: np.ndarray, offs: np.ndarray, col: int, mix: np.ndarray,
                 tmp: np.ndarray) -> None:
    """Rows of ``part`` become the pattern's words from byte ``offs + 8 * col`` on."""
    np.add(offs[:, None], np.arange(8 * col, 8 * (col + part.shape[1]), 8,
                                    dtype=np.uint64)[None, :], out=part)
    part ^= mix
    part += GOLDEN
    for shift, mult in ((30, M1), (27, M2)):
        np.right_shift(part, np.uint64(shift), out=tmp)
        part ^= tmp
        part *= mult
    np.right_shift(part, np.uint64(31), out=tmp)
    part ^= tmp


def _headers(words: np.ndarray, offs: np.ndarray, seed: np.ndarray) -> None:
    """Overwrite the header words of every block the I/Os (rows of ``words``) hold."""
    per_block = BLOCK // 8
    if not np.any(offs % np.uint64(BLOCK)) and words.shape[1] % per_block == 0:
        # whole blocks: the headers sit at fixed columns, one small array each
        blocks = words.reshape(len(offs), -1, per_block)
        start = offs[:, None] + np.arange(0, blocks.shape[1] * BLOCK, BLOCK,
                                          dtype=np.uint64)[None, :]
        s = seed[:, None]
        blocks[:, :, 0] = MAGIC
        blocks[:, :, 1] = start
        blocks[:, :, 2] = s
        blocks[:, :, 3] = start ^ (s ^ np.uint64(MAGIC))
        return
    x = offs[:, None] + np.arange(0, words.shape[1] * 8, 8, dtype=np.uint64)[None, :]
    pos = (x % np.uint64(BLOCK)) // np.uint64(8)
    block = x - pos * np.uint64(8)
    seed_full = np.broadcast_to(seed[:, None], x.shape)
    for w, value in enumerate((np.broadcast_to(np.uint64(MAGIC), x.shape), block, seed_full,
                               block ^ (seed_full ^ np.uint64(MAGIC)))):
        hit = pos == w
        words[hit] = value[hit]


def read_seed(first_block: bytes) -> int | None:
    """The seed a target was made with, from its first block, or None if it is not ours."""
    if len(first_block) < HEADER_WORDS * 8:
        return None
    magic, offset, seed, check = np.frombuffer(first_block[:32], dtype="<u8").tolist()
    if magic != MAGIC or offset != 0 or check != (offset ^ seed ^ MAGIC):
        return None
    return seed


CHECK_BYTES = 16 << 20  # the expected bytes bad_ios_host makes at a time


def bad_ios_host(buf: np.ndarray, offsets: np.ndarray, seeds: np.ndarray | int,
                 io_len: int) -> np.ndarray:
    """Indices of the I/Os in ``buf`` whose bytes differ from the pattern at their offset
    (the CPU's check; io/verify.bad_ios_device is the GPU's, with the same arguments).

    ``buf`` holds len(offsets) consecutive I/Os of ``io_len`` bytes each; ``seeds`` is each
    I/O's target seed, or one seed for all.
    """
    n = len(offsets)
    offs = np.asarray(offsets, dtype=np.uint64)
    if (offs % np.uint64(8)).any() or io_len % 8:
        raise ValueError("pattern ranges must be 8-byte aligned")
    words = buf.view("<u8").reshape(n, io_len // 8)
    per_io = np.broadcast_to(np.asarray(seeds, dtype=np.uint64), (n,))
    # the expected bytes of many I/Os in one fill (compiled where built), then one
    # comparison: a pattern computed I/O by I/O cost the Python loops more than their
    # reads; in pieces of CHECK_BYTES, so a batch of large I/Os needs no copy of itself
    step = max(1, CHECK_BYTES // io_len)
    want = np.empty((min(step, n), io_len), np.uint8)
    bad = []
    for lo in range(0, n, step):
        k = min(step, n - lo)
        fill_ios(want[:k], offs[lo:lo + k], per_io[lo:lo + k])
        bad.append(lo + np.flatnonzero((words[lo:lo + k] != want[:k].view("<u8")).any(axis=1)))
    return np.concatenate(bad).astype(np.int64) if bad else np.zeros(0, np.int64)
