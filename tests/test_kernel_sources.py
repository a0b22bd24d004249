"""Every CUDA source in gpufio/kernels compiles as CuPy compiles it (io/cuda.raw_module's
options: C++17, the kernels directory on the include path, the shared constants), for
Hopper, with nvcc where one is installed: a kernel that no longer compiles fails on a
machine without a GPU, not first on the GPU machine."""

import shutil
import subprocess

import pytest

from gpufio.io import cuda
from gpufio.io.gio import contract

SOURCES = sorted(cuda.KERNELS.glob("*.cu"))
NVCC = shutil.which("nvcc")


def test_there_are_kernel_sources():
    assert {p.stem for p in SOURCES} >= {"gio_agent", "gio_bench", "gnn_gather", "verify"}


@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_the_kernel_compiles_with_cupys_options(source, tmp_path):
    out = subprocess.run([NVCC, "-std=c++17", f"-I{cuda.KERNELS}", *contract.defines(),
                          "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"),
                          str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "k.cubin").stat().st_size > 0



@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("module", ["io.nvme.test_passthru", "test_bam_gpu"])
def test_the_gpu_tests_own_kernels_compile(module, tmp_path):
    """The builder kernels the GPU tests compile for themselves (their BUILDER)."""
    import importlib

    src = tmp_path / "k.cu"
    src.write_text(importlib.import_module(f"tests.{module}").BUILDER)
    out = subprocess.run([NVCC, "-std=c++17", f"-I{cuda.KERNELS}", *contract.defines(),
                          "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
