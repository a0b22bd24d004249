"""The GPU pattern check agrees with the CPU one, byte for byte (runs only with a GPU)."""

import numpy as np
import pytest

from gpufio.core import pattern

pytestmark = pytest.mark.gpu


def _ios(offsets, io_len, seed):
    return np.concatenate([np.frombuffer(pattern.fill(seed, int(o), io_len), np.uint8)
                           for o in offsets])


@pytest.mark.parametrize("io_len", [4096, 16384, 512, 1 << 20])
def test_gpu_check_matches_cpu_check(io_len):
    import cupy

    from gpufio.io import verify as gpuverify

    rng = np.random.default_rng(io_len)
    offsets = (rng.integers(0, 1 << 18, 64) * 512).astype(np.uint64)
    offsets -= offsets % np.uint64(io_len if io_len <= 4096 else 4096)
    host = _ios(offsets, io_len, 77)
    host[3 * io_len + 100] ^= 0x01                 # a flipped bit in the body of I/O 3
    host[10 * io_len + 8:10 * io_len + 16] = 0     # a wrong header word in I/O 10
    seeds = np.full(len(offsets), 77, np.uint64)
    seeds[20] = 78                                 # I/O 20 checked against another seed
    got = gpuverify.bad_ios_device(cupy.asarray(host), offsets, seeds, io_len)
    cpu = pattern.bad_ios_host(host, offsets, seeds, io_len).tolist()
    assert got.tolist() == cpu == [3, 10, 20]


def test_a_block_from_the_wrong_offset_is_caught():
    import cupy

    from gpufio.io import verify as gpuverify

    offsets = np.array([0, 4096, 8192, 12288], np.uint64)
    host = _ios(offsets[[0, 2, 1, 3]], 4096, 5)    # blocks 1 and 2 swapped
    got = gpuverify.bad_ios_device(cupy.asarray(host), offsets, np.full(4, 5, np.uint64), 4096)
    assert got.tolist() == [1, 2]
