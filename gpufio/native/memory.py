"""Views of raw memory through ctypes: an address of a Python buffer, and bytes, words or a
numpy array at an address (ring memory the kernel shares, mapped host memory, shared
counters), a mapped BAR's registers, and copies between addresses. A view does not own its memory: its caller keeps the memory alive for as long
as the view is used."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

U32 = ctypes.c_uint32


def address_of(buf: Any) -> int:
    """The address of a writable buffer (an mmap, a bytearray)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def bytes_at(addr: int, n: int) -> memoryview:
    """The ``n`` bytes at ``addr`` as a writable memoryview of unsigned bytes."""
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def array_at(addr: int, dtype: Any, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` at ``addr`` as a numpy array (no copy)."""
    dtype = np.dtype(dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(addr)
    return np.ctypeslib.as_array(raw).view(dtype)


def u32_at(addr: int) -> ctypes.c_uint32:
    """The 32-bit word at ``addr``; ``.value`` reads and writes it (a ring's head or tail:
    one plain load or store, which costs less than a numpy element)."""
    return U32.from_address(addr)


def int64_words(n: int, *, buffer: Any = None, addr: int | None = None) -> ctypes.Array:
    """``n`` int64 words over ``buffer`` (writable) or at ``addr``: ``words[i]`` reads and
    writes one, a third of what a numpy element costs (a flag read, a live counter)."""
    kind = ctypes.c_int64 * n
    return kind.from_buffer(buffer) if buffer is not None else kind.from_address(addr)


def words_address(words: ctypes.Array) -> int:
    """The address of words made by ``int64_words``."""
    return ctypes.addressof(words)


def registers(buf: Any) -> tuple[memoryview, memoryview]:
    """(32-bit, 64-bit) words over a mapped BAR ``buf`` (an mmap): ``u32[off >> 2]`` and
    ``u64[off >> 3]`` read or write the register at byte offset ``off``, one load or store
    of its width (CPython moves a native item with one fixed-size copy), made once so a
    register access costs an index. Release both before the map is closed."""
    view = memoryview(buf)
    return view.cast("I"), view.cast("Q")


def memmove(dst: int, src: int, n: int) -> None:
    """Copy ``n`` bytes from address ``src`` to address ``dst``."""
    ctypes.memmove(dst, src, n)


def pointer(addr: int) -> ctypes.c_void_p:
    """``addr`` as a C pointer, for an API that takes one (CuPy's host copies)."""
    return ctypes.c_void_p(addr)
