"""fio interoperability: job files in, fio's JSON schema out."""

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.engines import all_engines
from gpufio.cli import app
from gpufio.core.errors import BadInput
from gpufio.core.offsets import DEFAULT_SEED
from gpufio.fio.jobfile import parse

from checkout import DATA

cli = CliRunner()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """fio lays out a job's files in the directory it runs in, and so does gpufio."""
    monkeypatch.chdir(tmp_path)


def test_job_file_keys_map_to_profile_keys():
    prof = profile.load(str(DATA / "randread-iouring.fio"))
    a, a1, b = prof.jobs  # numjobs=2: two clones, each a job on its own file, as fio runs them
    assert (a.name, a.engine, a.rw, a.bs, a.iodepth, a.numjobs, a.direct) == \
        ("rand-a", "uring", "randread", 4096, 16, 1, True)
    assert (a.targets, a1.targets, b.targets) == (("rand-a.0.0",), ("rand-a.1.0",),
                                                  ("rand-b.0.0",))
    assert a.time_based and a.runtime == 300_000_000 and a.size == 1 << 20
    assert b.engine_options["sqpoll"] is True and b.engine_options["fixedbufs"] is True
    assert prof.batches([0, 1, 2]) == [[0, 1, 2]]  # no stonewall: all at once
    (seq,) = profile.load(str(DATA / "seq-psync.fio")).jobs
    assert (seq.engine, seq.rw, seq.bs, seq.io_size) == ("psync", "read", 65536, 512 << 10)


def test_write_keys_of_a_job_file():
    data, _ = parse("[w]\nrw=randrw\nrwmixwrite=30\nfsync=8\nend_fsync\nss=iops:5%\n"
                    "ss_dur=10s\nruntime=60\nsize=1m\n", "x.fio")
    job = profile.from_dict(data, "x.fio", {}).jobs[0]
    assert (job.rw, job.rwmixread, job.fsync, job.end_fsync) == ("randrw", 70, 8, True)
    assert (job.steadystate, job.steadystate_duration) == ("iops:5%", 10_000_000_000)


STYLES = DATA / "fio-styles"


def test_filenames_are_the_target_list():
    data, notes = parse("[j]\nfilename=/dev/nvme0n1:/dev/nvme1n1:/tmp/a\\:b\n", "x.fio")
    assert data["job"][0]["targets"] == ["/dev/nvme0n1", "/dev/nvme1n1", "/tmp/a:b"]
    assert notes == []


def test_unsupported_keys_are_listed_in_one_error():
    with pytest.raises(BadInput) as err:
        profile.load(str(DATA / "unsupported.fio"))
    assert str(err.value) == (
        f"{DATA / 'unsupported.fio'}: fio job file gpufio cannot run as written: "
        "line 3 [global]: thinktime is not supported (none); "
        "line 6 [job1]: iodepth_batch_complete_min is not supported (engines reap what has "
        "completed)")


def test_every_problem_of_a_job_file_comes_in_one_error(monkeypatch):
    monkeypatch.delenv("GPUFIO_SURELY_UNSET_VAR", raising=False)
    with pytest.raises(BadInput) as err:
        profile.load(str(STYLES / "many-problems.fio"))
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("line 2 [global]: ioengine=posixaio has no gpufio engine (supported: ",
                 "psync -> psync", "libaio -> uring", "libcufile cuda_io=posix -> cpu-gpu",
                 "line 3 [global]: thinktime is not supported (none)",
                 "line 6 [job1]: iodepth_batch_complete_min is not supported",
                 "line 8 [job1]: ${GPUFIO_SURELY_UNSET_VAR} is not set in the environment",
                 "line 9 [job1]: zonemode is not supported (no gpufio equivalent)"):
        assert part in msg


def test_libaio_files_run_as_uring_with_a_note(tmp_path, monkeypatch):
    target = tmp_path / "t.dat"
    monkeypatch.setenv("GPUFIO_TEST_FILE", str(target))
    monkeypatch.setenv("GPUFIO_TEST_SIZE", "1m")
    prof = profile.load(str(STYLES / "libaio-randread.fio"))
    job, clone = prof.jobs  # numjobs=2 on one filename: two jobs on the same file, as fio's
    assert (job.engine, job.iodepth, job.numjobs, job.bs, job.size) == ("uring", 32, 1, 4096,
                                                                        1 << 20)
    assert job.targets == clone.targets == (str(target),)
    assert job.percentile_list == (50.0, 99.0, 99.99)
    assert prof.notes[0] == ("ioengine=libaio runs as gpufio's uring engine (io_uring at the "
                             "same iodepth)")
    res = cli.invoke(app, ["run", str(STYLES / "libaio-randread.fio"), "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert "gpufio: note: ioengine=libaio runs as gpufio's uring engine" in res.stderr
    job_doc, _ = json.loads(res.stdout)["jobs"]
    assert job_doc["engine"] == "uring" and job_doc["read"]["total_ios"] > 0
    assert set(job_doc["read"]["lat_ns"]["percentile"]) == {
        "50.000000", "99.000000", "99.900000", "99.990000"}


def test_libcufile_files_map_cuda_io_and_gpu_dev_ids():
    (gds,) = profile.load(str(STYLES / "libcufile-gds.fio")).jobs
    assert (gds.engine, gds.gpus, gds.size, gds.bs) == ("cufile", (0,), 4 << 20, 1 << 20)
    assert gds.targets == ("/data/file1", "/data/file2")
    prof = profile.load(str(STYLES / "libcufile-posix.fio"))
    a, b = prof.jobs
    assert (a.engine, a.gpus, b.engine) == ("cpu-gpu", (0, 1), "cufile")
    assert len(prof.notes) == 2 and "fio's is synchronous and pageable" in prof.notes[0]
    assert "gpufio draws random offsets with replacement" in prof.notes[1]


@pytest.mark.parametrize("text,message", [
    ("bs=4k\n", "line 1: option before any \\[section\\]"),
    ("[j]\nioengine=windowsaio\n", "line 2 \\[j\\]: ioengine=windowsaio has no gpufio engine"),
    ("[j]\nrw=trim\nsize=1m\n", "key 'rw': 'trim' is not one of read, randread, write"),
    ("[j]\npercentile_list=0:50\n", "key 'percentile_list': '0' is not a percentile"),
])
def test_bad_job_files(text, message, tmp_path):
    path = tmp_path / "bad.fio"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        profile.load(str(path))


def test_run_a_job_file_end_to_end(tmp_path):
    res = cli.invoke(app, ["run", str(DATA / "seq-psync.fio"), "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["jobs"][0]
    assert job["jobname"] == "seq" and job["read"]["total_ios"] == 8


def _keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("percentile", "job options") and \
                not k.startswith(("latency_", "iodepth_")):
            out |= _keys(v, prefix + k + ".")
    return out


def _gpufio_fio_json():
    res = cli.invoke(app, ["run", str(DATA / "randread-iouring.fio"), "-q", "-f", "fio-json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_fio_json_numbers_agree_with_gpufio_json():
    fj = _gpufio_fio_json()
    job = fj["jobs"][0]
    rd = job["read"]
    assert fj["fio version"].startswith("gpufio-") and job["job options"]["ioengine"] == "io_uring"
    assert rd["iops"] * rd["runtime"] / 1000 == pytest.approx(rd["total_ios"], rel=0.01)
    assert rd["clat_ns"]["N"] == rd["total_ios"]
    # not measured, so not written (as zeros they would read as measurements)
    assert "slat_ns" not in rd and "slat_ns" not in job["write"]
    assert not {"ctx", "majf", "minf", "latency_depth"} & set(job)
    assert rd["clat_ns"]["percentile"]["99.000000"] >= rd["clat_ns"]["percentile"]["50.000000"]
    assert job["write"]["total_ios"] == 0 and job["trim"]["io_bytes"] == 0
    assert sum(job["latency_ns"].values()) + sum(job["latency_us"].values()) + \
        sum(job["latency_ms"].values()) == pytest.approx(100.0)


def test_fio_json_has_fios_schema(tmp_path, fio_json):
    target = tmp_path / "t.dat"
    target.write_bytes(b"\0" * (1 << 20))
    real = json.loads(fio_json("--name=x", f"--filename={target}", "--rw=randread", "--bs=4k",
                               "--size=1m", "--runtime=1", "--output-format=json").read_text())
    ours = _gpufio_fio_json()
    assert set(real) <= set(ours) | {"global options"}
    # everything fio reports that gpufio measures is there, with fio's types
    missing = _keys(real["jobs"][0]) - _keys(ours["jobs"][0])
    unmeasured = {"iodepth_level", "iodepth_submit", "iodepth_complete", "ctx", "majf", "minf",
                  "latency_depth"}
    assert {k for k in missing if ".slat_ns" not in k} <= unmeasured
    for key in ("iops", "bw", "bw_bytes", "runtime", "total_ios"):
        assert isinstance(ours["jobs"][0]["read"][key], type(real["jobs"][0]["read"][key])), key


def test_fio_json_round_trips_through_compare(tmp_path):
    from gpufio.results import load as results

    native = tmp_path / "native.json"
    res = cli.invoke(app, ["run", str(DATA / "seq-psync.fio"), "-q", "-f", "json", "-o", str(native)])
    assert res.exit_code == 0, res.output
    from gpufio.fio.json_out import to_fio

    fio_form = tmp_path / "fio-form.json"
    fio_form.write_text(json.dumps(to_fio(json.loads(native.read_text()))))
    a = results.job_metrics(results.load(str(native))["jobs"][0])
    b = results.job_metrics(results.load(str(fio_form))["jobs"][0])
    for metric in ("iops", "lat_p50", "lat_p99", "lat_mean"):
        assert b[metric] == pytest.approx(a[metric]), metric
    assert b["bw"] == pytest.approx(a["bw"], rel=1e-6)  # fio writes bw_bytes as an integer


def test_a_real_fio_result_compares_beside_gpufio(tmp_path, fio_json):
    target = tmp_path / "t.dat"
    target.write_bytes(b"\1" * (1 << 20))
    fio_out = fio_json("--name=seq", f"--filename={target}", "--rw=read", "--bs=64k",
                       "--size=1m", "--ioengine=psync", "--output-format=json")
    ours = tmp_path / "gpufio.json"
    assert cli.invoke(app, ["run", str(DATA / "seq-psync.fio"), "-q", "-f", "json",
                            "-o", str(ours)]).exit_code == 0
    res = cli.invoke(app, ["compare", str(fio_out), str(ours), "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = {(r["job"], r["metric"]): r for r in json.loads(res.stdout)["rows"]}
    assert rows[("seq", "iops")]["fio"] > 0 and rows[("seq", "iops")]["gpufio ratio"] > 0


# fio 3.33's own examples, verbatim (examples/ssd-test.fio, aio-read.fio, null.fio)
EXAMPLES = DATA / "fio-examples"


def _example(name, tmp_path, directory=None):
    """fio's example ``name``, its directory= pointed at ``directory`` when given."""
    text = (EXAMPLES / name).read_text()
    if directory is not None:
        text = re.sub(r"(?m)^directory=.*$", f"directory={directory}", text)
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_missing_directory_is_one_line_as_in_fio(tmp_path, monkeypatch):
    if os.path.exists("/mount-point-of-ssd"):
        pytest.skip("this machine has a /mount-point-of-ssd")
    monkeypatch.chdir(tmp_path)
    res = cli.invoke(app, ["run", str(EXAMPLES / "ssd-test.fio"), "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1
    assert "line 20 [global]: directory=/mount-point-of-ssd: /mount-point-of-ssd is not a " \
        "directory" in res.stderr
    assert os.listdir(tmp_path) == []  # nothing laid out where gpufio was started


def test_the_file_joins_the_directory_as_in_fio(tmp_path, monkeypatch):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    path = _example("ssd-test.fio", tmp_path, ssd)
    jobs = profile.load(str(path)).jobs
    assert [j.targets for j in jobs] == [(f"{ssd}/ssd.test.file",)] * 4
    assert [(j.name, j.rw, j.engine, j.iodepth, j.direct) for j in jobs] == [
        ("seq-read", "read", "uring", 4, True), ("rand-read", "randread", "uring", 4, True),
        ("seq-write", "write", "uring", 4, True), ("rand-write", "randwrite", "uring", 4, True)]
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "--set", "size=1m"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [j["jobname"] for j in doc["jobs"]] == ["seq-read", "rand-read", "seq-write",
                                                   "rand-write"]
    assert doc["jobs"][2]["write"]["total_ios"] == 256
    assert os.listdir(ssd) == ["ssd.test.file"] and os.listdir(cwd) == []


def test_directory_and_filename_inherit_from_global(tmp_path):
    d = tmp_path
    data, _ = parse(f"[global]\ndirectory={d}\n[a]\nfilename=x:y\n[b]\nfilename=/abs/z\n",
                    "x.fio")
    # fio puts even an absolute name under the directory
    assert [j["targets"] for j in data["job"]] == [[f"{d}/x", f"{d}/y"], [f"{d}/abs/z"]]
    data, _ = parse(f"[global]\nfilename=f\n[a]\ndirectory={d}\n[b]\n", "x.fio")
    assert [j["targets"] for j in data["job"]] == [[f"{d}/f"], ["f"]]


def test_several_directories_take_the_clones_in_turn(tmp_path):
    """fio's directory=a:b: clone k's files go to the directory k modulo their number."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data, _ = parse(f"[j]\ndirectory={tmp_path}/a:{tmp_path}/b\nnumjobs=3\nnrfiles=2\n",
                    "x.fio")
    assert [j["targets"] for j in data["job"]] == [
        [f"{tmp_path}/{d}/j.{k}.{i}" for i in (0, 1)] for k, d in enumerate("aba")]


def test_aio_read_buffered_0_is_direct_1(tmp_path):
    data_dir = tmp_path / "data1"
    data_dir.mkdir()
    path = _example("aio-read.fio", tmp_path, data_dir)
    prof = profile.load(str(path))
    assert [(j.name, j.iodepth, j.direct, j.bs, j.targets) for j in prof.jobs] == [
        (f"file{i}", d, True, 128 << 10, (f"{data_dir}/file{i}.0.0",))
        for i, d in ((1, 4), (2, 32), (3, 8), (4, 16))]
    assert prof.batches(prof.jobs) == [prof.jobs]  # fio runs the four at once
    assert "buffered=0 runs as direct=1" in prof.notes
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "--set", "size=1m"])
    assert res.exit_code == 0, res.output
    assert "gpufio: note: buffered=0 runs as direct=1\n" in res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["jobs"]) == 4 and doc["group_total"]["read"]["total_ios"] == 4 * 8
    assert sorted(os.listdir(data_dir)) == [f"file{i}.0.0" for i in range(1, 5)]
    data, _ = parse("[j]\nbuffered=1\n", "x.fio")
    assert data["job"][0]["direct"] is False


def test_null_gtod_reduce_is_accepted_with_a_note(tmp_path):
    prof = profile.load(str(EXAMPLES / "null.fio"))
    (job,) = prof.jobs
    assert (job.engine, job.rw, job.bs, job.size) == ("null", "randread", 4096, 100 << 30)
    assert prof.notes == ("gtod_reduce=1 cuts fio's own clock calls; gpufio times every I/O "
                          "as always",)
    res = cli.invoke(app, ["run", str(EXAMPLES / "null.fio"), "-q", "-f", "json", "--set",
                           "size=1m"])
    assert res.exit_code == 0, res.output
    assert "gpufio: note: gtod_reduce=1 cuts fio's own clock calls" in res.stderr
    assert json.loads(res.stdout)["jobs"][0]["read"]["total_ios"] == 256


def test_null_lays_out_nothing_however_large_its_size(tmp_path):
    """fio's null engine needs no file: null.fio's size=100g runs on an offset space, with
    nothing laid out and no consent asked, as fio does."""
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "gpufio"
    before = sorted(os.listdir(cache)) if cache.exists() else []
    res = cli.invoke(app, ["run", str(EXAMPLES / "null.fio"), "-q", "-f", "json", "--set",
                           "io_size=4m"])
    assert res.exit_code == 0, res.output
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["read"]["total_ios"] == 1024
    assert [(t["path"], t["size"]) for t in job["targets"]] == [("(no storage)", 100 << 30)]
    assert (sorted(os.listdir(cache)) if cache.exists() else []) == before
    assert cli.invoke(app, ["prepare", str(EXAMPLES / "null.fio")]).exit_code == 0
    assert (sorted(os.listdir(cache)) if cache.exists() else []) == before


@pytest.mark.parametrize("key", ["clat_percentiles=1", "lat_percentiles=1", "disable_slat=1",
                                 "disable_bw_measurement=1", "disable_lat"])
def test_reporting_only_options_are_accepted_with_a_note(key):
    data, notes = parse(f"[j]\n{key}\nrw=read\n", "x.fio")
    assert data["job"][0] == {"name": "j", "rw": "read", "direct": False, "engine": "psync",
                              "targets": ["j.0.0"], "randseed": DEFAULT_SEED,
                              "stonewall": False, "new_group": False}
    assert len(notes) == 1 and notes[0].startswith(key if "=" in key else f"{key}=1")


@pytest.mark.parametrize("key", ["iodepth_batch_submit", "iodepth_batch"])
def test_iodepth_batch_submit_reaches_the_uring_engine(tmp_path, key):
    """fio's I/Os per submitting call (iodepth_batch is its alias) is the uring engine's
    own key of that name."""
    f = tmp_path / "b.fio"
    f.write_text(f"[j]\nioengine=io_uring\nfilename={tmp_path / 't'}\nsize=1m\n{key}=4\n")
    (job,) = profile.load(str(f)).jobs
    assert job.engine == "uring" and all_engines()["uring"].settings(job).iodepth_batch_submit == 4
