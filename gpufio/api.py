"""gpufio's Python API: what a script (bench/, a user's own) uses instead of the CLI and the
internals. A profile is the TOML's tables as a dict (``{"global": {...}, "job": [...]}``)
or a file's path; a result is the document ``gpufio run -f json`` writes, rendered by the
workload's own renderer. Beside runs and results, only what a script needs to set up a run
and read it: the data pattern laid out in a file, sizes, a cgroup whose CPU use is read, the
page cache dropped, an I/O log read. A bench that measures a mechanism below the API (the
software NVMe controller's rates) reaches it itself (bench/_nvme_rates.py); kernel authors
import gpufio.gpu."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from gpufio import profile as profiles
from gpufio.core import pattern as _pattern
from gpufio.core import targets as _targets
from gpufio.core.cgroups import CpuGroup
from gpufio.core.errors import BadInput, RunFailed
from gpufio.core.iolog import read as read_iolog
from gpufio.core.job import Profile
from gpufio.core.signals import sigterm_as_sigint
from gpufio.core.targets import evict
from gpufio.core.units import format_size, parse_size
from gpufio.results.render import render as render_rows
from gpufio.workloads import DEFAULT_WORKLOAD, Workload, all_workloads

__all__ = ["BadInput", "CpuGroup", "RunFailed", "evict", "format_size", "gpu_probe", "lay_out",
           "load", "parse_size", "pattern", "read_iolog", "render", "render_rows", "run",
           "stop_on_sigterm", "workload_of", "workload_of_result"]


def load(profile: Mapping[str, Any] | str | Path,
         overrides: Mapping[str, Any] | None = None) -> Profile:
    """The profile's jobs: from a dict of its tables, or a TOML / .fio file; ``overrides``
    as ``--set`` gives them (key -> value, every job). BadInput names what is wrong."""
    if isinstance(profile, (str, Path)):
        return profiles.load(str(profile), dict(overrides or {}))
    return profiles.from_dict(dict(profile), "<api>", dict(overrides or {}))


def workload_of(prof: Profile) -> Workload:
    """The workload the profile's jobs run (a profile runs one)."""
    names = sorted({job.workload for job in prof.jobs})
    if not names:
        raise BadInput(f"{prof.path}: no job to run")
    if len(names) > 1:
        raise BadInput(f"{prof.path}: a profile runs jobs of one workload, not "
                       f"{' and '.join(names)}")
    return all_workloads()[names[0]]


def run(profile: Mapping[str, Any] | str | Path | Profile, quiet: bool = True,
        repeat: int = 1) -> dict[str, Any]:
    """Run the profile: its result document (``doc["interrupted"]`` when Ctrl-C, or SIGTERM
    after ``stop_on_sigterm``, ended it; each job's ``error`` when it failed)."""
    prof = profile if isinstance(profile, Profile) else load(profile)
    return workload_of(prof).run(prof, quiet, repeat)


def render(doc: dict[str, Any], fmt: str = "markdown", console: Any = None) -> str:
    """A result document as its workload renders it ('table', 'markdown', 'csv', 'json',
    and the workload's own formats)."""
    return workload_of_result(doc).render(doc, fmt, console)


def workload_of_result(doc: dict[str, Any]) -> Workload:
    """The workload whose result document ``doc`` is (a block result names none)."""
    return all_workloads()[doc.get("workload", DEFAULT_WORKLOAD)]


def stop_on_sigterm() -> None:
    """From now on SIGTERM (timeout(1), a batch system) ends a run as Ctrl-C does: the
    current job stops at its next step and the document keeps what it measured."""
    sigterm_as_sigint()


def lay_out(path: str | Path, size: int, seed: int) -> None:
    """Create ``path`` holding ``size`` bytes of gpufio's data pattern of ``seed`` (what
    gpufio reads and verifies); an existing path is an error, never overwritten. The caller
    (a bench) chose the size, so no consent to a large layout is asked for."""
    _targets.create_file(os.fspath(path), size, seed, allow_large=True)


def pattern(seed: int, offset: int, nbytes: int) -> bytes:
    """The ``nbytes`` of gpufio's data pattern of ``seed`` at byte ``offset`` of a target
    (for a device a bench fills itself)."""
    return _pattern.fill(seed, offset, nbytes)


def gpu_probe() -> tuple[int, str | None]:
    """(number of usable GPUs, None), or (0, why there is none), in one line."""
    from gpufio.io import gpu

    return gpu.probe()
