"""The GPU engines in their modes, as every GPU-memory engine test runs them
(tests/engines/: test_gpu_engines.py, test_gpu_writes.py): the cases, their pytest ids, and a
block job on one case, skipped with the reason where its engine is unavailable."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pytest

GPU_ENGINES = [
    {"engine": "cpu-gpu", "iodepth": 16},
    {"engine": "mmap", "iodepth": 16},
    {"engine": "cufile", "iodepth": 16},
    {"engine": "cufile", "iodepth": 16, "api": "batch", "iodepth_batch": 4},
    {"engine": "cufile", "iodepth": 16, "api": "batch", "register_buffers": True},
    {"engine": "cufile", "iodepth": 16, "api": "async", "streams": 4},
    {"engine": "gpu-uring", "iodepth": 16, "rings": 2},
    {"engine": "cpu-gpu", "iodepth": 16, "processes": True},
    {"engine": "mmap", "iodepth": 16, "processes": True},
    {"engine": "cufile", "iodepth": 16, "processes": True},
]
IDS = [e["engine"] + "".join(f"-{k}" if v is True else f"-{v}" for k, v in e.items()
                            if k in ("api", "processes", "register_buffers")) for e in GPU_ENGINES]


def run_case(engine: dict[str, Any], targets: Path | Sequence[Path], quiet: bool = True,
             **keys: Any):
    """One block job of ``engine``'s case over ``targets`` with the global ``keys``: its
    RunOutcome."""
    from gpufio.engines import all_engines
    from gpufio.profile import from_dict
    from gpufio.workloads.block import runner

    if why := all_engines()[engine["engine"]].unavailable():
        pytest.skip(f"{engine['engine']}: {why}")
    paths = [targets] if isinstance(targets, (str, Path)) else list(targets)
    glob = {**engine, "targets": [str(p) for p in paths], **keys}
    return runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=quiet)
