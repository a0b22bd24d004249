"""The null engine: every I/O completes as it is handed out, so a run counts exactly its
budget, splits it over the targets, and reads nothing."""

from __future__ import annotations

import pytest

from gpufio.core import targets
from gpufio.core.errors import BadInput
from gpufio.profile import from_dict, load
from gpufio.run import runner


def _run(paths, **opts):
    glob = {"engine": "null", "targets": [str(p) for p in paths], **opts}
    (r,) = runner.run_profile(from_dict({"global": glob}, "t.toml", {}), quiet=True).results
    return r


def test_a_budgeted_run_completes_exactly_its_ios_over_both_targets(tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 1 << 20, 1)
    targets.create_file(str(b), 1 << 20, 2)
    r = _run([a, b], iodepth=32, numjobs=2, io_size="4m")
    assert r.ok, r.failure
    assert r.ios == 2 * 1024 and r.bytes == r.ios * 4096
    assert [p["ios"] for p in r.per_target] == [1024, 1024]
    assert r.lat.n == r.ios and sum(r.lat.hist) == r.ios
    assert sorted(w["ios"] for w in r.per_worker) == [1024, 1024]
    assert r.engine_facts["moves_data"] is False


def test_a_timed_run_keeps_going_for_its_runtime(pattern_file):
    r = _run([pattern_file], iodepth=128, runtime="300ms", time_based=True)
    assert r.ok and r.ios > 0 and 0.25e9 < r.runtime_ns < 1.5e9


def test_verify_is_refused_because_nothing_is_read(pattern_file):
    with pytest.raises(BadInput, match="engine 'null' moves no data, so verify has nothing"):
        from_dict({"global": {"engine": "null", "targets": [str(pattern_file)],
                              "verify": True}}, "t.toml", {})


def test_fios_null_job_files_run_on_it(tmp_path):
    path = tmp_path / "null.fio"
    path.write_text("[global]\nioengine=null\nbs=4k\nsize=1m\n[j]\niodepth=16\n")
    (job,) = load(str(path)).jobs
    assert (job.engine, job.iodepth) == ("null", 16)
