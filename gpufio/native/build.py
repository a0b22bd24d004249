"""C helpers compiled with the host's C compiler: the pattern fill (core/pattern_fill.c), for
writes from host memory, where NumPy makes about 1 GB/s per core, which bounds a worker's
large writes below what a drive takes; the latency histogram's binning (core/lat_bins.c),
which every recorded I/O passes through; the CPU engines' per-I/O loops (io/loops.c, bound
by native/loops.py); the compiled NVMe controller and drive models (io/nvme/). Each is built
once per machine into gpufio's cache directory and loaded through ctypes, which lets go of
the interpreter lock during the call, so fill threads run in parallel. Where there is no
compiler (or GPUFIO_NATIVE=0) there is no native code: the pattern is filled and latencies
binned with NumPy and the loops run in Python, the same bytes and results, slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core"
SOURCE = CORE / "pattern_fill.c"
LAT_SOURCE = CORE / "lat_bins.c"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufio" / "native"


def _cpu_identity() -> bytes:
    """The CPU's model and instruction flags, from /proc/cpuinfo's first processor."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    first = text.split("\n\n", 1)[0]
    return "".join(line for line in first.splitlines()
                   if line.startswith(("model name", "flags"))).encode()


def _build(cc: str, lib: Path, sources: tuple[Path, ...], options: tuple[str, ...]) -> bool:
    """Compile ``sources`` into ``lib`` with ``options`` (for this CPU, else for any of its
    architecture)."""
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
    except OSError:
        return False
    for flags in (["-march=native"], []):
        try:
            subprocess.run([cc, "-O3", *flags, *options, "-fPIC", "-shared", "-o", tmp,
                            *map(str, sources)],
                           check=True, capture_output=True, timeout=120)
            os.replace(tmp, lib)  # whole, or not at all: another process may be loading it
            return True
        except (OSError, subprocess.SubprocessError):
            continue
    Path(tmp).unlink(missing_ok=True)
    return False


@lru_cache(maxsize=None)
def library(name: str, sources: tuple[Path, ...], headers: tuple[Path, ...] = (),
            options: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """``sources`` compiled and loaded as the library ``name``, or None (see the module);
    ``headers``: the files they include (their bytes are part of the build's identity),
    ``options``: the compiler's (-I, -D)."""
    if os.environ.get("GPUFIO_NATIVE", "1") == "0":
        return None
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not all(src.is_file() for src in (*sources, *headers)):
        return None
    # built for this CPU's instructions (AVX-512 multiplies 8 words at once), so the name
    # carries the CPU's identity too: a home directory shared by other machines is safe
    digest = hashlib.sha256(b"".join(src.read_bytes() for src in (*sources, *headers))
                            + "\0".join(options).encode() + _cpu_identity()).hexdigest()[:12]
    lib = _cache_dir() / f"{name}-{digest}-{platform.machine()}.so"
    if not lib.exists() and not _build(cc, lib, sources, options):
        return None
    try:
        return ctypes.CDLL(str(lib))
    except OSError:
        return None


def typed(lib: ctypes.CDLL | None, signatures: Mapping[str, tuple[list, object]]
          ) -> ctypes.CDLL | None:
    """``lib`` (a library loaded by ``library``, or None) with each named entry point given
    its (argtypes, restype), once per load: every caller gets the same typed functions."""
    if lib is not None and not hasattr(lib, "_gpufio_typed"):
        for name, (args, res) in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        lib._gpufio_typed = True
    return lib


@lru_cache(maxsize=1)
def fill_function() -> ctypes._CFuncPtr | None:
    """gpufio_fill(out, stride, n, words, offsets, seeds, magic), or None (see the module);
    the arrays go as their addresses."""
    lib = library("pattern_fill", (SOURCE,))
    if lib is None:
        return None
    fn = lib.gpufio_fill
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    fn.restype = None
    return fn


@lru_cache(maxsize=1)
def lat_function() -> ctypes._CFuncPtr | None:
    """gpufio_lat_add(lat, n, hist, moments, extremes), or None (see the module); the
    arrays go as their addresses."""
    lib = library("lat_bins", (LAT_SOURCE,))
    if lib is None:
        return None
    fn = lib.gpufio_lat_add
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p]
    fn.restype = None
    return fn
