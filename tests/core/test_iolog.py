"""fio iologs: the GNN workload writes its aggregation reads as one, fio (where installed)
accepts it, and gpufio replays any version 2 or 3 log through a block engine with the log's
own counts, offsets and order; every problem in a log is one line naming it."""

import json
import shutil
import subprocess

import numpy as np
import pytest

from gpufio.core import iolog, targets
from gpufio.core.errors import BadInput
from gpufio.core.offsets import ReplayStream
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

BS = 4096


def write_log(path, lines, version=2):
    path.write_text(f"fio version {version} iolog\n" + "".join(f"{ln}\n" for ln in lines))
    return path


@pytest.fixture
def two_files(tmp_path):
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    targets.create_file(str(a), 1 << 20, 3)
    targets.create_file(str(b), 1 << 20, 4)
    return a, b


@pytest.fixture
def trace_log(tmp_path, two_files):
    a, b = two_files
    offs = [(a, 8), (b, 0), (a, 0), (a, 200), (b, 255), (b, 17), (a, 8)]
    lines = [f"{a} add", f"{b} add", f"{a} open", f"{b} open"]
    lines += [f"{p} read {blk * BS} {BS}" for p, blk in offs]
    lines += [f"{a} close", f"{b} close"]
    return write_log(tmp_path / "t.iolog", lines), offs


def test_a_written_log_reads_back_as_the_same_reads(tmp_path, two_files):
    a, b = two_files
    w = iolog.Writer(str(tmp_path / "w.iolog"), [str(a), str(b)])
    w.reads(np.array([1, 0, 1]), np.array([4096, 0, 123 * 512]), 512)
    w.reads(np.array([0]), np.array([8192]), 512)
    w.close()
    t = iolog.read(str(tmp_path / "w.iolog"))
    assert t.files == (str(a), str(b)) and t.version == 2 and w.entries == 4
    assert t.tgt.tolist() == [1, 0, 1, 0] and t.offs.tolist() == [4096, 0, 62976, 8192]
    assert t.lens.tolist() == [512] * 4 and not t.writes.any()


def test_version_3_timestamps_are_set_aside(tmp_path, two_files):
    a, _ = two_files
    path = write_log(tmp_path / "v3.iolog", [f"0 {a} add", f"1 {a} open", f"5 {a} read 0 4096",
                                             f"9 {a} write 4096 4096", f"12 {a} sync",
                                             f"15 {a} close"], version=3)
    t = iolog.read(str(path))
    assert t.version == 3 and t.offs.tolist() == [0, 4096] and t.writes.tolist() == [False, True]
    assert t.skipped == 1


@pytest.mark.parametrize("lines,msg", [
    (["/x add", "/x frobnicate 0 4096"], r"line 3: expected 'FILE read\|write OFFSET LENGTH'"),
    (["/x read 0 4096"], r"line 2: /x was never added"),
    (["/x add", "/x read zero 4096"], r"line 3: offset and length must be integers"),
    (["/x add", "/x read 0 0"], r"line 3: offset 0 and length 0"),
    (["/x add", "/x open", "/x close"], r"no read or write to replay"),
])
def test_a_bad_log_is_one_line_naming_file_and_line(tmp_path, lines, msg):
    path = write_log(tmp_path / "bad.iolog", lines)
    with pytest.raises(BadInput, match=rf"^read_iolog {path}: {msg}"):
        iolog.read(str(path))


def test_not_an_iolog_says_so(tmp_path):
    path = tmp_path / "x.iolog"
    path.write_text("hello\n")
    with pytest.raises(BadInput, match="line 1: not an fio iolog"):
        iolog.read(str(path))


def test_the_log_decides_targets_block_size_and_direction(trace_log, two_files):
    path, _ = trace_log
    (job,) = from_dict({"global": {"engine": "psync", "read_iolog": str(path)}}, "p.toml", {}).jobs
    assert job.targets == tuple(str(p) for p in two_files) and job.bs == BS and job.rw == "read"
    with pytest.raises(BadInput, match=r"key 'bs': the iolog .* gives 4096; leave 'bs' out"):
        from_dict({"global": {"engine": "psync", "read_iolog": str(path), "bs": "8k"}}, "p", {})


def test_timed_replay_and_several_lengths_are_refused(tmp_path, two_files):
    a, _ = two_files
    v3 = write_log(tmp_path / "v3.iolog", [f"0 {a} add", f"3 {a} read 0 4096"], version=3)
    with pytest.raises(BadInput, match="set replay_no_stall = true"):
        from_dict({"global": {"engine": "psync", "read_iolog": str(v3)}}, "p.toml", {})
    assert from_dict({"global": {"engine": "psync", "read_iolog": str(v3),
                                 "replay_no_stall": True}}, "p.toml", {}).jobs[0].bs == 4096
    two = write_log(tmp_path / "two.iolog", [f"{a} add", f"{a} read 0 4096", f"{a} read 0 8192"])
    with pytest.raises(BadInput, match="its I/Os have 2 lengths"):
        from_dict({"global": {"engine": "psync", "read_iolog": str(two)}}, "p.toml", {})


def test_a_replay_hands_out_the_logs_ios_in_order(trace_log):
    path, offs = trace_log
    s = ReplayStream(iolog.read(str(path)), budget=7)
    got = [s.next(3), s.next(3), s.next(3), s.next(3)]
    tgt = np.concatenate([g[0] for g in got]).tolist()
    off = np.concatenate([g[1] for g in got]).tolist()
    assert off == [blk * BS for _, blk in offs] and tgt == [0, 1, 0, 0, 1, 1, 0]
    assert len(got[-1][1]) == 0  # done after one replay
    loop = ReplayStream(iolog.read(str(path)), budget=None)
    assert loop.next(10)[1].tolist()[7:] == [8 * BS, 0, 0]  # a time-based job wraps around


@pytest.mark.parametrize("engine", ["psync", "uring"])
def test_a_replay_reads_each_logged_block_verified(trace_log, engine):
    path, offs = trace_log
    prof = from_dict({"global": {"engine": engine, "read_iolog": str(path), "verify": True,
                                 "numjobs": 2, "iodepth": 4}}, "p.toml", {})
    (r,) = runner.run_profile(prof, quiet=True).results
    assert r.ok and r.verify_failures == 0
    assert r.ios == 2 * len(offs)  # each worker replays the whole log, as fio's jobs do
    assert [p["ios"] for p in r.per_target] == [2 * 4, 2 * 3]


def test_a_log_past_a_targets_end_or_unaligned_for_o_direct_is_refused(tmp_path, two_files):
    a, _ = two_files
    past = write_log(tmp_path / "p.iolog", [f"{a} add", f"{a} read {(1 << 20) - 512} 4096"])
    prof = from_dict({"global": {"engine": "psync", "read_iolog": str(past), "direct": False}},
                     "p.toml", {})
    with pytest.raises(BadInput, match=rf"an I/O at byte {(1 << 20) - 512} of {a} runs past"):
        runner.run_profile(prof, quiet=True)
    odd = write_log(tmp_path / "o.iolog", [f"{a} add", f"{a} read 100 4096"])
    prof = from_dict({"global": {"engine": "psync", "read_iolog": str(odd)}}, "p.toml", {})
    with pytest.raises(BadInput, match="not multiples of 512 cannot be read with O_DIRECT"):
        runner.run_profile(prof, quiet=True)


def test_gpu_uring_refuses_a_replay(trace_log):
    path, _ = trace_log
    with pytest.raises(BadInput, match="pick their own offsets; replaying an iolog"):
        from_dict({"global": {"engine": "gpu-uring", "read_iolog": str(path)}}, "p.toml", {})


def test_the_gnn_workloads_log_is_replayed_alike_by_fio_and_gpufio(tmp_path):
    log = tmp_path / "agg.iolog"
    prof = from_dict({"global": {"workload": "gnn", "device": "cpu", "engine": "mmap",
                                 "nodes": 5000, "feature_dim": 128, "iterations": 3,
                                 "warmup": 1, "batch_size": 32, "fanout": [4, 2],
                                 "directory": str(tmp_path), "gnn_iolog": str(log)}},
                     "g.toml", {})
    from gpufio.workloads import all_workloads

    doc = all_workloads()["gnn"].run(prof, True, 1)
    facts = doc["jobs"][0]["iolog"]
    assert facts["entries"] == sum(facts["per_iteration"]) and len(facts["per_iteration"]) == 3
    trace = iolog.read(str(log))
    assert len(trace.offs) == facts["entries"] and set(trace.lens.tolist()) == {512}
    (r,) = runner.run_profile(from_dict({"global": {"engine": "psync", "read_iolog": str(log),
                                                    "direct": False}}, "p.toml", {}),
                              quiet=True).results
    assert r.ok and r.ios == facts["entries"]
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio is not installed: its replay of the log is not checked here")
    out = subprocess.run([fio, "--name=replay", f"--read_iolog={log}", "--ioengine=psync",
                          "--output-format=json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["jobs"][0]["read"]["total_ios"] == facts["entries"]
