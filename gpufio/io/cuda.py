"""CUDA sources from gpufio/kernels, compiled through CuPy once per process.

Compiling a RawModule takes hundreds of milliseconds; engines ask for their module during
setup, so no measurement ever includes it. Sources share headers (the data pattern, the
request API) through the kernels directory on the include path. CuPy's on-disk cache keys a
module by its top-level text only, so that text starts with a digest of every kernel file:
an edited header can never leave a stale cubin that disagrees with its freshly built peers.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpufio.native import cuda as native_cuda

KERNELS = Path(__file__).parent.parent / "kernels"


@lru_cache(maxsize=None)
def module(name: str) -> Any:
    """The compiled ``kernels/<name>.cu`` as a cupy.RawModule (compiled on first call)."""
    mod = raw_module((KERNELS / f"{name}.cu").read_text())
    mod.compile()
    return mod


def raw_module(code: str) -> Any:
    """A cupy.RawModule of ``code`` that may include gpufio's kernel headers: the include
    path, the shared constants (io/gio/contract.py) and, for CuPy's disk cache, a digest
    of every kernel file. Kernels of one's own that use the request API compile so."""
    from gpufio.io.gio import contract

    return native_cuda.compile_module(f"// gpufio kernels {kernels_digest()}\n" + code,
                                      ("-std=c++17", f"-I{KERNELS}", *contract.defines()))


def kernels_digest(directory: Path | None = None) -> str:
    """SHA-256 over every .cu and .cuh file of the kernels directory, names included."""
    h = hashlib.sha256()
    for path in sorted((directory or KERNELS).glob("*.cu*")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
