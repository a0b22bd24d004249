"""`gpufio prepare`, `info PROFILE` and `doctor PROFILE` work on every shipped profile,
whatever its workload: they ask the workload where its jobs read and write (its targets
hook), never the block runner. Sizes are cut down with --set so nothing big is laid out;
nothing runs I/O."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app

from checkout import PROFILES

PROFILES = sorted(PROFILES.glob("*.toml"))
# each workload's keys that keep a layout small
SMALL = {"block": ["size=64k"], "gnn": ["nodes=8192", "feature_dim=128"],
         "checkpoint": ["state_size=1m", "bs=64k"]}
cli = CliRunner()


def _workload(path: Path) -> str:
    return profile.load(str(path)).jobs[0].workload


def _sets(path: Path) -> list[str]:
    return [arg for s in SMALL[_workload(path)] for arg in ("--set", s)]


def _devices(path: Path) -> list[str]:
    return [t for j in profile.load(str(path)).jobs for t in j.targets if t.startswith("/dev/")]


def test_every_workload_has_a_shipped_profile():
    assert {_workload(p) for p in PROFILES} == set(SMALL)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_prepare_lays_out_what_the_profile_reads(path, scratch):
    scratch.mkdir()
    res = cli.invoke(app, ["prepare", str(path), *_sets(path)])
    missing = [d for d in _devices(path) if not os.path.exists(d)]
    if missing:  # a drive this machine lacks: one line naming it, nothing created
        assert res.exit_code == 2 and missing[0] in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and not any(scratch.iterdir())
        return
    assert res.exit_code == 0, res.output
    ready = [line.removesuffix(": ready") for line in res.stdout.splitlines()
             if line.endswith(": ready")]
    assert ready and all(os.path.getsize(p) > 0 for p in ready)
    assert all(Path(p).is_relative_to(scratch) for p in ready)
    again = cli.invoke(app, ["prepare", str(path), *_sets(path)])  # laid out once: reused
    assert again.exit_code == 0 and again.stdout == res.stdout


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_info_and_doctor_describe_the_profiles_targets(path, scratch):
    scratch.mkdir()
    res = cli.invoke(app, ["info", str(path), "-f", "json"])
    assert res.exit_code == 0, res.output
    described = json.loads(res.stdout)["targets"]
    assert described, "no target described"
    res = cli.invoke(app, ["doctor", str(path), "-f", "json"])
    assert res.exit_code in (0, 1), res.output  # 1: a fail found (no GPU here, no drive)
    areas = {c["area"] for c in json.loads(res.stdout)["checks"]}
    assert {f"target {p}" for p in described} <= areas
    rows = [c for c in json.loads(res.stdout)["checks"] if c["area"].startswith("target ")
            and c["name"] == "exists"]
    # a scratch file not laid out yet is the run's to create: a warning, not a failure
    assert all(c["status"] == ("fail" if c["area"].startswith("target /dev/") else "warn")
               for c in rows), rows
