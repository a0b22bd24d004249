"""The one NVMe command encoder and status decoder of each language, held to each other byte
for byte: kernels/nvme_cmd.cuh (what the GPU agents run) compiled for the host by the C++
compiler with the layout macros NVRTC gets (io/gio/contract.defines), against
io/nvme/spec.py and io/nvme/passthru.py. Reads, writes and Flush; namespaces, LBA sizes,
starting LBAs past 32 bits, block counts, PRP1/PRP2, command identifiers; the 128-byte
passthrough entry; every status decoder. No GPU needed."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpufio.io import cuda
from gpufio.io.gio import contract
from gpufio.io.nvme import passthru, spec

CXX = shutil.which("g++") or shutil.which("c++")

# extern "C" doors into the header's inline functions, for ctypes
SHIM = r"""
#include "nvme_cmd.cuh"
extern "C" {
void cmd(u64* w, int flush, int write, unsigned cid, unsigned nsid, unsigned shift, u64 off,
         unsigned len, u64 prp1, u64 prp2)
{ nvme_cmd(w, flush != 0, write != 0, cid, nsid, shift, off, len, prp1, prp2); }
void uring_sqe(u64* w, unsigned fd, unsigned flags, unsigned nsid, unsigned shift, int write,
               u64 off, unsigned len, u64 addr, u64 ud)
{ nvme_uring_sqe(w, fd, flags, nsid, shift, write != 0, off, len, addr, ud); }
int result(unsigned status, unsigned len) { return nvme_result(status, len); }
int cqe_result(unsigned word, unsigned len) { return nvme_cqe_result(word, len); }
int uring_result(int res, unsigned len) { return nvme_uring_result(res, len); }
u64 prp2(u64 iova, unsigned len, u64 list) { return nvme_prp2(iova, len, list); }
}
"""

U64, U32, INT = ctypes.c_uint64, ctypes.c_uint, ctypes.c_int


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """nvme_cmd.cuh built for the host, as a shared library in the test's directory."""
    if CXX is None:
        pytest.skip("no C++ compiler (g++)")
    d = tmp_path_factory.mktemp("nvme_cmd")
    (d / "shim.cpp").write_text(SHIM)
    so = d / "libnvme_cmd.so"
    out = subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", "-Werror", "-Wno-unknown-pragmas",
                          "-shared", "-fPIC", f"-I{cuda.KERNELS}", *contract.defines(),
                          str(d / "shim.cpp"), "-o", str(so)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lib = ctypes.CDLL(str(so))
    lib.cmd.argtypes = [ctypes.POINTER(U64), INT, INT, U32, U32, U32, U64, U32, U64, U64]
    lib.uring_sqe.argtypes = [ctypes.POINTER(U64), U32, U32, U32, U32, INT, U64, U32, U64, U64]
    lib.result.argtypes = lib.cqe_result.argtypes = [U32, U32]
    lib.uring_result.argtypes = [INT, U32]
    lib.prp2.argtypes = [U64, U32, U64]
    lib.prp2.restype = U64
    return lib


def _commands() -> list[tuple[bool, bool, int, int, int, int, int, int, int]]:
    """(flush, write, cid, nsid, lba shift, offset, length, prp1, prp2) cases."""
    cases = []
    for (flush, write), nsid, shift in itertools.product(
            ((False, False), (False, True), (True, False)), (1, 2, 0xFFFFFFFE), (9, 12)):
        lba = 1 << shift
        for off, length in ((0, lba), (lba, 8 * lba), (3 * lba, 128 << 10),
                            ((1 << 32) * lba, lba), (((1 << 40) + 7) * lba, 64 * lba)):
            n = len(cases)
            cases.append((flush, write, n * 257 % (1 << 16), nsid, shift, off, length,
                          0x1_0000_0000 + n * 4096 + (n % 3) * 512, (n % 4) * 0x2000))
    return cases


def test_the_cuda_command_encoder_is_the_python_ones_byte_for_byte(lib):
    cases = _commands()
    want = []
    for flush, write, cid, nsid, shift, off, length, prp1, prp2 in cases:
        want.append(spec.flush_command(nsid, cid) if flush else spec.io_commands(
            write=write, nsid=nsid, lba_shift=shift, off=np.array([off], np.uint64),
            length=length, cid=cid, prp1=prp1, prp2=prp2))
    got = np.zeros((len(cases), 8), np.uint64)
    for row, case in zip(got, cases):
        lib.cmd(row.ctypes.data_as(ctypes.POINTER(U64)), *case)
    assert got.tobytes() == np.concatenate(want).tobytes()
    # and the vectorised encoder makes the same rows as one call
    cols = [np.array(c) for c in zip(*cases)]
    flush, write, cid, nsid, shift, off, length, prp1, prp2 = cols
    batch = spec.io_commands(write=write.astype(bool), nsid=nsid, lba_shift=shift,
                             off=off.astype(np.uint64), length=length, cid=cid,
                             prp1=prp1.astype(np.uint64), prp2=prp2.astype(np.uint64),
                             flush=flush.astype(bool))
    assert batch.tobytes() == got.tobytes()


def test_the_encoded_fields_are_nvmes():
    """A write of 3 blocks of 4 KiB at LBA 2^33 + 5, namespace 7, cid 9: opcode 0x01, CDW10/11
    the starting LBA's halves, CDW12 the block count less one; a Flush has no LBA or data."""
    (e,) = spec.io_commands(write=True, nsid=7, lba_shift=12, off=((1 << 33) + 5) << 12,
                            length=3 << 12, cid=9, prp1=0xA000, prp2=0xB000)
    assert (e["opcode"], e["cid"], e["nsid"], e["prp1"], e["prp2"]) == (1, 9, 7, 0xA000, 0xB000)
    assert (e["cdw10"], e["cdw11"], e["cdw12"]) == (5, 2, 2)
    (f,) = spec.flush_command(3, 4)
    assert (f["opcode"], f["cid"], f["nsid"], f["cdw10"], f["cdw12"], f["prp1"]) == (0, 4, 3, 0,
                                                                                     0, 0)


def test_the_cuda_passthrough_entry_is_the_python_ones_byte_for_byte(lib):
    cases = [(3 + c[3] % 5, c[1], c[3], c[4], c[1], c[5], c[6], c[7], c[2] | 5 << 32)
             for c in _commands() if not c[0]]
    fd, flags, nsid, shift, write, off, length, addr, ud = (np.array(c) for c in zip(*cases))
    want = passthru.build(write=write.astype(bool), fd=fd, nsid=nsid, lba_shift=shift,
                          off=off.astype(np.uint64), length=length, addr=addr.astype(np.uint64),
                          user_data=ud.astype(np.uint64), sqe_flags=flags)
    got = np.zeros((len(cases), 16), np.uint64)
    for row, case in zip(got, cases):
        lib.uring_sqe(row.ctypes.data_as(ctypes.POINTER(U64)), *case)
    assert np.array_equal(got, want)
    # the command inside is the 64-byte one, with the data where the kernel reads it
    e = passthru.entries(want.copy())
    assert (e["addr"] == addr).all() and (e["data_len"] == length).all()


@pytest.mark.parametrize("status", [0, 1, 0x02, 0x80, 0x281, 0x7FF, 0x4002, 0xC281, 0x4000])
@pytest.mark.parametrize("length", [512, 4096, 1 << 20])
def test_the_status_decoders_agree(lib, status, length):
    """NVMe status -> result in both languages: the bare status, a CQE's status word with
    either phase tag, and a passthrough completion's res (a -errno passes through)."""
    want = int(spec.status_result(np.array([status]), length)[0])
    assert lib.result(status, length) == want
    for phase in (0, 1):
        word = status << 1 | phase
        assert lib.cqe_result(word, length) == int(spec.result(np.array([word]), length)[0])
        assert lib.cqe_result(word, length) == want
    assert lib.uring_result(status, length) == int(passthru.result(np.array([status]), length)[0])
    assert lib.uring_result(status, length) == want
    assert lib.uring_result(-5, length) == int(passthru.result(np.array([-5]), length)[0]) == -5
    assert want == (length if status & spec.STATUS_MASK == 0
                    else -(spec.NVME_STATUS_BASE + (status & spec.STATUS_MASK)))


@pytest.mark.parametrize("pages", [1, 2, 3, 64])
def test_the_cuda_prp2_is_spec_prp_pointers(lib, pages):
    iova, lists = 0x4_0000_0000, 0x9_0000_0000
    for length in (pages * spec.PAGE - 512, pages * spec.PAGE):
        _, want, _ = spec.prp_pointers(iova, length, lists)
        assert lib.prp2(iova, length, lists) == want


def test_nothing_else_encodes_a_command():
    """The CUDA sources build NVMe commands only through nvme_cmd.cuh."""
    for src in Path(cuda.KERNELS).iterdir():
        if src.name != "nvme_cmd.cuh":
            text = src.read_text()
            assert "NQ_PUT(" not in text and "PT_PUT(" not in text, src.name
