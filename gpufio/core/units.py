"""fio-compatible size and time parsing, so profiles read like fio job files."""

from __future__ import annotations

import re

from gpufio.core.errors import BadInput

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*$", re.IGNORECASE)
_TIME_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}


def parse_size(value: int | str, what: str) -> int:
    """Bytes from an int or a fio size string ('4k', '1m', '2g'; k = 1024 as fio's kb_base).

    ``what`` names the key in the error so the user knows which line to fix.
    """
    if isinstance(value, bool):
        raise BadInput(f"{what}: expected a size such as 4k or 1g, got {value!r}")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise BadInput(f"{what}: expected a size such as 4k or 1g, got {value!r}")
    m = _SIZE_RE.match(value)
    if not m:
        raise BadInput(f"{what}: cannot read size {value!r} (use bytes or a unit: 4k, 1m, 2g, 1t)")
    number, unit = float(m.group(1)), m.group(2).lower()
    nbytes = number * _SIZE_MULT[unit]
    if nbytes != int(nbytes):
        raise BadInput(f"{what}: size {value!r} is not a whole number of bytes")
    return int(nbytes)


def parse_time_ns(value: int | float | str, what: str) -> int:
    """Nanoseconds from seconds (a bare number, as fio's runtime) or '500ms', '10s', '2m'."""
    if isinstance(value, bool):
        raise BadInput(f"{what}: expected a time such as 10s or 500ms, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value * 1_000_000_000)
    if not isinstance(value, str):
        raise BadInput(f"{what}: expected a time such as 10s or 500ms, got {value!r}")
    m = _TIME_RE.match(value)
    if not m:
        raise BadInput(f"{what}: cannot read time {value!r} (use 500ms, 10s, 2m)")
    unit = (m.group(2) or "s").lower()
    return int(float(m.group(1)) * _TIME_NS[unit])


def size_spec(nbytes: int) -> str:
    """``nbytes`` as a size a profile takes back (parse_size), in the largest unit that
    holds it whole: 536870912 -> '512m', 3072 -> '3k', 1536 -> '1536'."""
    for unit in "ptgmk":
        if nbytes and nbytes % _SIZE_MULT[unit] == 0:
            return f"{nbytes // _SIZE_MULT[unit]}{unit}"
    return str(nbytes)


def format_size(nbytes: float) -> str:
    """Human-readable binary size for tables and messages."""
    if abs(nbytes) < 1024:
        return f"{nbytes:.0f}B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if abs(nbytes) < 1024:
            return f"{nbytes:.1f}{unit}"
    return f"{nbytes / 1024:.1f}TiB"
