"""Engine registry: every module in this package that defines an Engine subclass registers it.

Adding a data path means adding one module here; nothing else in gpufio names engines
(tests/test_architecture.py checks it).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import TYPE_CHECKING

from gpufio.engines.base import Engine

if TYPE_CHECKING:
    from gpufio.core.job import Job

# the engine of a job that names none: fio's default (psync) too
DEFAULT_ENGINE = "psync"
_REGISTRY: dict[str, type[Engine]] = {}
_loaded = False


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    global _loaded
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


def all_engines() -> dict[str, type[Engine]]:
    """Registered engines by name, in registration order."""
    if not _loaded:
        _load_builtin()
    return dict(_REGISTRY)


def settle(job: "Job") -> "Job":
    """``job`` with its engine's settings built once: the profile's values
    (``engine_options``) typed, then what the engine picks picked (``Engine.resolve``).
    The loader calls it for every job; a job whose targets change (an MPI rank's share)
    is settled again, being another job."""
    cls = all_engines()[job.engine]
    typed = replace(job, engine_settings=cls.Settings(**job.engine_options))
    return replace(typed, engine_settings=cls.resolve(typed))
