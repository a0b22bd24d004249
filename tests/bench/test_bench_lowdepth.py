"""bench/lowdepth.py's arithmetic: the IOPS ratio is paired by round, and the goals are
these (>= 0.95x fio, null >= 0.5x, qd-1 CPU <= 1.2x, qd-1 latency within max(1 us, 5 %))."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

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


def test_an_unclosed_quote_in_fio_args_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lowdepth", "--fio", "/bin/true", "--fio-args", '"x'])
    with pytest.raises(SystemExit) as e:
        lowdepth.main()
    assert e.value.code == 2
    assert "argument --fio-args: No closing quotation" in capsys.readouterr().err


def test_fewer_than_three_rounds_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lowdepth", "--rounds", "2", "--fio", "/bin/true"])
    with pytest.raises(SystemExit, match="at least 3"):
        lowdepth.main()


def test_control_runs_fio_in_both_columns_and_judges_it_alike(monkeypatch, tmp_path, capsys):
    # an A/A run: fio against itself, so the goals it misses are the machine's noise
    calls = []

    def fake_fio(fio, engine, target, qd, nj, runtime, ramp, extra, cpus) -> dict:
        calls.append(engine)
        return {**run(80 if len(calls) % 2 else 100, p50=10_000 + 2_000 * (len(calls) % 2)),
                "cpu": "cgroup", "sleeps": 1.0}

    def no_gpufio(*args) -> dict:
        raise AssertionError("gpufio ran in an A/A run")

    monkeypatch.setattr(lowdepth, "run_fio", fake_fio)
    monkeypatch.setattr(lowdepth, "run_gpufio", no_gpufio)
    out = tmp_path / "aa.json"
    monkeypatch.setattr(sys, "argv", [
        "lowdepth", "--fio", "/bin/true", "--quick", "--cases", "psync nj1", "--control",
        "--check", "--tmpfs-dir", str(tmp_path), "--root-dir", str(tmp_path), "--json", str(out)])
    assert lowdepth.main() == 1  # fio missed its own goals here: 0.8x, and 2 us of p50
    text = capsys.readouterr()
    assert "the gpufio column is fio too" in text.out
    assert "tmpfs psync nj1: IOPS 0.80x < 0.95x\n  tmpfs psync nj1: p50 12.0 vs 10.0 us" in text.err
    assert calls == ["psync"] * 4
    doc = json.loads(out.read_text())
    assert [d["control"] for d in doc] == [True, True]
    assert [d["cpus"] for d in doc] == [None, None]
    assert list(tmp_path.iterdir()) == [out]  # the target files are gone


def test_control_refuses_gpufio_settings(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lowdepth", "--fio", "/bin/true", "--control",
                                      "--set", "wait_spin=0"])
    with pytest.raises(SystemExit) as e:
        lowdepth.main()
    assert e.value.code == 2 and "--control runs no gpufio" in capsys.readouterr().err


def test_cpus_reads_taskset_lists_of_usable_cpus(monkeypatch):
    monkeypatch.setattr(lowdepth.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert lowdepth.cpu_list("1") == {1}
    assert lowdepth.cpu_list("0,2") == {0, 2}
    assert lowdepth.cpu_list("1-3") == {1, 2, 3}
    for bad, why in (("x", "expected CPUs"), ("1-", "expected CPUs"), ("4", "may use"),
                     ("3-2", "may use")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            lowdepth.cpu_list(bad)


def test_cpus_pins_the_tool_and_leaves_the_bench_alone():
    """The child runs on the CPUs asked for; the bench (and its sampler) keeps its own."""
    mine = os.sched_getaffinity(0)
    one = frozenset({min(mine)})
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    out, _ = lowdepth.run_counted([sys.executable, "-c", code], one)
    assert out.strip() == str(sorted(one))
    out, _ = lowdepth.run_counted([sys.executable, "-c", code])
    assert out.strip() == str(sorted(mine))
    assert os.sched_getaffinity(0) == mine


def test_set_reads_values_as_toml_scalars():
    assert lowdepth.setting("iodepth_batch_submit=0") == ("iodepth_batch_submit", 0)
    assert lowdepth.setting("defer_taskrun=false") == ("defer_taskrun", False)
    assert lowdepth.setting("op=read") == ("op", "read")
    assert lowdepth.setting("ramp_time=0.5") == ("ramp_time", 0.5)
    for text in ("null", "NaN", "[1]", '{"a": 1}'):  # not TOML scalars: strings
        assert lowdepth.setting(f"x={text}") == ("x", text)
    for bad in ("defer_taskrun", "=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            lowdepth.setting(bad)


def test_fio_without_latency_leaves_the_latency_goals_unjudged():
    # --fio-args=--gtod_reduce=1: fio reports no percentiles; the other goals still hold
    f = {**run(100, cpu=10.0), "p50": None, "p99": None}
    assert lowdepth.verdict("uring qd1", run(1, 1, 1, 12.0), f, 1.0) == []
    assert lowdepth.verdict("uring qd1", run(1, 1, 1, 12.1), f, 0.9) == [
        "IOPS 0.90x < 0.95x", "CPU/IO 12.10 > 1.2x 10.00 us"]
    m = lowdepth.medians([f, {**f, "iops": 300}, {**f, "iops": 200, "sleeps": 0.5}])
    assert (m["iops"], m["p50"], m["sleeps"]) == (200, None, 0.5)
    assert lowdepth.pair(run(1), m, "p50", ".1f", 1e3) == "-"
    assert lowdepth.pair(run(1, 12_340), run(1, 5_000), "p50", ".1f", 1e3) == "12.3/5.0"


def test_sleeps_count_the_tools_own_threads_and_keep_exited_ones(tmp_path):
    me = str(threading.get_native_id())
    (tmp_path / "cgroup.threads").write_text(f"{me}\n")
    mine = int(next(line.split()[1] for line in Path(f"/proc/{me}/status").read_text()
                    .splitlines() if line.startswith("voluntary_ctxt_switches:")))
    seen = {"gone": 7}  # a thread that has exited since the last look
    total = lowdepth.own_sleeps(tmp_path, seen)
    assert mine <= seen[me] and total == seen[me] + 7


def test_window_interpolates_any_sampled_counter():
    samples = [(0.0, 1.0, 100), (10.0, 2.0, 200), (20.0, 4.0, 200)]
    assert lowdepth.window(samples, 5.0, 15.0) == pytest.approx(1.5)
    assert lowdepth.window(samples, 5.0, 15.0, column=2) == pytest.approx(50)
    # sleeps read in every other sample only: the others do not hold the last value
    sparse = [(0.0, 0.0, 0), (5.0, 0.0, None), (10.0, 0.0, 100), (15.0, 0.0, None)]
    assert lowdepth.window(sparse, 5.0, 10.0, column=2) == pytest.approx(50)
    # 3 CPU seconds and 100 sleeps over 100 I/Os
    assert lowdepth.per_io(samples, 0.0, 20.0, 100) == (pytest.approx(30_000.0), 1.0)
    assert lowdepth.per_io(None, 0.0, 20.0, 100) == (None, None)


def test_a_bench_left_midway_takes_its_tool_along(tmp_path):
    """Ctrl-C or SIGTERM while a tool runs: the tool is killed and reaped, not left running."""
    import signal

    pidfile = tmp_path / "pid"

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        # the interrupt comes once the tool has written its pid: readiness, not a fixed sleep
        def arm() -> None:
            while not pidfile.exists() or not pidfile.read_text().strip():
                threading.Event().wait(0.01)
            signal.setitimer(signal.ITIMER_REAL, 0.01)
        threading.Thread(target=arm, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            lowdepth.run_counted(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped


def test_sigterm_removes_the_target_files(monkeypatch, tmp_path):
    """timeout(1) stops a bench with SIGTERM: its 1 GiB target files go as after Ctrl-C."""
    import signal

    def terminated(*args, **kw) -> dict:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not end the bench")

    monkeypatch.setattr(lowdepth, "run_gpufio", terminated)
    monkeypatch.setattr(lowdepth, "run_fio", terminated)
    monkeypatch.setattr(sys, "argv", ["lowdepth", "--fio", "/bin/true", "--quick",
                                      "--tmpfs-dir", str(tmp_path), "--root-dir", str(tmp_path)])
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            lowdepth.main()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert e.value.code == 143
    assert list(tmp_path.iterdir()) == []
