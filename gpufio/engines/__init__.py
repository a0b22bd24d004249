"""Engine registry: every module in this package that defines an Engine subclass registers it.

Adding a data path means adding one module here and its name in ``MODULES``; nothing else in
gpufio names engines (tests/test_architecture.py checks it). A lookup by name imports only
that engine's module, so a run does not wait for the libraries of the engines it does not use;
listing the engines imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator, Mapping

from gpufio.engines.base import Engine

if TYPE_CHECKING:
    from gpufio.core.job import Job

# the engine of a job that names none: fio's default (psync) too
DEFAULT_ENGINE = "psync"
# engine name -> the module of this package that registers it, in listing order
# (tests/cli/test_startup.py checks it against what importing every module registers)
MODULES = {"bam": "bam", "cpu-gpu": "cpugpu", "cufile": "cufile", "gpu-uring": "gpu_uring",
           "mmap": "mmap", "null": "null", "psync": "psync", "uring": "uring",
           "uring-cmd": "uring_cmd"}
_REGISTRY: dict[str, type[Engine]] = {}
_loaded = False


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    """Import every module of the package (a module ``MODULES`` does not list too)."""
    global _loaded
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


class _Engines(Mapping[str, type[Engine]]):
    """The registry as a mapping: ``[name]`` and ``in`` import one module; iterating, the
    length and the views import every module."""

    def __getitem__(self, name: str) -> type[Engine]:
        if name not in _REGISTRY and name in MODULES:
            importlib.import_module(f"{__name__}.{MODULES[name]}")
        if name not in _REGISTRY and not _loaded:
            _load_builtin()
        return _REGISTRY[name]

    def __iter__(self) -> Iterator[str]:
        if not _loaded:
            _load_builtin()
        yield from [n for n in MODULES if n in _REGISTRY]
        yield from [n for n in list(_REGISTRY) if n not in MODULES]

    def __len__(self) -> int:
        return sum(1 for _ in self)


_ENGINES = _Engines()


def all_engines() -> Mapping[str, type[Engine]]:
    """Registered engines by name: the built-in ones in ``MODULES`` order, then any other."""
    return _ENGINES


def settle(job: "Job") -> "Job":
    """``job`` with its engine's settings built once: the profile's values
    (``engine_options``) typed, then what the engine picks picked (``Engine.resolve``).
    The loader calls it for every job; a job whose targets change (an MPI rank's share)
    is settled again, being another job."""
    cls = all_engines()[job.engine]
    typed = replace(job, engine_settings=cls.Settings(**job.engine_options))
    return replace(typed, engine_settings=cls.resolve(typed))
