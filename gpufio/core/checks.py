"""What ``gpufio doctor`` reports: one finding per check, with its verdict and the fix.

Engines (their ``doctor``) and the targets' checks build these; the CLI renders them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    """One check: where (``area``), what, the verdict (ok, warn, fail), what was found, and
    the one-line fix when it is not ok."""

    area: str
    name: str
    status: str
    found: str
    fix: str = ""

    def row(self) -> dict[str, Any]:
        return asdict(self)


def verdict(area: str, name: str, good: bool, found: str, fix: str, bad: str = WARN) -> Check:
    """ok when ``good``, else ``bad`` (warn unless said) with ``fix``."""
    return Check(area, name, OK if good else bad, found, "" if good else fix)
