"""Every CUDA source in gpufio/kernels compiles as CuPy compiles it (io/cuda.raw_module's
options: C++17, the kernels directory on the include path, the shared constants), for
Hopper, with nvcc where one is installed: a kernel that no longer compiles fails on a
machine without a GPU, not first on the GPU machine."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufio.io import cuda
from gpufio.io.gio import contract

SOURCES = sorted(cuda.KERNELS.glob("*.cu"))
NVCC = shutil.which("nvcc")


def test_there_are_kernel_sources():
    assert {p.stem for p in SOURCES} >= {"gio_agent", "gio_bench", "gnn_gather", "verify"}


def _compile(source: Path, cubin: Path) -> bytes:
    """The cubin of ``source`` as io/cuda.raw_module's options build it, for Hopper."""
    out = subprocess.run([NVCC, "-std=c++17", f"-I{cuda.KERNELS}", *contract.defines(),
                          "-arch=sm_90", "-cubin", "-o", str(cubin), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return cubin.read_bytes()


def _entry_points(text: str) -> set[str]:
    return set(re.findall(r'extern "C" __global__ void (\w+)\(', text))


@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_the_kernel_compiles_with_cupys_options(source, tmp_path):
    """It compiles, and the cubin holds each entry point the host fetches by name."""
    cubin = _compile(source, tmp_path / "k.cubin")
    names = _entry_points(source.read_text())
    assert names and [n for n in names if n.encode() + b"\0" not in cubin] == []


@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("module", ["io.nvme.test_passthru", "io.nvme.test_bam_gpu"])
def test_the_gpu_tests_own_kernels_compile(module, tmp_path):
    """The builder kernels the GPU tests compile for themselves (their BUILDER)."""
    import importlib

    src = tmp_path / "k.cu"
    src.write_text(importlib.import_module(f"tests.{module}").BUILDER)
    cubin = _compile(src, tmp_path / "k.cubin")
    assert b"build\0" in cubin


def test_every_kernel_declares_an_entry_point():
    """What the compile tests look for in each cubin (without nvcc, at least the sources)."""
    assert all(_entry_points(p.read_text()) for p in SOURCES)
