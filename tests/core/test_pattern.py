import os
import zlib

import numpy as np
import pytest

from gpufio.core import pattern


def test_each_block_header_names_its_offset_and_seed():
    data = np.frombuffer(pattern.fill(99, 0, 3 * pattern.BLOCK), dtype="<u8").reshape(3, -1)
    for i, block in enumerate(data):
        magic, off, seed, check = block[:4].tolist()
        assert (magic, off, seed) == (pattern.MAGIC, i * pattern.BLOCK, 99)
        assert check == off ^ seed ^ pattern.MAGIC


def test_any_range_matches_the_whole():
    whole = np.frombuffer(pattern.fill(5, 0, 64 << 10), dtype="<u8")
    for start, length in [(8, 16), (4088, 24), (12288, 4096), (1000, 8000), (0, 64 << 10)]:
        assert np.array_equal(pattern.expected_words(5, start, length),
                              whole[start // 8:(start + length) // 8])


def test_pattern_is_incompressible_and_seed_dependent():
    a = pattern.fill(1, 0, 1 << 20)
    assert len(zlib.compress(a)) > 0.99 * len(a)
    assert a[64:4096] != pattern.fill(2, 0, 1 << 20)[64:4096]


def test_read_seed_recognises_only_our_pattern():
    assert pattern.read_seed(pattern.fill(77, 0, 4096)) == 77
    assert pattern.read_seed(pattern.fill(77, 4096, 4096)) is None  # block 1 is not offset 0
    assert pattern.read_seed(b"\0" * 4096) is None
    assert pattern.read_seed(b"short") is None


def test_bad_ios_host_finds_a_single_flipped_bit():
    offsets = np.array([0, 8192, 65536, 4096], dtype=np.uint64)
    buf = np.concatenate([np.frombuffer(pattern.fill(3, int(o), 4096), np.uint8) for o in offsets])
    assert len(pattern.bad_ios_host(buf, offsets, 3, 4096)) == 0
    buf[2 * 4096 + 1000] ^= 0x10
    assert pattern.bad_ios_host(buf, offsets, 3, 4096).tolist() == [2]
    # a block read from the wrong offset is caught too
    swapped = offsets[[1, 0, 2, 3]]
    buf[2 * 4096 + 1000] ^= 0x10
    assert pattern.bad_ios_host(buf, swapped, 3, 4096).tolist() == [0, 1]


def test_unaligned_ranges_are_refused():
    with pytest.raises(ValueError):
        pattern.expected_words(1, 4, 8)


@pytest.mark.parametrize("shape", [(1, 1 << 20), (5, 4096), (3, 12288), (40, 8192)])
def test_fill_threads_write_the_same_bytes(shape):
    """Sharing the fill out over threads changes who computes a word, never the word."""
    n, width = shape
    offs = np.arange(n, dtype=np.uint64) * np.uint64(width) + np.uint64(8 << 20)
    one, many = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
    pattern.fill_ios(one, offs, 11, threads=1)
    pattern.fill_ios(many, offs, 11, threads=3)
    assert np.array_equal(one, many)
    assert np.array_equal(many[-1].view("<u8"), pattern.expected_words(11, int(offs[-1]), width))


def test_fill_threads_leave_cores_to_the_workers():
    from gpufio.profile import from_dict
    from gpufio.run.opening import MAX_FILL_THREADS, fill_threads

    def job(**o):
        return from_dict({"global": o}, "p.toml", {}).jobs[0]

    assert fill_threads(job(rw="randread")) == 1  # reads fill nothing
    cores = os.cpu_count() or 1
    assert fill_threads(job(rw="write")) == max(1, min(MAX_FILL_THREADS, cores))
    assert fill_threads(job(rw="write", numjobs=4 * cores)) == 1


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("start, width, n", [(0, 8, 3), (4096 * 3 + 24, 40, 2), (8, 4096, 5),
                                              (1 << 30, 3 * 4096 + 8, 4), (4072, 64, 1)])
def test_compiled_and_numpy_fills_write_the_reference_words(monkeypatch, native, start, width, n):
    if native and pattern.native_fill() is None:
        pytest.skip("no C compiler here")
    if not native:
        monkeypatch.setattr(pattern, "native_fill", lambda: None)
    offs = np.arange(n, dtype=np.uint64) * np.uint64(width) + np.uint64(start)
    out = np.empty((n, width), np.uint8)
    pattern.fill_ios(out, offs, [5, 6, 7, 8, 9][:n], threads=2)
    for i in range(n):
        assert np.array_equal(out[i].view("<u8"),
                              pattern.expected_words(5 + i, int(offs[i]), width)), i


def test_no_compiler_or_gpufio_native_0_means_numpy(monkeypatch):
    from gpufio.native import build as native

    def forget() -> None:
        native.fill_function.cache_clear()
        native.library.cache_clear()

    forget()
    try:
        monkeypatch.setenv("GPUFIO_NATIVE", "0")
        assert native.fill_function() is None
        forget()
        monkeypatch.delenv("GPUFIO_NATIVE")
        monkeypatch.setattr(native.shutil, "which", lambda name: None)
        assert native.fill_function() is None
    finally:
        forget()


def test_a_worker_names_the_bad_ios_of_a_batch_over_two_targets():
    """WorkerContext.mismatches checks a batch at once: each I/O against its own target's
    seed and offset, short ones left out (they already failed), indices into the batch."""
    from gpufio.core.context import WorkerContext
    from gpufio.core.offsets import Distribution, OffsetStream
    from gpufio.core.shared import JobShared

    shared = JobShared(1)
    stream = OffsetStream(random=False, bs=4096, regions=[(0, 16), (0, 16)],
                          dist=Distribution("random"), file_service="roundrobin", seed=(1,),
                          budget=None)
    ctx = WorkerContext(bs=4096, stream=stream, control=shared.control, ntargets=2,
                        block=shared.blocks[0], seeds=[5, 9], verify=True,
                        continue_on_error=False)
    tgt = np.array([0, 1, 0, 1, 1])
    offs = np.array([0, 4096, 8192, 40960, 12288], dtype=np.uint64)
    slots = np.empty((5, 4096), np.uint8)
    pattern.fill_ios(slots, offs, np.array([[5, 9][t] for t in tgt], dtype=np.uint64))
    slots[3, 100] ^= 1  # a flipped bit in I/O 3
    slots[2] = 0  # I/O 2 came back short: not checked again
    res = np.array([4096, 4096, 2048, 4096, 4096])
    assert ctx.mismatches(slots, tgt, offs, res) == [3]
    # the same bytes read as if from the other target are all wrong
    assert ctx.mismatches(slots, 1 - tgt, offs, res) == [0, 1, 3, 4]


def test_bad_ios_host_checks_a_batch_larger_than_its_piece(monkeypatch):
    """The check works in pieces of CHECK_BYTES; a bad I/O in a later piece is named by its
    index in the batch, and an offset off the 8-byte grid is refused."""
    monkeypatch.setattr(pattern, "CHECK_BYTES", 3 * 4096)
    offsets = np.arange(7, dtype=np.uint64) * 4096
    buf = np.empty((7, 4096), np.uint8)
    pattern.fill_ios(buf, offsets, 11)
    buf[5, 9] ^= 0x80
    assert pattern.bad_ios_host(buf, offsets, 11, 4096).tolist() == [5]
    with pytest.raises(ValueError, match="8-byte aligned"):
        pattern.bad_ios_host(buf[:1], np.array([4]), 11, 4096)
