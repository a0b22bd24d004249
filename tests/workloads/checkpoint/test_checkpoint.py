"""The checkpoint workload on the CPU engines (device = "cpu"): every round restores exactly
the bytes it saved, the files hold the pattern of each shard's offsets, a byte corrupted
between save and restore is caught at its file and offset, fsyncs are counted, the guard
holds, bad input is a one-line exit 2, and compare, check and plot read the results."""

import json
import os

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import pattern
from gpufio.core.tensors import ALIGN, Extent, pieces
from gpufio.profile import from_dict
from gpufio.workloads.checkpoint import driver, layout
from gpufio.workloads.checkpoint import run as ckrun
from gpufio.workloads.checkpoint.state import HIDDEN, MLP, VOCAB, cycled, llama_mix

cli = CliRunner()
CPU_ENGINES = ["psync", "uring", "mmap"]


def profile(tmp_path, **opts):
    glob = {"workload": "checkpoint", "device": "cpu", "state_size": "3m", "iterations": 2,
            "bs": "256k", "iodepth": 4, "targets": [str(tmp_path)], **opts}
    return from_dict({"global": glob}, "ck.toml", {})


def run(tmp_path, **opts):
    return driver.run_profile(profile(tmp_path, **opts), quiet=True)


def last_seed(doc_job, k=0):
    """The seed of a path's last round (engine: k = 0, naive: k = 1)."""
    o = doc_job["resolved options"]
    return 0x89 + 1 + k * o["iterations"] + o["iterations"] - 1


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("where", ["files", "single"])
def test_rounds_restore_what_they_saved_and_the_files_hold_the_pattern(tmp_path, engine, where,
                                                                       plan_holds_pattern):
    doc = run(tmp_path, engine=engine, layout=where, shards=["1m", "8k", "600k"], naive=False)
    (job,) = doc["jobs"]
    assert job["error"] == 0 and not job["interrupted"], job.get("failure")
    assert job["state_bytes"] == 3 << 20 and job["iterations_done"] == 2
    assert job["verify"] == {"bytes": 2 * (3 << 20), "bad_shards": 0, "first_bad": None}
    assert job["shards"] == 6 and job["smallest_shard"] == 8192
    sizes = cycled([1 << 20, 8192, 600 << 10], 3 << 20)
    p = layout.plan(profile(tmp_path, layout=where, shards=["1m", "8k", "600k"]).jobs[0], sizes)
    assert job["files"] == len(p.paths) == (6 if where == "files" else 1)
    plan_holds_pattern(p, last_seed(job))  # what landed is the last round's pattern
    for key in ("save", "restore"):
        assert job[key]["gb_per_s"] > 0 and job[key]["ttfb_ms"] > 0
        assert job[key]["cpu_s_per_gb"] > 0
    assert 0 < job["save"]["fsync_share"] < 1
    assert set(job["metrics"]) >= {"save_gbps", "restore_gbps", "save_ttfb_ms"}


def test_naive_row_is_the_baseline_of_its_group(tmp_path):
    doc = driver.run_profile(from_dict({"global": {
        "workload": "checkpoint", "device": "cpu", "state_size": "2m", "iterations": 1,
        "bs": "1m", "targets": [str(tmp_path)]},
        "job": [{"engine": "psync"}, {"engine": "uring", "iodepth": 4}]}, "ck.toml", {}),
        quiet=True)
    names = [j["jobname"] for j in doc["jobs"]]
    assert names == ["ck.0", "ck.0 naive", "ck.1"]  # naive once per group, after its first job
    naive = doc["jobs"][1]
    assert naive["baseline"] and naive["engine"] is None and naive["page_cache"]
    assert naive["verify"]["bad_shards"] == 0 and naive["verify"]["bytes"] == 2 << 20
    for j in (doc["jobs"][0], doc["jobs"][2]):
        assert j["vs_naive"]["save"] == pytest.approx(
            j["save"]["gb_per_s"] / naive["save"]["gb_per_s"])
    with open(os.path.join(tmp_path, layout.shard_name(0)), "rb") as f:
        first = f.read(ALIGN)
    assert pattern.read_seed(first) == last_seed(doc["jobs"][2])  # the last job wrote last


def test_a_byte_corrupted_between_save_and_restore_is_caught_at_its_offset(tmp_path, monkeypatch):
    real = ckrun.evict
    target = os.path.join(tmp_path, layout.shard_name(1))

    def corrupt_then_evict(paths):
        with open(target, "r+b") as f:
            f.seek(5000)
            b = f.read(1)
            f.seek(5000)
            f.write(bytes([b[0] ^ 0xFF]))
            os.fsync(f.fileno())
        real(paths)

    monkeypatch.setattr(ckrun, "evict", corrupt_then_evict)
    res = cli.invoke(app, ["run", str(_toml(tmp_path, "engine = \"uring\"\nnaive = false\n")),
                           "-f", "json", "-q"])
    assert res.exit_code == 1, res.output
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["verify"]["bad_shards"] == 2  # shard 1, in each of the two rounds
    assert job["verify"]["first_bad"] == f"shard 1: {target} at byte 5000"
    assert "restored shards differ" in res.stderr


def test_fsync_after_every_save_of_every_file(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    doc = run(tmp_path, engine="psync", shards=["1m"], naive=False)
    assert doc["jobs"][0]["files"] == 3 and len(calls) == 3 * 2


def test_ctrl_c_keeps_the_rounds_done(tmp_path):
    job = profile(tmp_path, engine="psync", iterations=3).jobs[0]
    done = []
    (res,) = ckrun.run_job(job, stop=lambda: len(done) >= 1,
                           progress=lambda *a: done.append(a), naive=True)
    assert res["iterations_done"] == 1 and res["interrupted"] and res["error"] == 0


def _toml(tmp_path, extra, name="ck.toml"):
    path = tmp_path / name
    where = "" if "\ntargets" in extra else f'targets = ["{tmp_path}"]'
    path.write_text(f"""[global]
workload = "checkpoint"
device = "cpu"
state_size = "2m"
iterations = 2
bs = "512k"
{where}
{extra}""")
    return path


@pytest.mark.parametrize("extra, message", [
    ('engine = "gpu-uring"', "engine 'gpu-uring' does not save tensors"),
    ('engine = "psync"\nshards = ["1m", "0"]', "key 'shards': a shard needs at least one byte"),
    ('engine = "psync"\nlayout = "stripes"', "key 'layout'"),
    ('engine = "psync"\nfeature_dim = 8', "key 'feature_dim' needs workload = \"gnn\""),
])
def test_bad_input_is_one_line_exit_2(tmp_path, extra, message):
    res = cli.invoke(app, ["run", str(_toml(tmp_path, extra))])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_guard_and_targets(tmp_path):
    other = tmp_path / "data.bin"
    other.write_bytes(b"precious" * 100_000)
    for extra, message in [
        (f'engine = "psync"\nlayout = "single"\ntargets = ["{other}"]',
         "does not carry gpufio's pattern"),
        (f'engine = "psync"\ntargets = ["{other}"]', 'layout = "files" puts a file per shard'),
        ('engine = "psync"\nlayout = "single"\ntargets = ["/dev/nvme9n9"]',
         "no such block device"),
        ('engine = "psync"\nlayout = "single"\ntargets = ["/tmp/no/such/dir/ck"]',
         "does not exist"),
        ('engine = "psync"\ntargets = ["/tmp/no/such/dir"]', "must be an existing directory"),
    ]:
        res = cli.invoke(app, ["run", str(_toml(tmp_path, extra, "g.toml"))])
        text = res.output.strip()
        assert res.exit_code == 2 and message in text and len(text.splitlines()) == 1, text
    assert other.read_bytes() == b"precious" * 100_000
    res = cli.invoke(app, ["run", str(_toml(
        tmp_path, f'engine = "psync"\nlayout = "single"\noverwrite = true\n'
                  f'naive = false\ntargets = ["{other}"]', "o.toml")), "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert pattern.read_seed(other.read_bytes()[:ALIGN]) is not None


def test_a_block_device_takes_a_single_checkpoint_once_named(tmp_path, losetup):
    img = tmp_path / "dev.img"
    img.write_bytes(bytes(8 << 20))
    dev = losetup(img)
    base = f'engine = "uring"\nlayout = "single"\nnaive = false\ntargets = ["{dev}"]\n'
    res = cli.invoke(app, ["run", str(_toml(tmp_path, base, "d.toml"))])
    assert res.exit_code == 2 and "confirm with write_device" in res.output
    assert img.read_bytes() == bytes(8 << 20)
    res = cli.invoke(app, ["run", str(_toml(tmp_path, base + f'write_device = "{dev}"', "d.toml")),
                           "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["verify"]["bad_shards"] == 0 and job["targets"][0]["kind"] == "block"
    res = cli.invoke(app, ["run", str(tmp_path / "d.toml"), "--set", "state_size=16m"])
    assert res.exit_code == 2 and "too small for its 16777216 bytes" in res.output


def test_repeat_is_refused(tmp_path):
    res = cli.invoke(app, ["run", str(_toml(tmp_path, 'engine = "psync"')), "--repeat", "2"])
    assert res.exit_code == 2 and "raise 'iterations' instead" in res.output


def test_compare_check_and_plot_read_checkpoint_results(tmp_path):
    prof = _toml(tmp_path, 'engine = "uring"\n[check]\nmax_drop = {save_gbps = "99%"}\n'
                           'max_rise = {restore_ttfb_ms = "10000%"}')
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        res = cli.invoke(app, ["run", str(prof), "-f", "json", "-q", "-o", str(out)])
        assert res.exit_code == 0, res.output
    res = cli.invoke(app, ["compare", str(a), str(b), "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    got = {(r["job"], r["metric"]): r for r in rows}
    assert got[("ck", "save_gbps")]["unit"] == "GB/s" and got[("ck naive", "restore_s")]
    assert got[("ck", "save_gbps")]["b ratio"] == pytest.approx(
        got[("ck", "save_gbps")]["b"] / got[("ck", "save_gbps")]["a"])
    res = cli.invoke(app, ["check", str(b), "--baseline", str(a)])
    assert res.exit_code == 0, res.output
    doc = json.loads(b.read_text())
    doc["jobs"][0]["metrics"]["save_gbps"] = json.loads(a.read_text())["jobs"][0]["metrics"][
        "save_gbps"] / 1000
    b.write_text(json.dumps(doc))
    res = cli.invoke(app, ["check", str(b), "--baseline", str(a)])
    assert res.exit_code == 1 and "save_gbps fell" in res.output
    res = cli.invoke(app, ["check", str(b), "--baseline", str(a), "--max-drop", "iops=5%"])
    assert res.exit_code == 2 and "unknown metric 'iops'" in res.output
    pytest.importorskip("matplotlib")
    res = cli.invoke(app, ["plot", str(a), str(b), "-o", str(tmp_path / "ck.png")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "ck.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_table_of_a_checkpoint_profile_names_its_metrics(tmp_path):
    res = cli.invoke(app, ["run", str(_toml(tmp_path, 'engine = "psync"\n[check]\n'
                                                      'max_drop = {iops = "5%"}'))])
    assert res.exit_code == 2 and "unknown metric 'iops'" in res.output
    assert "save_gbps" in res.output


def test_llama_mix_is_a_layer_stack_of_whole_blocks():
    m = llama_mix(16 << 30)
    assert sum(m) == 16 << 30 and all(n % ALIGN == 0 for n in m)
    assert m[0] == VOCAB * HIDDEN * 2 and m[-1] == VOCAB * HIDDEN * 2  # embedding, head
    assert m[1:8] == [HIDDEN * HIDDEN * 2] * 4 + [HIDDEN * MLP * 2] * 3
    assert m[8:10] == [HIDDEN * 2] * 2  # the norms
    small = llama_mix(1 << 20)
    assert sum(small) == 1 << 20 and len(small) > 9
    assert cycled([3 << 20, 1000], 4 << 20) == [3 << 20, 4096, (1 << 20) - 4096]


def test_pieces_cover_every_extent_and_the_files_take_turns():
    ext = [Extent(0, 0, 0, 10 * ALIGN), Extent(1, 1, 8 * ALIGN, 3 * ALIGN),
           Extent(2, 0, 10 * ALIGN, 4 * ALIGN)]
    p = pieces(ext, 4 * ALIGN)
    assert p.tolist() == [[0, 0, 0, 4 * ALIGN], [1, 0, 8 * ALIGN, 3 * ALIGN],
                          [0, 4 * ALIGN, 4 * ALIGN, 4 * ALIGN],
                          [0, 8 * ALIGN, 8 * ALIGN, 2 * ALIGN],
                          [2, 0, 10 * ALIGN, 4 * ALIGN]]
    one_file = pieces([Extent(0, 0, 0, 3 * ALIGN), Extent(1, 0, 3 * ALIGN, ALIGN)], ALIGN)
    assert one_file[:, 2].tolist() == [0, ALIGN, 2 * ALIGN, 3 * ALIGN]  # in file order


@pytest.mark.parametrize("where", ["files", "single"])
def test_two_targets_take_turns_with_the_shards(tmp_path, where):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    doc = run(tmp_path, engine="uring", layout=where, shards=["1m"], naive=False,
              targets=[str(a), str(b)])
    (job,) = doc["jobs"]
    assert job["error"] == 0 and job["verify"]["bytes"] == 2 * (3 << 20)
    assert sorted(t["path"] for t in job["targets"]) == sorted(
        [str(a), str(b)] if where == "files" else [str(a / layout.SINGLE_NAME),
                                                    str(b / layout.SINGLE_NAME)])
    on_a = sum(os.path.getsize(p) for p in a.iterdir())
    on_b = sum(os.path.getsize(p) for p in b.iterdir())
    assert (on_a, on_b) == (2 << 20, 1 << 20)  # shards 0 and 2 on a, shard 1 on b


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_ends_the_run_after_its_round_with_exit_130(tmp_path, sig):
    import signal
    import subprocess
    import sys
    import time

    prof = tmp_path / "c.toml"
    prof.write_text(f'[global]\nworkload = "checkpoint"\ndevice = "cpu"\nengine = "psync"\n'
                    f'state_size = "64m"\niterations = 50\nbs = "512k"\nnaive = false\n'
                    f'targets = ["{tmp_path}"]\n')
    out = tmp_path / "c.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpufio", "run", str(prof), "-f", "json",
                             "-o", str(out)], stderr=subprocess.PIPE, text=True)
    lines = []
    while len(lines) < 1:  # the first round is done
        line = proc.stderr.readline()
        assert line, "gpufio ended before its first round"
        if "round" in line:
            lines.append(line)
    proc.send_signal(getattr(signal, sig))
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - t0 < 30, err
    doc = json.loads(out.read_text())
    (job,) = doc["jobs"]
    assert doc["interrupted"] and job["interrupted"] and 1 <= job["iterations_done"] < 50
    assert job["verify"]["bad_shards"] == 0
    assert job["verify"]["bytes"] == job["iterations_done"] * (64 << 20)


def test_a_checkpoint_without_bs_moves_4m_pieces_and_a_given_bs_wins(tmp_path):
    glob = {"workload": "checkpoint", "device": "cpu", "state_size": "8m", "iterations": 1,
            "targets": [str(tmp_path)]}
    job = from_dict({"global": glob}, "ck.toml", {}).jobs[0]
    assert job.bs == 4 << 20  # not the block benchmark's 4 KiB
    assert from_dict({"global": {"size": "1m"}}, "b.toml", {}).jobs[0].bs == 4096
    assert from_dict({"global": {**glob, "bs": "64k"}}, "ck.toml", {}).jobs[0].bs == 64 << 10
    assert from_dict({"global": glob}, "ck.toml", {"bs": "1m"}).jobs[0].bs == 1 << 20
    given = {"global": glob, "job": [{"engine": "psync", "bs": "8k"}, {"engine": "uring"}]}
    assert [j.bs for j in from_dict(given, "ck.toml", {}).jobs] == [8 << 10, 4 << 20]
    doc = driver.run_profile(from_dict({"global": {**glob, "naive": False}}, "ck.toml", {}),
                             quiet=True)
    assert doc["jobs"][0]["bs"] == 4 << 20 and doc["jobs"][0]["error"] == 0


def test_a_path_that_cannot_run_here_is_one_line_before_any_round(tmp_path, monkeypatch):
    """A missing library (KvikIO for cufile, say) is the job's one-line refusal, exit 2,
    before any file is laid out, never its import error."""
    from gpufio.engines import all_engines

    monkeypatch.setattr(all_engines()["uring"], "unavailable",
                        classmethod(lambda cls: "liburing is elsewhere"))
    res = cli.invoke(app, ["run", str(_toml(tmp_path, 'engine = "uring"'))])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("gpufio: error: job 'ck': engine 'uring' cannot run here: "
                                  "liburing is elsewhere")
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".toml"]
