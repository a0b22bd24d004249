"""Facts about this host as a storage + GPU benchmark sees it (``gpufio info``, results).

Everything is read from /proc, /sys and uname; nothing here needs a GPU. GPU facts come from
gpufio.io.gpu, which imports CuPy only when asked.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from gpufio import __version__


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def kernel_version() -> tuple[int, int]:
    """(major, minor) of the running kernel, for feature checks."""
    parts = platform.release().split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def io_uring_disabled() -> int | None:
    """The kernel.io_uring_disabled sysctl (0 allowed, 1 restricted, 2 off); None if absent."""
    try:
        return int(Path("/proc/sys/kernel/io_uring_disabled").read_text())
    except (OSError, ValueError):
        return None


def host_facts() -> dict[str, Any]:
    """CPU, memory, kernel and gpufio version: the header of every result."""
    return {
        "hostname": platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_bytes": _mem_total(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpufio_version": __version__,
    }

