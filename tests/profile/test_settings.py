"""Typed settings, built once per job: an engine's and a workload's options are a frozen
dataclass on the job (engine_settings, workload_settings), what the engine picks picked by
its resolve hook when the profile is read, and None where the engine picks at run time."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from gpufio import api
from gpufio.core.errors import BadInput
from gpufio.engines import all_engines
from gpufio.profile import from_dict
from gpufio.workloads import _REGISTRY, all_workloads


def _count_builds(monkeypatch, engine: str, workload: str) -> dict[str, list[str]]:
    """Record each job (by name) whose engine settings ``engine``'s resolve hook resolves,
    and each construction of the engine's and the workload's Settings."""
    seen: dict[str, list[str]] = {"resolve": [], "engine": [], "workload": []}
    cls = all_engines()[engine]
    resolve, engine_settings = cls.resolve, cls.Settings

    def counted_resolve(_cls, job):
        seen["resolve"].append(job.name)
        return resolve(job)

    def counted_engine(**values):
        seen["engine"].append("built")
        return engine_settings(**values)

    entry = all_workloads()[workload]

    def counted_workload(**values):
        seen["workload"].append("built")
        return entry.settings(**values)

    monkeypatch.setattr(cls, "resolve", classmethod(counted_resolve))
    monkeypatch.setattr(cls, "Settings", counted_engine)
    monkeypatch.setitem(_REGISTRY, workload, replace(entry, settings=counted_workload))
    return seen


def test_a_block_jobs_settings_are_built_and_resolved_once_per_run(tmp_path, monkeypatch):
    seen = _count_builds(monkeypatch, "psync", "block")
    prof = {"global": {"engine": "psync", "rw": "read", "size": "64k", "io_size": "64k",
                       "directory": str(tmp_path), "direct": False},
            "job": [{"name": "a", "bs": "4k"}, {"name": "b", "bs": "8k"}]}
    doc = api.run(prof)
    assert [j["error"] for j in doc["jobs"]] == [0, 0]
    assert sorted(seen["resolve"]) == ["a", "b"]
    assert len(seen["engine"]) == 2 and len(seen["workload"]) == 2


def test_a_gnn_jobs_settings_are_built_and_resolved_once_per_run(tmp_path, monkeypatch):
    seen = _count_builds(monkeypatch, "mmap", "gnn")
    prof = {"global": {"workload": "gnn", "engine": "mmap", "device": "cpu", "nodes": 2000,
                       "feature_dim": 16, "hidden": 8, "batch_size": 32, "fanout": [4, 2],
                       "iterations": 3, "warmup": 1, "directory": str(tmp_path)}}
    doc = api.run(prof)
    assert doc["jobs"][0]["error"] == 0
    assert len(seen["resolve"]) == 1 and len(seen["engine"]) == 1
    assert len(seen["workload"]) == 1


def test_what_the_engine_picks_is_none_in_the_settings():
    gnn = {"workload": "gnn", "engine": "cpu-gpu", "device": "cpu", "nodes": 2000}
    job = from_dict({"global": gnn}, "g.toml", {}).jobs[0]
    assert job.iodepth is None  # the rows' depth: core/rows.row_depth
    assert job.engine_settings.sqe_async is None  # io-wq for rows of in-memory tables
    assert job.workload_settings.batch_size == 1024
    job = from_dict({"global": {**gnn, "iodepth": 8, "sqe_async": False}}, "g.toml", {}).jobs[0]
    assert job.iodepth == 8 and job.engine_settings.sqe_async is False
    block = from_dict({"global": {"engine": "cpu-gpu"}}, "b.toml", {}).jobs[0]
    assert block.iodepth == 1 and block.workload_settings.rate_iops == 0


def test_gpu_urings_derived_settings_are_picked_when_the_profile_is_read(monkeypatch):
    from gpufio.engines import gpu_uring

    monkeypatch.setattr(gpu_uring.os, "cpu_count", lambda: 8)
    job = from_dict({"global": {"engine": "gpu-uring", "iodepth": 16}}, "t.toml", {}).jobs[0]
    o = job.engine_settings
    assert (o.rings, o.threads, o.sq_threads, o.registered) == (4, 64, 1, True)
    assert job.engine_options["rings"] is None  # what the document shows: as given
    with pytest.raises(BadInput, match="sq_threads \\(3\\) exceeds rings \\(2\\)"):
        from_dict({"global": {"engine": "gpu-uring", "rings": 2, "sq_threads": 3}}, "t.toml", {})
    with pytest.raises(BadInput, match="key 'rings': must be greater than 0"):
        from_dict({"global": {"engine": "gpu-uring", "rings": 0}}, "t.toml", {})


def test_gpu_uring_resolves_once_at_load_and_describing_resolves_nothing(monkeypatch):
    """Its rings were worked out again in describe, the worker and the row fetcher."""
    from gpufio.engines import gpu_uring

    picks = []
    default_rings = gpu_uring.default_rings
    monkeypatch.setattr(gpu_uring, "default_rings", lambda *a: picks.append(a) or default_rings(*a))
    jobs = from_dict({"global": {"engine": "gpu-uring"}, "job": [{"name": "a"}, {"name": "b"}]},
                     "t.toml", {}).jobs
    assert len(picks) == 2
    facts = [gpu_uring.GpuUring.describe(j) for j in jobs]
    assert len(picks) == 2 and [f["rings"] for f in facts] == [j.engine_settings.rings for j in jobs]


@pytest.mark.parametrize("table", [
    {"engine": "gpu-uring", "rings": 2},
    {"workload": "gnn", "engine": "mmap", "device": "cpu"},
    {"workload": "checkpoint", "engine": "uring", "device": "cpu"},
])
def test_a_job_pickles_with_its_settings(table):
    """Spawned workers and trainers get the job pickled, settings and all."""
    job = from_dict({"global": table}, "t.toml", {}).jobs[0]
    back = pickle.loads(pickle.dumps(job))
    assert back.engine_settings == job.engine_settings
    assert back.workload_settings == job.workload_settings
    assert type(back.engine_settings) is all_engines()[job.engine].Settings
