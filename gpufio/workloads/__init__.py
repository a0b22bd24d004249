"""Workloads: what a job does with the engines, registered by name like the engines.

A workload declares its own profile keys (``options``, typed as ``settings``), checks a job's values of them
(``check``), runs a whole profile of its jobs into a result document (``run``), renders that
document (``formats``, ``render``), says what went wrong in it (``problems``), names the
files and devices a job reads or writes, laying them out on request (``targets``: what
``gpufio prepare``, ``info PROFILE`` and ``doctor PROFILE`` ask), names what its jobs leave
in a scratch directory (``scratch``: what ``gpufio clean`` removes) and the metrics its
results offer compare and check (``metrics``), which keys of a job's I/O run its jobs
use (``job_keys``) and its own defaults of common keys (``defaults``). The keys of a job's
I/O run (``run_keys``: rw, numjobs, runtime, verify ...) are the default workload's, block's,
declared there and carried by every job (``run_keys()``). The profile loader
and the CLI ask this registry and name no workload; adding one is a module (or package) here
named as the workload, and its name in ``NAMES``. A lookup by name imports only that
workload's module, so a run does not wait for the libraries of the workloads it does not use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from gpufio.core.options import Option
from gpufio.results.load import Metric

if TYPE_CHECKING:
    from gpufio.core.job import Job, Profile

# the workload of a job that names none
DEFAULT_WORKLOAD = "block"
# the built-in workloads, each the module (or package) of this name here that registers it
# (tests/cli/test_startup.py checks that each does)
NAMES = ("block", "checkpoint", "gnn")


@dataclass(frozen=True)
class RunKeys:
    """The keys of a job's I/O run (its direction, phases, syncs, checks, reporting): the
    fields of core/job.Job beyond the common keys, declared by the workload they describe."""

    options: tuple[Option, ...]
    # (the job's values, its keys as written, where) -> None: checks the values together
    # and settles them in place (rwmixwrite folded into rwmixread, an iolog's targets ...),
    # or BadInput
    settle: Callable[[dict[str, Any], dict[str, Any], str], None]


@dataclass(frozen=True)
class Workload:
    """One workload's entry in the registry."""

    name: str
    summary: str
    options: tuple[Option, ...]
    # ``options`` as a typed, frozen dataclass (core/options.settings_class, defined at
    # module level so a job pickles): a job's ``workload_settings``, built once by the loader
    settings: type
    # (where, engine name, the job's settings) -> None, or BadInput
    check: Callable[[str, str, Any], None]
    formats: tuple[str, ...]
    # (profile, quiet, repeat) -> the result document
    run: Callable[["Profile", bool, int], dict[str, Any]]
    # (document, format, console or None) -> text ('table' may print to the console)
    render: Callable[[dict[str, Any], str, Any], str]
    # document -> one line per job whose numbers cannot be trusted
    problems: Callable[[dict[str, Any]], list[str]]
    # (job, lay out) -> the paths the job reads or writes; with lay out, first created and
    # filled as a run would (never where the write guard or a device's name forbids)
    targets: Callable[["Job", bool], list[str]]
    # the names (a regular expression) of the files its jobs leave in a scratch directory,
    # which 'gpufio clean' removes
    scratch: str
    # what compare and check read of its results, and a profile's [check] table may limit
    metrics: tuple[Metric, ...] = ()
    # common keys whose default suits this workload's work better than the block
    # benchmark's (a key the job gives still wins)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # the keys of a job's I/O run (run_keys(): rw, numjobs, runtime, fsync, verify, the
    # write guard's ...) its jobs use; any other is refused in one line. None: all
    job_keys: frozenset[str] | None = frozenset()
    # the keys of a job's I/O run, where this workload declares them (the default one)
    run_keys: RunKeys | None = None
    # (documents of one profile's sections run apart, gpufio run --section) -> one document
    # as one run of them all would have written it; None: shown one at a time
    merge: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Make ``workload`` available under its name."""
    _REGISTRY[workload.name] = workload
    return workload


class _Workloads(Mapping[str, Workload]):
    """The registry as a mapping: ``[name]`` and ``in`` import that workload's module
    alone; iterating, the length and the views import every built-in one."""

    def __getitem__(self, name: str) -> Workload:
        if name not in _REGISTRY and name in NAMES:
            importlib.import_module(f"{__name__}.{name}")
        return _REGISTRY[name]

    def __iter__(self) -> Iterator[str]:
        for name in NAMES:
            self[name]
        yield from [n for n in NAMES if n in _REGISTRY]
        yield from [n for n in list(_REGISTRY) if n not in NAMES]

    def __len__(self) -> int:
        return sum(1 for _ in self)


_WORKLOADS = _Workloads()


def all_workloads() -> Mapping[str, Workload]:
    """Every workload by name: the built-in ones in ``NAMES`` order, then any other."""
    return _WORKLOADS


def run_keys() -> RunKeys:
    """The keys of a job's I/O run, which every job carries: the default workload's (a job
    that names no workload is one of its jobs)."""
    keys = all_workloads()[DEFAULT_WORKLOAD].run_keys
    if keys is None:
        raise TypeError(f"workload '{DEFAULT_WORKLOAD}' declares no run_keys")
    return keys
