"""Engine registry: every module in this package that defines an Engine subclass registers it.

Adding a data path means adding one module here; nothing else in gpufio names engines
(tests/test_architecture.py checks it).
"""

from __future__ import annotations

import importlib
import pkgutil

from gpufio.engines.base import Engine

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
