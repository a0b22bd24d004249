"""bench/lowdepth.py's arithmetic: the IOPS ratio is paired by round, and the goals are the
issue's (>= 0.95x fio, null >= 0.5x, qd-1 CPU <= 1.2x, qd-1 latency within max(1 us, 5 %))."""

from __future__ import annotations

import sys

import pytest

from bench import lowdepth


def run(iops: float, p50: float = 10_000, p99: float = 20_000, cpu: float = 5.0) -> dict:
    return {"iops": iops, "p50": p50, "p99": p99, "cpu_us": cpu}


def test_ratio_is_the_median_of_each_rounds_own_ratio():
    # the VM halves its speed in round 2: both tools of that round slow alike
    g = [run(95), run(48), run(96)]
    f = [run(100), run(50), run(100)]
    assert lowdepth.paired_ratio(g, f) == pytest.approx(0.96)
    # medians taken apart would pair round 3's gpufio with round 1's fio
    assert lowdepth.paired_ratio([run(90), run(100)], [run(100), run(100)]) == 0.95


def test_verdict_holds_the_issues_goals():
    f = run(100, p50=40_000, p99=100_000, cpu=10.0)
    assert lowdepth.verdict("uring qd4", run(1), f, 0.95) == []
    assert lowdepth.verdict("uring qd4", run(1), f, 0.94) == ["IOPS 0.94x < 0.95x"]
    assert lowdepth.verdict("null qd1", run(1, cpu=1), run(1, cpu=1), 0.5) == []
    # qd 1: CPU at most 1.2x, latency within max(1 us, 5 %) either way
    assert lowdepth.verdict("uring qd1", run(1, 42_000, 105_000, 12.0), f, 1.0) == []
    miss = lowdepth.verdict("uring qd1", run(1, 37_000, 100_000, 12.1), f, 1.0)
    assert miss == ["CPU/IO 12.10 > 1.2x 10.00 us", "p50 37.0 vs 40.0 us"]
    small = run(1, p50=10_000, p99=10_000)
    assert lowdepth.verdict("psync nj1", run(1, 10_900, 9_100), small, 1.0) == []


def test_fewer_than_three_rounds_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lowdepth", "--rounds", "2", "--fio", "/bin/true"])
    with pytest.raises(SystemExit, match="at least 3"):
        lowdepth.main()
