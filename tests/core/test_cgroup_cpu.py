"""CPU counted in a cgroup of the job's own (cpu_accounting = "cgroup"): what a process in the
group burns is charged to it and nothing else is, the job's result says how its CPU was
counted, and the group is gone afterwards; where no group can be made it is one line."""

import os
import time

import pytest

from gpufio.core import cgroups
from gpufio.profile import from_dict
from gpufio.workloads.block import runner


def _group(name: str) -> cgroups.CpuGroup:
    try:
        return cgroups.CpuGroup(name)
    except OSError as e:
        pytest.skip(f"no cgroup can be made here: {e}")


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_process_in_the_group_is_charged_and_others_are_not():
    g = _group(f"gpufio-test-{os.getpid()}")
    try:
        child = os.fork()
        if child == 0:
            try:
                g.add(os.getpid())
                _burn(0.3)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        _burn(0.3)  # this process, outside the group
        t = g.times()
        assert 0.25 <= t.usr + t.sys <= 0.5
    finally:
        g.close([])
    assert not g.path.exists()


def test_a_cgroup_job_says_so_and_leaves_no_group_behind(tmp_path):
    probe = _group(f"gpufio-probe-{os.getpid()}")  # skips where no group can be made
    parent = probe.path.parent
    probe.close([])
    home = cgroups.own_paths("cpuacct")
    prof = from_dict({"global": {"engine": "psync", "size": "4m", "directory": str(tmp_path),
                                 "runtime": "300ms", "time_based": True,
                                 "cpu_accounting": "cgroup"}}, "t.toml", {})
    (r,) = runner.run_profile(prof, quiet=True).results
    assert r.ok and r.cpu_accounting == "cgroup"
    assert r.cpu.usr + r.cpu.sys > 0
    start, end = r.window_unix_ms
    assert 250 <= end - start <= 2000
    assert cgroups.own_paths("cpuacct") == home  # this process is back where it was
    assert not list(parent.glob(f"gpufio-{os.getpid()}-cpu"))


def test_no_cgroup_is_a_one_line_exit_2(monkeypatch, write_profile, pattern_file, run_quietly):
    def refuse(self, name):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cgroups.CpuGroup, "__init__", refuse)
    path = write_profile(f'[global]\nengine = "psync"\ntargets = ["{pattern_file}"]\n'
                         'cpu_accounting = "cgroup"\n')
    res = run_quietly(path)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "gpufio: error: job 'job': cpu_accounting = \"cgroup\": cannot make a cgroup here: "
        "Permission denied"]


def test_cgroup_accounting_with_concurrent_jobs_is_refused(write_profile, pattern_file,
                                                           run_quietly):
    path = write_profile(f'[global]\nengine = "psync"\ntargets = ["{pattern_file}"]\n'
                         'concurrent = true\ncpu_accounting = "cgroup"\n[[job]]\n[[job]]\n')
    res = run_quietly(path)
    assert res.exit_code == 2 and "cannot be used with concurrent = true" in res.stderr


def test_a_killed_runs_cpu_group_is_removed_by_the_next_one(dead_pid):
    g = _group(f"gpufio-probe-{os.getpid()}")
    parent = g.path.parent
    g.close([])
    stale, live = parent / f"gpufio-{dead_pid}-cpu", parent / f"gpufio-bench-{os.getpid()}-7"
    stale.mkdir()
    live.mkdir()
    try:
        fresh = cgroups.CpuGroup(f"gpufio-{os.getpid()}-cpu")
        fresh.close([])
        assert not stale.exists() and live.exists()
    finally:
        for d in (stale, live):
            if d.exists():
                d.rmdir()


@pytest.mark.parametrize("user,system,expected", [(2, 1, (2.0, 1.0)), (0, 0, (3.0, 0.0))])
def test_v1_times_are_the_exact_usage_split_by_the_sampled_user_and_system(
        tmp_path, user, system, expected):
    """cgroup v1's usage_user and usage_sys only count what scheduler ticks saw (nothing for
    a short burst, too little under load); cpuacct.usage is exact and is what is reported."""
    g = object.__new__(cgroups.CpuGroup)
    g.path, g.version = tmp_path, 1
    (tmp_path / "cpuacct.usage").write_text(str(3 * 10 ** 9))
    (tmp_path / "cpuacct.usage_user").write_text(str(user * 10 ** 6))
    (tmp_path / "cpuacct.usage_sys").write_text(str(system * 10 ** 6))
    t = g.times()
    assert (t.usr, t.sys) == pytest.approx(expected)
