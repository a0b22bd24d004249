"""CUDA sources from gpufio/kernels, compiled through CuPy once per process.

Compiling a RawModule takes hundreds of milliseconds; engines ask for their module during
setup, so no measurement ever includes it. Sources share headers (the data pattern) through
the kernels directory on the include path.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

KERNELS = Path(__file__).parent / "kernels"


@lru_cache(maxsize=None)
def module(name: str) -> Any:
    """The compiled ``kernels/<name>.cu`` as a cupy.RawModule (compiled on first call)."""
    import cupy

    source = (KERNELS / f"{name}.cu").read_text()
    mod = cupy.RawModule(code=source, options=("-std=c++17", f"-I{KERNELS}"))
    mod.compile()
    return mod
