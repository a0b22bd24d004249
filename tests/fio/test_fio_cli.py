"""A fio user's first hour: a command-line job, fio's names in --set and --output-format,
the fio-style job heading, show, fio-json as fio's json+ into fio's own tools, and fio's
results read back by compare and check with their units and latency named."""

import csv
import json
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app
from gpufio.core.errors import BadInput
from gpufio.core.stats import bucket_value
from gpufio.fio.json_in import from_fio
from gpufio.fio.json_out import job_options, to_fio
from gpufio.results.check import mismatches, same_value
from gpufio.results.compare import render as compare_render
from gpufio.results.load import job_heading

cli = CliRunner()


def _one_line_error(res, *parts):
    """A bad input: exit 2, one line on stderr naming what is wrong, no traceback."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufio: error: "), res.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def _run_json(args, tmp_path, name="r.json"):
    out = tmp_path / name
    res = cli.invoke(app, ["run", *args, "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), out


def test_a_command_line_job_runs_without_a_profile_file(tmp_path):
    target = tmp_path / "t.dat"
    doc, _ = _run_json(["--ioengine=psync", "--bs=8k", "--size=1m", "--io_size=256k",
                        f"--filename={target}",
                        "--name=seq", "--rw=read",
                        "--name=rand", "--rw=randread", "--bs=4k"], tmp_path)
    seq, rand = doc["jobs"]
    assert (seq["jobname"], rand["jobname"]) == ("seq", "rand")
    # the options before the first --name are every job's; a job's own win
    assert seq["resolved options"]["bs"] == 8192 and rand["resolved options"]["bs"] == 4096
    assert seq["engine"] == rand["engine"] == "psync"
    assert seq["read"]["total_ios"] == 32 and rand["read"]["total_ios"] == 64
    assert [t["path"] for t in rand["targets"]] == [str(target)]


def test_a_command_line_is_the_job_file_it_stands_for(tmp_path):
    target = tmp_path / "t.dat"
    args = ["--ioengine=libaio", "--direct=1", "--name=a", "--rw=randread", "--iodepth=16",
            f"--filename={target}", "--size=1m", "--name=b", "--rw=read", "--bs=64k",
            f"--filename={target}", "--size=1m", "--numjobs=2"]
    text = ("[global]\nioengine=libaio\ndirect=1\n[a]\nrw=randread\niodepth=16\n"
            f"filename={target}\nsize=1m\n[b]\nrw=read\nbs=64k\nfilename={target}\nsize=1m\n"
            "numjobs=2\n")
    (tmp_path / "same.fio").write_text(text)
    from_args = profile.load_fio_args(args)
    from_file = profile.load(str(tmp_path / "same.fio"))
    assert from_args.jobs == from_file.jobs and from_args.notes == from_file.notes
    assert [(j.engine, j.iodepth, j.numjobs, j.bs) for j in from_args.jobs] == \
        [("uring", 16, 1, 4096), ("uring", 1, 1, 65536), ("uring", 1, 1, 65536)]  # b's clones
    assert any("libaio" in n for n in from_args.notes)


@pytest.mark.parametrize("args, parts", [
    (["--rw=read", "--size=1m"], ["command line: no job: --name=JOB starts one"]),
    (["--name=x", "--bs", "4k"], ["'4k': fio's options are given as --key=value"]),
    (["--name=x", "--thinktime=10"], ["[x]: thinktime is not supported (none)"]),
    (["--name=x", "--ioengine=posixaio"], ["ioengine=posixaio has no gpufio engine"]),
    (["--name=x", "--filename=/tmp/a#b"], ["a value cannot hold '#'"]),
    (["--name=x", "--output-format=terse"], ["--format: 'terse'", "not fio's terse"]),
    (["--name=x", "--output-format=normal,json"], ["one format at a time"]),
    ([], ["give a profile (TOML or .fio), or fio's options"]),
])
def test_bad_command_lines_are_one_line_exit_2(args, parts):
    _one_line_error(cli.invoke(app, ["run", *args, "-q"]), *parts)


def test_fio_options_beside_a_profile_file_are_refused(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('[global]\nsize = "1m"\n')
    _one_line_error(cli.invoke(app, ["run", str(prof), "--formt", "json"]),
                    "run: --formt: not an option of gpufio run")


def test_set_takes_fios_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b:c"
    sets = profile.parse_set([f"filename={a}:{str(b).replace(':', chr(92) + ':')}",
                              "ioengine=libaio", "direct=1", "readwrite=randwrite",
                              "blocksize=8k"])
    prof = profile.from_dict({"job": [{"name": "j", "size": "1m"}]}, "p.toml", sets)
    (job,) = prof.jobs
    assert job.targets == (str(a), str(b)) and job.engine == "uring" and job.direct is True
    assert (job.rw, job.bs) == ("randwrite", 8192)
    assert prof.notes[0] == ("ioengine=libaio runs as gpufio's uring engine (io_uring at the "
                             "same iodepth)")
    (job,) = profile.from_dict({}, "p.toml", profile.parse_set(["direct=0", "size=1m"])).jobs
    assert job.direct is False
    # a fio name sets its key alone: the profile's other keys stay as it wrote them
    prof = profile.from_dict({"global": {"rw": "randwrite", "engine": "uring", "direct": False,
                                         "size": "1m", "iodepth": 8}},
                             "p.toml", profile.parse_set([f"filename={a}", "timeout=2s"]))
    (job,) = prof.jobs
    assert (job.targets, job.runtime, job.rw, job.engine, job.direct, job.iodepth) == \
        ((str(a),), 2_000_000_000, "randwrite", "uring", False, 8)


@pytest.mark.parametrize("item, message", [
    ("filname=/x", "--set: unknown key 'filname' (did you mean 'filename'?)"),
    ("nrfiles=2", "--set: fio option 'nrfiles' shapes a fio job file's files or groups; in a "
                  "profile, list the files in targets and use its own keys"),
    ("ioengine=posixaio", "ioengine=posixaio has no gpufio engine"),
])
def test_set_refuses_what_fio_names_and_gpufio_cannot_run(item, message):
    with pytest.raises(BadInput) as err:
        profile.from_dict({}, "p.toml", profile.parse_set([item]))
    assert message in str(err.value)


def test_set_filename_on_the_command_line(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('[global]\nsize = "1m"\nio_size = "64k"\nengine = "psync"\n')
    target = tmp_path / "t.dat"
    doc, _ = _run_json([str(prof), "--set", f"filename={target}", "--set", "iodepth=1"],
                       tmp_path)
    assert [t["path"] for t in doc["jobs"][0]["targets"]] == [str(target)]


def test_the_table_heads_each_job_as_fio_and_says_rw_as_written(tmp_path):
    target = tmp_path / "t.dat"
    res = cli.invoke(app, ["run", "--name=randread", "--rw=randread", "--ioengine=psync",
                           "--bs=4k", f"--filename={target}", "--size=1m", "--io_size=64k",
                           "-q", "--output-format=normal"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == (f"randread: rw=randread, bs=4KiB, engine=psync, iodepth=1, numjobs=1, "
                        f"target={target}")
    (row,) = [line for line in lines if line.startswith("│ randread")]
    assert [c.strip() for c in row.split("│")][3] == "randread"


def test_a_mixed_jobs_rows_say_its_rw_and_their_direction():
    from gpufio.workloads.block.document import summary_rows

    block = {"iops": 1.0, "bw_bytes": 4096.0, "total_ios": 10, "short_ios": 0,
             "lat_ns": {"mean": 1e3, "percentile": {"50.000000": 1e3, "99.000000": 2e3,
                                                    "99.900000": 3e3}}}
    job = {"jobname": "m", "engine": "psync", "job options": {"rw": "randrw"},
           "resolved options": {"rw": "randrw"}, "read": block, "write": block}
    assert [r["rw"] for r in summary_rows({"jobs": [job]})] == \
        ["randrw (read)", "randrw (write)"]


def test_show_prints_a_saved_result_in_every_format(tmp_path):
    target = tmp_path / "t.dat"
    doc, saved = _run_json(["--name=j", "--rw=randread", "--ioengine=psync",
                            f"--filename={target}", "--size=1m", "--io_size=64k"], tmp_path)
    res = cli.invoke(app, ["show", str(saved)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("j: rw=randread, bs=4KiB, engine=psync") and "│ j " in res.stdout
    rows = list(csv.DictReader(cli.invoke(app, ["show", str(saved), "-f", "csv"]).stdout
                               .splitlines()))
    assert len(rows) == 1 and rows[0]["rw"] == "randread"
    assert int(rows[0]["IOPS"]) == round(doc["jobs"][0]["read"]["iops"])
    assert json.loads(cli.invoke(app, ["show", str(saved), "-f", "json"]).stdout) == doc
    plus = cli.invoke(app, ["show", str(saved), "--output-format=json+"])
    assert json.loads(plus.stdout) == json.loads(json.dumps(to_fio(doc)))
    md = cli.invoke(app, ["show", str(saved), "-f", "markdown"]).stdout
    assert "- j: rw=randread" in md and "| j " in md


def test_show_refuses_what_it_cannot_print(tmp_path):
    fio = tmp_path / "fio.json"
    fio.write_text(json.dumps({"fio version": "fio-3.33", "jobs": []}))
    _one_line_error(cli.invoke(app, ["show", str(fio)]), "a fio result (fio-3.33)")
    junk = tmp_path / "junk.json"
    junk.write_text("{")
    _one_line_error(cli.invoke(app, ["show", str(junk)]), "not JSON")
    _one_line_error(cli.invoke(app, ["show", str(tmp_path / "none.json")]), "none.json")
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"gpufio version": "0", "jobs": []}))
    _one_line_error(cli.invoke(app, ["show", str(ours), "-f", "xml"]), "--format: 'xml'")


@pytest.fixture
def plus_doc(tmp_path):
    """A gpufio run's document (a psync job over two files, one with a ':' in its name)."""
    a, b = tmp_path / "a.dat", tmp_path / "b:c.dat"
    escaped = str(b).replace(":", "\\:")
    doc, _ = _run_json(["--name=j", "--rw=randread", "--ioengine=psync", "--direct=1",
                        f"--filename={a}:{escaped}", "--size=1m", "--io_size=256k"], tmp_path)
    return doc


def test_fio_json_is_json_plus_with_fios_options(plus_doc):
    ours = plus_doc["jobs"][0]
    fio = to_fio(plus_doc)
    assert set(fio) == {"fio version", "timestamp", "timestamp_ms", "time", "global options",
                        "jobs", "disk_util"}
    assert fio["fio version"].startswith("gpufio-")
    job = fio["jobs"][0]
    opts = job["job options"]
    assert all(isinstance(v, str) for v in opts.values())
    assert (opts["name"], opts["rw"], opts["ioengine"], opts["direct"], opts["iodepth"],
            opts["numjobs"]) == ("j", "randread", "psync", "1", "1", "1")
    a, b = (t["path"] for t in ours["targets"])
    assert opts["filename"] == f"{a}:{b.replace(':', chr(92) + ':')}"
    assert fio["global options"] == {k: v for k, v in opts.items() if k != "name"}
    for lat in ("clat_ns", "lat_ns"):
        block = job["read"][lat]
        # json+: each non-empty bucket by its value in ns, the counts those of the histogram
        assert sum(block["bins"].values()) == block["N"] == ours["read"]["total_ios"] == 64
        assert block["bins"] == {str(int(bucket_value(int(i)))): c
                                 for i, c in ours["read"]["lat_ns"]["bins"].items()}
        assert block["percentile"] == ours["read"]["lat_ns"]["percentile"]
        # a direction with no I/O has neither, as fio writes it
        assert "bins" not in job["write"][lat] and "percentile" not in job["write"][lat]


def test_fio_json_names_each_engine_as_fio_does():
    job = {"jobname": "j", "engine": "uring", "targets": [],
           "job options": {"sqpoll": "True"},
           "resolved options": {"rw": "read", "bs": 4096, "iodepth": 32, "numjobs": 1,
                                "direct": True, "sqpoll": True}}
    assert job_options(job) == {"name": "j", "rw": "read", "bs": "4096", "iodepth": "32",
                                "numjobs": "1", "direct": "1", "sqthread_poll": "1",
                                "ioengine": "io_uring"}
    assert job_options({**job, "engine": "cpu-gpu"})["ioengine"] == "libcufile"
    assert job_options({**job, "engine": "cpu-gpu"})["cuda_io"] == "posix"
    assert job_options({**job, "engine": "gpu-uring"})["ioengine"] == "gpu-uring"


def test_fio_json_has_what_fio_plots_json_import_reads(plus_doc):
    """fio-plot reads these of each job (its global options merged into the job's)."""
    fio = to_fio(plus_doc)
    for job in fio["jobs"]:
        opts = {**job["job options"], **fio["global options"]}
        assert {"iodepth", "numjobs", "bs", "rw"} <= set(opts)
        assert int(opts["iodepth"]) >= 1 and int(opts["numjobs"]) >= 1
        for key in ("bw", "iops", "iops_stddev"):
            assert key in job["read"]
        assert {"mean", "stddev"} <= set(job["read"]["lat_ns"])
        assert {"latency_ms", "latency_us", "latency_ns", "usr_cpu", "sys_cpu"} <= set(job)


@pytest.mark.skipif(not shutil.which("fio_jsonplus_clat2csv"),
                    reason="fio_jsonplus_clat2csv (Debian's fio package) is not installed")
def test_fios_jsonplus_clat2csv_reads_the_histogram(plus_doc, tmp_path):
    source = tmp_path / "plus.json"
    source.write_text(json.dumps(to_fio(plus_doc)))
    dest = tmp_path / "lat.csv"
    run = subprocess.run(["fio_jsonplus_clat2csv", str(source), str(dest)],
                         capture_output=True, text=True)
    if run.returncode and "No module named 'six'" in run.stderr:
        pytest.skip("fio_jsonplus_clat2csv needs python3-six, not installed")
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "lat_job0.csv") as f:
        rows = [[c.strip() for c in row] for row in csv.reader(f)]
    head, body = rows[0], rows[1:]
    assert body, "an empty CSV"
    counts = {}
    for col in ("read_clat_ns_count", "read_lat_ns_count"):
        i = head.index(col)
        counts[col] = {r[0]: int(r[i]) for r in body if r[i]}
    bins = to_fio(plus_doc)["jobs"][0]["read"]["clat_ns"]["bins"]
    assert counts["read_clat_ns_count"] == counts["read_lat_ns_count"] == bins
    assert sum(bins.values()) == 64
    check = subprocess.run(["fio_jsonplus_clat2csv", str(source), str(dest), "--validate"],
                           capture_output=True, text=True)
    assert check.returncode == 0 and "validated" in check.stdout, check.stdout + check.stderr


# json+'s bins: counts by bucket value (the midpoints of two of fio's buckets)
BINS = {str(int(bucket_value(300))): 60, str(int(bucket_value(450))): 40}


def _fio_doc(lat_percentiles: bool, **options):
    """A fio JSON result as fio 3 writes one (a read job), percentiles on clat unless
    lat_percentiles put them on lat."""
    pct = {"50.000000": 1000, "99.000000": 4000, "99.900000": 8000}
    block = {"io_bytes": 4096 * 100, "bw_bytes": 409600, "bw": 400, "iops": 100.0,
             "runtime": 1000, "total_ios": 100, "short_ios": 0, "drop_ios": 0,
             "clat_ns": {"min": 1, "max": 9000, "mean": 1500.0, "stddev": 1.0, "N": 100,
                         **({} if lat_percentiles else {"percentile": pct, "bins": BINS})},
             "lat_ns": {"min": 1, "max": 9500, "mean": 2000.0, "stddev": 1.0, "N": 100,
                        **({"percentile": pct, "bins": BINS} if lat_percentiles else {})}}
    zero = {**block, "total_ios": 0, "iops": 0.0, "io_bytes": 0}
    return {"fio version": "fio-3.33", "global options": {"ioengine": "io_uring",
                                                          "direct": "1"},
            "jobs": [{"jobname": "j", "error": 0, "usr_cpu": 1.0, "sys_cpu": 2.0,
                      "job options": {"name": "j", "rw": "randread", "bs": "4k",
                                      "iodepth": "32", "filename": "/dev/nvme0n1", **options},
                      "read": block, "write": zero}]}


def test_a_fio_result_reads_with_gpufios_names_units_and_latency():
    (job,) = from_fio(_fio_doc(False), "fio.json")["jobs"]
    assert job["latency"] == {"mean": "lat", "percentiles": "clat"}
    assert job["read"]["lat_ns"]["mean"] == 2000.0  # lat's mean, not clat's
    # json+'s bins by value come back as gpufio's buckets, counts kept
    assert job["read"]["lat_ns"]["bins"] == {"300": 60, "450": 40}
    assert job["resolved options"]["engine"] == "uring"
    assert job["resolved options"]["targets"] == ["/dev/nvme0n1"]
    assert job_heading(job) == ("j: rw=randread, bs=4KiB, engine=io_uring, iodepth=32, "
                                "numjobs=1, target=/dev/nvme0n1, latency: lat mean, "
                                "clat percentiles")
    (lat,) = from_fio(_fio_doc(True), "fio.json")["jobs"]
    assert lat["latency"] == {"mean": "lat", "percentiles": "lat"}


@pytest.mark.parametrize("a, b, same", [
    ("4k", 4096, True), ("4096", 4096, True), ("1", True, True), ("0", True, False),
    ("10", 10_000_000_000, True), ("500ms", 500_000_000, True), ("32", 32, True),
    ("8k", 4096, False), (1, True, False), ("uring", "uring", True),
])
def test_check_reads_fios_units(a, b, same):
    assert same_value(a, b) is same and same_value(b, a) is same


def _gpufio_doc(**resolved):
    fio = from_fio(_fio_doc(True), "x")
    job = {**{k: v for k, v in fio["jobs"][0].items() if k != "latency"}, "engine": "uring",
           "targets": [
        {"path": "/dev/nvme0n1", "kind": "nvme"}],
        "resolved options": {"name": "j", "rw": "randread", "bs": 4096, "iodepth": 32,
                             "numjobs": 1, "direct": True, "engine": "uring",
                             "targets": ["/dev/nvme0n1"], "randseed": 137, **resolved}}
    return {"gpufio version": "0", "host": {"cpu": "cpu", "cpus": 2, "kernel": "6"},
            "gpus": [], "jobs": [job]}


def test_check_against_a_fio_result_compares_the_settings_not_their_spelling():
    fio = from_fio(_fio_doc(False), "fio.json")
    assert mismatches(_gpufio_doc(), fio) == []
    assert mismatches(_gpufio_doc(bs=8192, iodepth=8), fio) == [
        "job 'j': options differ: bs, iodepth"]
    other = _gpufio_doc()
    other["jobs"][0]["targets"] = [{"path": "/dev/nvme1n1", "kind": "nvme"}]
    assert mismatches(other, fio) == [
        "targets differs: baseline '/dev/nvme0n1', result '/dev/nvme1n1'"]


def test_compare_heads_a_fio_column_and_names_its_latency(tmp_path):
    from rich.console import Console

    fio = from_fio(_fio_doc(False), "fio.json")
    console = Console(width=200, record=True)
    compare_render([fio, _gpufio_doc()], ["fio", "ours"], "table", console)
    text = console.export_text()
    assert "fio: fio-3.33; targets /dev/nvme0n1" in text
    assert ("  j: rw=randread, bs=4KiB, engine=io_uring, iodepth=32, numjobs=1, "
            "target=/dev/nvme0n1, latency: lat mean, clat percentiles") in text
    assert "x?" not in text and "targets none" not in text
    p99 = next(line for line in text.splitlines() if "lat_p99 " in line)
    assert "4.000 (clat)" in p99
    mean = next(line for line in text.splitlines() if "lat_mean" in line)
    assert "clat" not in mean


def test_compare_hints_at_lat_percentiles_for_a_clat_result(tmp_path):
    clat, lat = tmp_path / "fio-clat.json", tmp_path / "fio-lat.json"
    clat.write_text(json.dumps(_fio_doc(False)))
    lat.write_text(json.dumps(_fio_doc(True)))
    res = cli.invoke(app, ["compare", str(clat), str(lat), "-f", "json"])
    assert res.exit_code == 0, res.output
    (note,) = res.stderr.strip().splitlines()
    assert note.startswith("gpufio: note: fio-clat: fio's latency percentiles there are clat")
    assert "--lat_percentiles=1" in note
    res = cli.invoke(app, ["compare", str(lat), str(lat), "-f", "json"])
    assert res.exit_code == 0 and res.stderr == ""


def test_fios_own_result_and_gpufios_fio_json_read_back_through_compare(plus_doc, tmp_path,
                                                                        fio_json):
    target = tmp_path / "t.dat"
    target.write_bytes(b"\1" * (1 << 20))
    fio_out = fio_json("--name=j", f"--filename={target}", "--rw=randread", "--bs=4k",
                       "--size=1m", "--io_size=256k", "--ioengine=psync", "--output-format=json+")
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(to_fio(plus_doc)))
    res = cli.invoke(app, ["compare", str(fio_out), str(ours), "-f", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = {(r["job"], r["metric"]): r for r in out["rows"]}
    assert rows[("j", "iops")]["fio"] > 0 and rows[("j", "iops")]["ours"] > 0
    assert rows[("j", "lat_p99")]["ours"] == pytest.approx(
        plus_doc["jobs"][0]["read"]["lat_ns"]["percentile"]["99.000000"] / 1e3)
    assert out["setups"]["fio"]["targets"] == str(target)
    assert "fio's latency percentiles there are clat" in res.stderr


PROFILE_KEYS = """
[global]
engine = "psync"
size = "1m"
io_size = "64k"
runtime = "10s"
ramp_time = 0
randseed = 7
percentile_list = [50.0, 99.0]
file_service = "random"
random_distribution = "zipf:1.2"
verify = true
[[job]]
name = "mix"
rw = "randrw"
rwmixread = 70
bs = "8k"
numjobs = 2
fsync = 4
"""


@pytest.mark.skipif(not shutil.which("fio"), reason="fio not installed")
def test_fio_parses_the_job_options_fio_json_writes(tmp_path):
    """fio's own parser is the judge of fio's names and values."""
    prof = tmp_path / "keys.toml"
    prof.write_text(PROFILE_KEYS)
    res = cli.invoke(app, ["run", str(prof), "-q", "--set", f"filename={tmp_path / 't.dat'}",
                           "-f", "fio-json"])
    assert res.exit_code == 0, res.output
    opts = json.loads(res.stdout)["jobs"][0]["job options"]
    assert {"rw", "rwmixread", "bs", "numjobs", "fsync", "size", "io_size", "runtime",
            "randseed", "percentile_list", "file_service_type", "random_distribution",
            "filename", "ioengine"} <= set(opts)
    assert "verify" not in opts  # gpufio's pattern check is none of fio's verify values
    args = [f"--{k}={v}" for k, v in opts.items() if k != "name"]
    run = subprocess.run(["fio", "--parse-only", "--name=mix", *args], capture_output=True,
                         text=True)
    assert run.returncode == 0 and run.stderr == "", (args, run.stderr)


def test_check_against_fios_own_result_of_the_same_job(tmp_path, fio_json):
    target = tmp_path / "t.dat"
    args = ["--name=j", f"--filename={target}", "--rw=randread", "--bs=4k", "--size=1m",
            "--io_size=256k", "--ioengine=psync", "--direct=0"]
    ours, saved = _run_json(args, tmp_path)  # gpufio lays the file out first
    fio_out = fio_json(*args, "--output-format=json")
    res = cli.invoke(app, ["check", str(saved), "-b", str(fio_out), "--max-drop", "iops=99%"])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if "WARNING" in line]
    assert not any("differ" in w for w in warnings), warnings  # 4k is 4096, "0" is false
    # direct=0 read the page cache: check names that beside fio's clat percentiles
    assert any("page cache" in w for w in warnings), warnings
    (clat,) = [w for w in warnings if "clat" in w]
    assert "baseline: fio's latency percentiles there are clat" in clat


def test_show_prints_another_workloads_result_with_its_own_table(tmp_path):
    prof = tmp_path / "ck.toml"
    prof.write_text(f'[global]\nworkload = "checkpoint"\ndevice = "cpu"\nengine = "psync"\n'
                    f'state_size = "1m"\niterations = 1\nbs = "512k"\n'
                    f'targets = ["{tmp_path}"]\n')
    res = cli.invoke(app, ["run", str(prof), "-q", "-f", "json"])
    assert res.exit_code == 0, res.output
    saved = tmp_path / "ck.json"
    saved.write_text(res.stdout)
    shown = cli.invoke(app, ["show", str(saved), "-f", "csv"])
    assert shown.exit_code == 0, shown.output
    from gpufio import api

    doc = json.loads(res.stdout)
    assert shown.stdout.splitlines() == api.render(doc, "csv").splitlines()
    assert [line.split(",")[0] for line in shown.stdout.splitlines()[1:]] == ["ck", "ck naive"]
    assert "IOPS" not in shown.stdout.splitlines()[0]  # the checkpoint's table, not block's
    _one_line_error(cli.invoke(app, ["show", str(saved), "-f", "fio-json"]),
                    "'fio-json' is not one of", "for workload 'checkpoint'")


@pytest.mark.skipif(not shutil.which("fio-plot"), reason="fio-plot (pip install fio-plot) is "
                    "not installed")
@pytest.mark.parametrize("graph", ["-l", "-H"])
def test_fio_plot_draws_fio_json(plus_doc, tmp_path, graph):
    results = tmp_path / "results"
    results.mkdir()
    (results / "randread-1-1.json").write_text(json.dumps(to_fio(plus_doc)))
    out = tmp_path / "graph.png"
    run = subprocess.run(["fio-plot", "-i", str(results), "-T", "gpufio", graph, "-r",
                          "randread", "-n", "1", "-d", "1", "-o", str(out)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert out.stat().st_size > 1000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fio_json_names_a_target_that_is_not_storage(tmp_path):
    """A buffered job's reads are the page cache's: fio-json says so under a key of gpufio's
    own, which fio's tools pass over, so the file never reads as a drive's."""
    target = tmp_path / "t.dat"
    doc, _ = _run_json(["--name=j", f"--filename={target}", "--rw=randread", "--bs=4k",
                        "--size=1m", "--io_size=64k", "--ioengine=psync", "--direct=0"],
                       tmp_path)
    (job,) = to_fio(doc)["jobs"]
    (entry,) = job["gpufio not storage"]
    assert entry["path"] == str(target) and entry["kind"] == "page cache"
    assert entry["reaches_storage"] is False
    direct, _ = _run_json(["--name=j", f"--filename={target}", "--rw=randread", "--bs=4k",
                           "--size=1m", "--io_size=64k", "--ioengine=psync", "--direct=1"],
                          tmp_path)
    assert "gpufio not storage" not in to_fio(direct)["jobs"][0]  # a disk's file, direct


def _two_jobs(tmp_path, target):
    prof = tmp_path / "two.toml"
    prof.write_text(f'[global]\ntargets = ["{target}"]\nbs = "4k"\nio_size = "64k"\n'
                    'rw = "randread"\n[[job]]\nname = "a"\nengine = "psync"\n'
                    '[[job]]\nname = "b"\nengine = "uring"\niodepth = 4\n'
                    '[sweep]\nbs = ["4k", "8k"]\n')
    return prof


def test_section_runs_only_the_named_jobs_as_fio_does(tmp_path, pattern_file):
    """fio's --section: a job's name runs all its sweep points, a swept name one of them."""
    prof = _two_jobs(tmp_path, pattern_file)
    doc, _ = _run_json([str(prof), "--section", "b"], tmp_path)
    assert [j["jobname"] for j in doc["jobs"]] == ["b[bs=4k]", "b[bs=8k]"]
    assert all(j["read"]["io_bytes"] == 64 << 10 for j in doc["jobs"])
    doc, _ = _run_json([str(prof), "--section", "a[bs=8k]", "--section", "b[bs=4k]"],
                       tmp_path, "two.json")
    assert [j["jobname"] for j in doc["jobs"]] == ["a[bs=8k]", "b[bs=4k]"]
    _one_line_error(cli.invoke(app, ["run", str(prof), "-q", "--section", "c"]),
                    "--section 'c'", str(prof), "its jobs: a, b")


def test_show_merges_a_profile_s_sections_run_apart(tmp_path):
    """A GNN profile run one section at a time (a machine whose calls are short) shows as
    one run of it: each job compared with the mmap baseline that ran in another call."""
    prof = tmp_path / "g.toml"
    prof.write_text(f'[global]\nworkload = "gnn"\ndevice = "cpu"\nnodes = 3000\n'
                    f'feature_dim = 32\nhidden = 8\nbatch_size = 32\nfanout = [3, 2]\n'
                    f'iterations = 4\nwarmup = 1\ndirectory = "{tmp_path}"\n'
                    '[[job]]\nname = "base"\nengine = "mmap"\n'
                    '[[job]]\nname = "io"\nengine = "cpu-gpu"\n')
    first, a = _run_json([str(prof), "--section", "base"], tmp_path, "a.json")
    second, b = _run_json([str(prof), "--section", "io"], tmp_path, "b.json")
    assert "speedup_vs_mmap" not in second["jobs"][0]  # no baseline in its own run
    shown = cli.invoke(app, ["show", str(a), str(b), "-f", "json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert [j["jobname"] for j in doc["jobs"]] == ["base", "io"]
    assert doc["host"] == first["host"] and doc["interrupted"] is False
    io, base = doc["jobs"][1], doc["jobs"][0]
    want = base["stages"]["aggregation_ms"] / io["stages"]["aggregation_ms"]
    assert io["speedup_vs_mmap"]["aggregation"] == pytest.approx(want)


def test_show_refuses_to_merge_what_is_not_one_profile_s_runs(tmp_path, pattern_file):
    prof = _two_jobs(tmp_path, pattern_file)
    _, block = _run_json([str(prof), "--section", "a"], tmp_path, "block.json")
    _one_line_error(cli.invoke(app, ["show", str(block), str(block)]),
                    "block results are shown one at a time")
    g = json.loads(block.read_text())
    g.update(workload="gnn", jobs=[])
    gnn = tmp_path / "gnn.json"
    gnn.write_text(json.dumps(g))
    other = dict(g, host={**g["host"], "cpu": "another CPU"})
    far = tmp_path / "far.json"
    far.write_text(json.dumps(other))
    _one_line_error(cli.invoke(app, ["show", str(gnn), str(far)]),
                    str(far), "ran on another machine")
    _one_line_error(cli.invoke(app, ["show", str(gnn), str(block)]),
                    str(block), "a block result, not gnn")
    named = dict(g, jobs=[{"jobname": "j"}])
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(named))
    two.write_text(json.dumps(named))
    _one_line_error(cli.invoke(app, ["show", str(one), str(two)]),
                    str(two), "job 'j' is in", "each section once")
    two.write_text(json.dumps(dict(g, profile="other.toml")))
    _one_line_error(cli.invoke(app, ["show", str(one), str(two)]),
                    str(two), "a run of other.toml, not of")


def test_a_section_s_groups_are_numbered_from_0_as_fio_numbers_them(tmp_path, pattern_file):
    job = tmp_path / "g.fio"
    job.write_text(f"[global]\nfilename={pattern_file}\nbs=4k\nio_size=16k\nrw=randread\n"
                   "ioengine=psync\n[a]\n[b]\nstonewall\n[c]\n[d]\nstonewall\n")
    for sections, want in ((["c"], [0]), (["a", "d"], [0, 1]), (["b", "c"], [0, 0])):
        args = [x for s in sections for x in ("--section", s)]
        res = cli.invoke(app, ["run", str(job), *args, "-q", "-f", "fio-json"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.stdout[res.stdout.index("{"):])["jobs"]
        assert [j["jobname"] for j in got] == sections
        assert [j["groupid"] for j in got] == want
