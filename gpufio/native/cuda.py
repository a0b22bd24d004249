"""CUDA's native entry points, each reached here: NVRTC (through CuPy's RawModule, which
compiles a source at run time), libcuda's presence (the driver's user-space library), and
cuFile's bindings (cuda-python's ``cuda.bindings.cufile``). CuPy and cuda-python are
imported on first use, so a machine without them loads gpufio all the same."""

from __future__ import annotations

from typing import Any

from gpufio.native import libc

LIBCUDA = "libcuda.so.1"


def compile_module(code: str, options: tuple[str, ...]) -> Any:
    """A cupy.RawModule of ``code``, compiled by NVRTC with ``options`` when first used."""
    import cupy

    return cupy.RawModule(code=code, options=options)


def libcuda_present() -> bool:
    """Whether libcuda, the driver's user-space library, loads here."""
    return libc.load(LIBCUDA) is not None


def cufile() -> Any:
    """``cuda.bindings.cufile`` (ImportError where cuda-python's cuFile bindings are not
    installed)."""
    import cuda.bindings.cufile as cf

    return cf
