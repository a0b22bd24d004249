"""The CLI as a user meets it: exit codes, one-line errors, result fields."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core.units import format_size
from gpufio.engines import all_engines, register
from gpufio.engines.base import Engine
from gpufio.io import gpu

from checkout import PROFILES, REPO

cli = CliRunner()

FAST = """
[global]
size = "1m"
runtime = "400ms"
time_based = true
sample_interval = "100ms"
[[job]]
name = "rand"
numjobs = 2
[[job]]
name = "seq"
rw = "read"
bs = "64k"
"""


def test_run_json_is_fio_shaped_and_consistent(write_profile):
    res = cli.invoke(app, ["run", str(write_profile(FAST)), "--format", "json", "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["gpufio version"] and doc["host"]["cpus"] >= 1 and not doc["interrupted"]
    assert [j["jobname"] for j in doc["jobs"]] == ["rand", "seq"]
    for job in doc["jobs"]:
        rd = job["read"]
        assert rd["iops"] > 0 and rd["total_ios"] > 0 and job["error"] == 0
        assert rd["iops"] * rd["runtime"] / 1000 == pytest.approx(rd["total_ios"], rel=1e-6)
        assert rd["bw_bytes"] == pytest.approx(rd["iops"] * job["resolved options"]["bs"])
        assert rd["io_kbytes"] == rd["io_bytes"] // 1024
        lat = rd["lat_ns"]
        assert lat["N"] == rd["total_ios"]
        assert 0 < lat["min"] <= lat["percentile"]["50.000000"] <= lat["percentile"]["99.000000"]
        assert lat["percentile"]["99.990000"] <= lat["max"] * 1.01
        assert len(lat["percentile"]) == 17
        assert job["usr_cpu"] >= 0 and job["sys_cpu"] >= 0 and job["cpu_us_per_io"] > 0
        assert job["targets"][0]["kind"] == "file" and job["targets"][0]["ios"] == rd["total_ios"]
        assert job["samples"] and job["engine_facts"]["page_cache"] is False
        assert job["resolved options"]["direct"] is True


@pytest.mark.parametrize("fmt,marker", [("csv", "job,engine,rw,IOPS"), ("markdown", "| job "),
                                        ("table", "IOPS")])
def test_table_formats(fmt, marker, write_profile):
    res = cli.invoke(app, ["run", str(write_profile(FAST)), "-f", fmt, "-q", "--set", "runtime=200ms"])
    assert res.exit_code == 0, res.output
    assert marker in res.stdout and "rand" in res.stdout and "seq" in res.stdout


def test_output_file_and_concurrent_group_total(write_profile, tmp_path):
    out = tmp_path / "result.json"
    res = cli.invoke(app, ["run", str(write_profile(FAST)), "-f", "json", "-q", "-o", str(out),
                           "--set", "concurrent=true"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    total = doc["group_total"]["read"]
    assert total["total_ios"] == sum(j["read"]["total_ios"] for j in doc["jobs"])
    assert total["lat_ns"]["N"] == total["total_ios"]


def test_prepare_creates_targets_once(write_profile, scratch):
    path = write_profile('[global]\nsize = "256k"\nrandseed = 9\n')
    res = cli.invoke(app, ["prepare", str(path)])
    assert res.exit_code == 0, res.output
    made = scratch / "gpufio-seed9.dat"
    assert made.stat().st_size == 262144 and str(made) in res.stdout
    mtime = made.stat().st_mtime_ns
    assert cli.invoke(app, ["prepare", str(path)]).exit_code == 0
    assert made.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("size", ["1001", "4097"])
def test_sizes_that_are_not_a_multiple_of_8_prepare_and_run_or_say_why(write_profile, size):
    path = write_profile(f'[global]\nsize = {size}\nruntime = "100ms"\n')
    res = cli.invoke(app, ["prepare", str(path)])
    assert res.exit_code == 0, res.output
    res = cli.invoke(app, ["run", str(path), "--quiet", "-f", "json"])
    if int(size) < 4096:
        assert res.exit_code == 2 and res.stderr.count("\n") == 1
        assert "region of 1001 bytes holds no block of bs 4096" in res.stderr
    else:
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["jobs"][0]["read"]["total_ios"] >= 1


def test_engines_lists_psync_as_available():
    res = cli.invoke(app, ["engines", "--format", "json"])
    rows = {r["engine"]: r for r in json.loads(res.stdout)}
    assert rows["psync"]["available"] is True and rows["psync"]["why not"] == ""
    assert rows["uring"]["options"]["sqpoll"] == {
        "default": False, "help": "a kernel thread polls the SQ (IORING_SETUP_SQPOLL)"}
    table = cli.invoke(app, ["engines"])
    assert table.exit_code == 0 and "psync" in table.stdout and "uring" in table.stdout


def test_info_reports_host_io_uring_and_targets(pattern_file):
    res = cli.invoke(app, ["info", "--target", str(pattern_file), "--format", "json"])
    assert res.exit_code == 0, res.output
    facts = json.loads(res.stdout)
    assert facts["host"]["kernel"] and "available" in facts["io_uring"]
    assert facts["targets"][str(pattern_file)]["kind"] == "file"
    assert isinstance(facts["gpus"], list)


@pytest.fixture
def fake_gpu_engine(monkeypatch):
    class FakeGpu(Engine):
        name = "fake-gpu"
        summary = "test double"
        uses_gpu = True

        @classmethod
        def queue(cls, job, files, spec):
            raise AssertionError("must never run without a GPU")

    all_engines()
    monkeypatch.setattr(gpu, "probe", lambda: (0, "no GPU found"))
    register(FakeGpu)
    yield
    from gpufio import engines
    engines._REGISTRY.pop("fake-gpu")


BAD_INPUTS = [
    ("[global]\nsize = 1\nbs = 4k\n", "malformed TOML"),
    ("[global]\nsize = \"1m\"\nqueue_depth = 4\n", "unknown key 'queue_depth'"),
    ("[global]\nengine = \"nvme\"\nsize = \"1m\"\n", "unknown engine 'nvme'"),
    ("[global]\nsize = \"1m\"\nnumjobs = \"two\"\n", "key 'numjobs': expected a whole number"),
    ("[global]\nsize = \"-1m\"\n", "key 'size': cannot read size"),
    ("[global]\nsize = 0\n", "key 'size': must be greater than 0"),
    ("[global]\nsize = \"1m\"\nbs = 1000\n", "key 'bs': 1000 is not a multiple of 512"),
    ("[global]\ntargets = [\"{tmp}/none.dat\"]\n", "does not exist, and the job gives no size"),
    ("[global]\ntargets = [\"{tmp}\"]\n", "is a directory"),
    ("[global]\ntargets = [\"{small}\"]\nsize = \"8m\"\n",
     "smaller than offset+size = 8388608 bytes; --set size=4m fits"),
    ("[global]\ntargets = [\"{small}\"]\noffset = 100\n", "offset 100 is not a multiple"),
    ("[global]\nsize = \"1m\"\n[sweep]\ndepth = [1, 2]\n", "[sweep]: unknown key 'depth'"),
    ("[global]\nengine = \"fake-gpu\"\nsize = \"1m\"\n",
     "engine 'fake-gpu' cannot run here: no GPU found"),
    ("[global]\nsize = \"1m\"\ngpus = [0, -1]\n", "key 'gpus': GPU indexes cannot be negative"),
    ("[global]\nsize = \"1m\"\ngpus = \"a,b\"\n", "key 'gpus': expected a whole number"),
    ("[global]\nengine = \"cufile\"\nsize = \"1m\"\n", "engine 'cufile' cannot run here"),
]


@pytest.mark.parametrize("text,message", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2(text, message, write_profile, tmp_path, pattern_file,
                                      fake_gpu_engine):
    path = write_profile(text.format(tmp=tmp_path, small=pattern_file))
    res = cli.invoke(app, ["run", str(path), "-q"])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufio: error: ")
    assert message in lines[0]


def test_bad_cli_values_exit_2(write_profile):
    path = str(write_profile(FAST))
    for args, message in [(["-f", "xml"], "--format: 'xml'"),
                          (["--set", "iodepth"], "expected KEY=VALUE"),
                          (["-o", "/nonexistent/dir/r.json"], "--output /nonexistent/dir/r.json")]:
        res = cli.invoke(app, ["run", path, "-q", "--set", "runtime=100ms", *args])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.stderr
    assert cli.invoke(app, ["run", "/no/such.toml"]).exit_code == 2


def test_failed_verify_exits_1(pattern_file, write_profile):
    with open(pattern_file, "r+b") as f:
        f.seek(8192 + 5)
        f.write(b"\0\0\0")
    path = write_profile(f'[global]\ntargets = ["{pattern_file}"]\nverify = true\nrw = "read"\n'
                         'size = "64k"\n')
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json"])
    assert res.exit_code == 1
    job = json.loads(res.stdout)["jobs"][0]
    assert job["error"] == 1 and job["verify"]["failures"] == 1
    assert f"{pattern_file}@8192" in res.stderr


def _running_line(stream) -> str:
    """The first plain live line of a job in its measured phase with I/O done (stderr off a
    terminal): the run is under way, whatever the machine's load."""
    for line in stream:
        m = re.search(r"\] run \S+ iops=([\d,]+)", line)
        if m and int(m.group(1).replace(",", "")) > 0:
            return line
    raise AssertionError("gpufio ended before a live line showed I/O")


# a shell starts its background jobs with SIGINT ignored (bash's 'cmd &' in a script):
# SIGINT and SIGTERM must still stop them, as they stop fio
@pytest.mark.parametrize("sig,sigint_ignored", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                                (signal.SIGTERM, True), (signal.SIGINT, True)])
def test_ctrl_c_or_sigterm_keeps_results_and_exits_130(write_profile, scratch, sig,
                                                       sigint_ignored):
    path = write_profile('[global]\nsize = "1m"\nruntime = "60s"\ntime_based = true\n')
    env = {**os.environ, "GPUFIO_SCRATCH": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-m", "gpufio", "run", str(path), "-f", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
                            if sigint_ignored else None)
    try:
        seen = _running_line(proc.stderr)
    except BaseException:
        proc.kill()
        raise
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    doc = json.loads(out)
    assert doc["interrupted"] is True
    job = doc["jobs"][0]
    assert job["interrupted"] is True and job["read"]["total_ios"] > 0
    assert job["read"]["runtime"] < 60_000
    assert "interrupted" in err


def test_module_entry_point_help():
    res = subprocess.run([sys.executable, "-m", "gpufio", "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    for command in ("run", "engines", "info", "prepare"):
        assert command in res.stdout


@pytest.mark.parametrize("since_boot_s", [1, 10 ** 6])
def test_live_display_redraws_a_table_on_a_terminal_and_prints_lines_elsewhere(
        monkeypatch, since_boot_s):
    import io

    from gpufio.workloads.block.live import LiveDisplay
    from gpufio.run.records import Snapshot

    class Tty(io.StringIO):
        def isatty(self):
            return True

    run = Snapshot("randread", "uring", "run", 123456.0, 505.7e6, 80_000, 250_000, 0.5, 2.0)
    done = Snapshot("randread", "uring", "done", 123456.0, 505.7e6, 80_000, 250_000, 1.0, 0.0)
    tty = Tty()
    with LiveDisplay(tty) as live:
        live.update([run])
        live.update([done])
    text = tty.getvalue()
    assert "gpufio: finished" in text and "123,456" in text and "250.0" in text
    # a fixed young clock: the first plain line must come even 1 s after boot
    monkeypatch.setattr(time, "monotonic_ns", lambda: since_boot_s * 10 ** 9)
    monkeypatch.setattr(time, "monotonic", lambda: float(since_boot_s))
    plain = io.StringIO()
    with LiveDisplay(plain) as live:
        live.update([run])
        live.update([run])  # within the interval: quiet
    assert plain.getvalue() == ("gpufio: randread [uring] run 50% iops=123,456 MB/s=505.7 "
                                "p50=80.0us p99=250.0us eta=2s\n")


def test_gen4_vs_gen5_on_a_host_without_those_drives_creates_nothing():
    if os.path.exists("/dev/nvme0n1"):
        pytest.skip("this host has /dev/nvme0n1")
    profile = str(PROFILES / "gen4-vs-gen5.toml")
    res = cli.invoke(app, ["run", profile, "--quiet", "--set", "runtime=1s"])
    assert res.exit_code == 2
    assert res.stderr == ("gpufio: error: target /dev/nvme0n1: no such block device (gpufio "
                          "never creates files under /dev)\n")
    assert not os.path.exists("/dev/nvme0n1") and not os.path.exists("/dev/nvme1n1")


def test_a_ram_backed_target_is_labelled_in_the_result_table_and_compare(tmp_path,
                                                                         shm_pattern_file):
    target = str(shm_pattern_file)
    prof = tmp_path / "ram.toml"
    prof.write_text(f'[global]\ntargets = ["{target}"]\nruntime = "200ms"\n'
                    'time_based = true\ndirect = false\n')
    res = cli.invoke(app, ["run", str(prof), "--quiet", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (t,) = doc["jobs"][0]["targets"]
    assert t["ram_backed"] is True and t["ram_backing"] == "tmpfs"
    assert t["storage"]["kind"] == "tmpfs" and t["storage"]["reaches_storage"] is False
    res = cli.invoke(app, ["run", str(prof), "--quiet"])
    assert f"not storage: {target} (tmpfs)" in " ".join(res.stdout.split())
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(doc))
    res = cli.invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0 and f"{target} (tmpfs, tmpfs: not storage)" in res.stdout


def test_clean_lists_and_removes_scratch_files(scratch):
    scratch.mkdir()
    (scratch / "gpufio-seed5.dat").write_bytes(b"x" * 2048)
    (scratch / "keep.txt").write_text("mine")
    every = ["gnn-features-10x4-seed1.f32", "gnn-graph-10-4-1.npz", "gpufio-ckpt.dat",
             "gpufio-ckpt-shard00001.dat", "gpufio-seed1.dat.partial-999999999"]
    for name in every:  # what each workload leaves: the registry names them
        (scratch / name).write_bytes(b"x")
    res = cli.invoke(app, ["clean", "--dry-run"])
    assert all(f"would remove {scratch}/{name} " in res.stdout for name in every), res.stdout
    for name in every:
        (scratch / name).unlink()
    res = cli.invoke(app, ["clean", "--dry-run"])
    assert res.exit_code == 0
    assert f"would remove {scratch}/gpufio-seed5.dat (2.0KiB)" in res.stdout
    assert (scratch / "gpufio-seed5.dat").exists()
    res = cli.invoke(app, ["clean"])
    assert res.exit_code == 0 and f"removed {scratch}/gpufio-seed5.dat" in res.stdout
    assert sorted(os.listdir(scratch)) == ["keep.txt"]


def test_without_a_gpu_the_message_says_so(monkeypatch):
    gpu.probe.cache_clear()
    monkeypatch.setattr(gpu, "driver_present", lambda: False)
    try:
        assert gpu.probe() == (0, "no NVIDIA GPU or driver found")
        res = cli.invoke(app, ["engines", "--format", "json"])
        rows = {r["engine"]: r for r in json.loads(res.stdout)}
        assert rows["gpu-uring"]["why not"] == "no NVIDIA GPU or driver found"
        # mmap runs rows and tensors in host memory (device = "cpu") without a GPU
        assert rows["mmap"]["available"] is True and rows["mmap"]["why not"] == ""
        assert rows["mmap"]["host memory"] == {"moves": ["rows", "tensors"], "why not": ""}
        assert rows["mmap"]["GPU memory"] == {"moves": ["block", "rows", "tensors"],
                                              "why not": "no NVIDIA GPU or driver found"}
        assert rows["psync"]["GPU memory"] == {"moves": [], "why not": ""}
        table = cli.invoke(app, ["engines"], env={"COLUMNS": "300"}).stdout
        mmap = next(line for line in table.splitlines() if line.startswith("│ mmap "))
        assert "yes: rows, tensors" in mmap and "no: no NVIDIA GPU" in mmap
        res = cli.invoke(app, ["info", "--format", "json"])
        assert json.loads(res.stdout)["gpu_status"] == "no NVIDIA GPU or driver found"
        # info says what engines says: mmap runs here, in host memory only
        status = json.loads(res.stdout)["engines"]
        assert status["mmap"] == ("available in host memory (rows, tensors); not in GPU "
                                  "memory: no NVIDIA GPU or driver found")
        for name, row in rows.items():
            assert status[name].startswith("available") == row["available"], name
            assert row["available"] or status[name] == row["why not"], name
    finally:
        gpu.probe.cache_clear()


def test_info_shows_sizes_with_units_and_keeps_bytes_in_json(pattern_file):
    facts = json.loads(cli.invoke(app, ["info", "--format", "json"]).stdout)
    table = cli.invoke(app, ["info", "--target", str(pattern_file)],
                       env={"COLUMNS": "300"}).stdout
    rows = {cells[0]: cells[1] for cells in
            ([c.strip() for c in line.strip("│").split("│")] for line in table.splitlines()
             if line.startswith("│") and line.count("│") == 3)}
    assert rows["memory"] == format_size(facts["host"]["memory_bytes"])
    assert re.fullmatch(r"[0-9.]+(B|KiB|MiB|GiB|TiB)", rows["memory"])
    assert "memory_bytes" not in rows and isinstance(facts["host"]["memory_bytes"], int)
    if "logical_block_size" in rows:  # a file on a block device
        assert rows["logical_block_size"].endswith("B")


@pytest.mark.parametrize("error,reason", [
    ("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version",
     "the NVIDIA driver is older than CuPy's CUDA runtime"),
    ("cudaErrorNoDevice: no CUDA-capable device is detected", "no NVIDIA GPU found"),
])
def test_a_driver_without_a_usable_gpu_is_explained(error, reason):
    assert gpu._runtime_reason(RuntimeError(error)).startswith(reason)


def test_help_renders_as_written_and_lists_every_format():
    res = cli.invoke(app, ["plot", "--help"])
    assert "gpufio[plot]" in res.stdout
    res = cli.invoke(app, ["check", "--help"])
    assert "[check]" in res.stdout
    res = cli.invoke(app, ["run", "--help"])
    text = " ".join(res.stdout.split())
    assert "table, json, fio-json, csv, markdown" in text and ".fio" in text
    res = cli.invoke(app, ["--version"])
    from gpufio import __version__

    assert res.exit_code == 0 and res.stdout == f"gpufio {__version__}\n"


def test_the_readme_lists_every_shipped_profile():
    root = str(REPO)
    readme = open(os.path.join(root, "README.md")).read()
    shipped = sorted(os.listdir(os.path.join(root, "profiles")))
    assert [p for p in shipped if f"`{p}`" not in readme] == []


def test_engines_say_what_iodepth_means_for_each_path():
    rows = {r["engine"]: r for r in json.loads(cli.invoke(app, ["engines", "-f", "json"]).stdout)}
    assert rows["uring"]["iodepth"] == "I/Os in flight per worker"
    assert rows["psync"]["iodepth"].startswith("ignored")
    assert rows["gpu-uring"]["iodepth"].startswith("request slots per ring")
