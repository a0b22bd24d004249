"""fio job files run as fio runs them, or are refused in one line.

A corpus of fio's job-file grammar (tests/data/fio: sections, include, ${VAR}, stonewall,
new_group, size units, directory and filename lists, comments) and fio's own examples, each
checked against fio itself where it is installed: ``fio --parse-only`` accepts every file,
and fio and gpufio, each run on the same file in an empty directory, lay out the same files
with the same sizes, report the same jobs in the same groups, and run the same jobs at the
same time. What gpufio cannot run as fio would is refused in one line naming the option.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app
from gpufio.core.errors import BadInput

from checkout import DATA

CORPUS = DATA / "fio"
FIO = shutil.which("fio")
needs_fio = pytest.mark.skipif(FIO is None, reason="fio is not installed")
# what env.fio reads from the environment
ENV = {"GPUFIO_FIO_SIZE": "48k", "GPUFIO_FIO_NAME": "envfile"}
# the directories dirs.fio names, made in each run's directory, and the file share.fio
# takes shares of, laid out there
DIRS = ("d1", "d2")
SHARED = ("share.dat", 1 << 20)
cli = CliRunner()


def _refusal(path: Path) -> str | None:
    """The error a corpus file expects (its first line: ``; refused: TEXT``), None for a file
    gpufio runs."""
    first = path.read_text().splitlines()[0]
    return first.split("refused:", 1)[1].strip() if "refused:" in first else None


ALL = sorted(CORPUS.glob("*.fio"))
RUNNABLE = [p for p in ALL if _refusal(p) is None]
REFUSED = [p for p in ALL if _refusal(p) is not None]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)


def _layout(directory: Path) -> dict[str, int]:
    """Every file under ``directory`` and its size, but fio's own verify state files."""
    return {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*")
            if p.is_file() and not p.name.endswith("verify.state")}


def _workdir(path: Path) -> Path:
    path.mkdir()
    for d in DIRS:
        (path / d).mkdir()
    (path / SHARED[0]).write_bytes(os.urandom(SHARED[1]))
    return path


def _run_fio(job: Path, cwd: Path) -> dict:
    out = cwd.parent / f"{cwd.name}.json"
    res = subprocess.run([FIO, "--output-format=json", f"--output={out}", str(job)], cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    if res.returncode:
        pytest.skip(f"fio cannot run {job.name} here: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.read_text())


def _run_gpufio(job: Path, cwd: Path, monkeypatch) -> tuple[dict, str]:
    monkeypatch.chdir(cwd)
    out = cwd.parent / f"{cwd.name}.json"
    res = cli.invoke(app, ["run", str(job), "-q", "-f", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.stderr


def _groups(doc: dict) -> list[tuple[str, int]]:
    return [(j["jobname"], j["groupid"]) for j in doc["jobs"]]


@needs_fio
@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_fio_accepts_every_corpus_file(path):
    res = subprocess.run([FIO, "--parse-only", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


@needs_fio
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.name)
def test_the_corpus_lays_out_and_groups_as_fio_does(path, tmp_path, monkeypatch):
    fio_doc = _run_fio(path, _workdir(tmp_path / "fio"))
    doc, _ = _run_gpufio(path, _workdir(tmp_path / "gpufio"), monkeypatch)
    assert _layout(tmp_path / "gpufio") == _layout(tmp_path / "fio")
    assert _groups(doc) == _groups(fio_doc)
    assert all(j["error"] == 0 for j in doc["jobs"])


def test_the_corpus_files_and_groups_are_fios(tmp_path, monkeypatch):
    """What the comparison with fio above found, written out, so it holds where fio is not
    installed too."""
    monkeypatch.chdir(_workdir(tmp_path / "w"))
    prof = profile.load(str(CORPUS / "groups.fio"))
    assert [(j.name, j.targets, j.size) for j in prof.jobs] == [
        ("a", ("a.0.0",), 65536), ("a", ("a.1.0",), 65536),
        ("b", ("b.0.0", "b.0.1"), 32768), ("c", ("c.x.0.0",), 65536),
        ("d", ("d.0.0", "d.0.1", "d.0.2"), 21845), ("e", ("f.e.0",), 65536)]
    assert prof.groups == ((0, 0), (0, 0), (0, 0), (1, 1), (1, 2), (2, 3))
    units = {j.name: (j.targets, j.size, j.offset, j.bs)
             for j in profile.load(str(CORPUS / "units.fio")).jobs}
    assert units == {"thirds": (("thirds.0.0", "thirds.0.1", "thirds.0.2"), 34133, 0, 4096),
                     "mib": (("mib.0.0",), 1_000_000, 0, 4096),
                     "offset": (("offset.0.0",), 65536, 16384, 4096),
                     "base1000": (("base1000.0.0",), 65536, 0, 4096),
                     "hex": (("hex.0.0",), 65536, 0, 4096)}
    jobs = profile.load(str(CORPUS / "include.fio")).jobs
    assert [(j.name, j.rw, j.size, j.engine, j.direct) for j in jobs] == [
        ("inc-a", "randread", 32768, "psync", False), ("inc-b", "randread", 16384, "psync",
                                                       False)]
    jobs = profile.load(str(CORPUS / "dirs.fio")).jobs
    assert [j.targets for j in jobs] == [("d1/spread.0.0", "d1/spread.0.1"),
                                         ("d2/spread.1.0", "d2/spread.1.1"),
                                         ("d1/spread.2.0", "d1/spread.2.1"),
                                         ("d1/x", "d1/y:z")]
    (env,) = profile.load(str(CORPUS / "env.fio")).jobs
    assert (env.targets, env.size, env.bs) == (("envfile.dat",), 48 << 10, mmap.PAGESIZE)
    first, second = profile.load(str(CORPUS / "comments.fio")).jobs
    assert (first.bs, first.size, second.bs) == (4096, 32768, 8192)


@needs_fio
def test_shares_of_a_files_size_are_the_bytes_fio_reads(tmp_path, monkeypatch):
    """share.fio: offset=25% and size=30% of a 1 MiB file. fio's own I/O log says which
    bytes it read: the same region gpufio's job reads, and as many bytes."""
    job = CORPUS / "share.fio"
    fio_dir = _workdir(tmp_path / "fio")
    logged = fio_dir / "logged.fio"
    logged.write_text("[global]\nwrite_iolog=io.log\n" + job.read_text())
    fio_doc = _run_fio(logged, fio_dir)
    # version 3 lines: time, file, action, offset, length
    reads = [line.split()[-2:] for line in (fio_dir / "io.log").read_text().splitlines()
             if " read " in line]
    start = min(int(off) for off, _ in reads)
    end = max(int(off) + int(n) for off, n in reads)
    run = _workdir(tmp_path / "gpufio")
    monkeypatch.chdir(run)
    (mine,) = profile.load(str(job)).jobs
    assert (mine.offset, mine.offset + mine.size) == (start, end) == (262144, 262144 + 311296)
    doc, _ = _run_gpufio(job, run, monkeypatch)
    assert doc["jobs"][0]["read"]["io_bytes"] == fio_doc["jobs"][0]["read"]["io_bytes"]


def _fio_windows(job: Path, cwd: Path) -> list[tuple[float, float]]:
    """Each fio job's (start, end) in unix ms, from its IOPS log: fio 3.33's JSON has no
    job_start. The log's first sample closes its first 100 ms, its last is at most the end."""
    logged = cwd / "logged.fio"
    logged.write_text("[global]\nwrite_iops_log=win\nlog_avg_msec=100\nlog_unix_epoch=1\n"
                      + job.read_text())
    doc = _run_fio(logged, cwd)
    windows = []
    for i in range(1, len(doc["jobs"]) + 1):
        stamps = [int(line.split(",")[0]) for line in
                  (cwd / f"win_iops.{i}.log").read_text().splitlines() if line.strip()]
        windows.append((stamps[0] - 100.0, float(stamps[-1])))
    return windows


def _overlaps(windows: list[tuple[float, float]], at_least_ms: float) -> list[list[bool]]:
    return [[i != j and min(a[1], b[1]) - max(a[0], b[0]) > at_least_ms
             for j, b in enumerate(windows)] for i, a in enumerate(windows)]


@needs_fio
def test_jobs_run_at_once_until_a_stonewall_as_in_fio(tmp_path, monkeypatch):
    """windows.fio: [a] and [b] for a second at once, then [c]. Which jobs overlap by more
    than 300 ms is the same for fio and gpufio (and what the file says)."""
    job = CORPUS / "windows.fio"
    fio = _overlaps(_fio_windows(job, _workdir(tmp_path / "fio")), 300)
    doc, _ = _run_gpufio(job, _workdir(tmp_path / "gpufio"), monkeypatch)
    mine = _overlaps([tuple(j["window_unix_ms"]) for j in doc["jobs"]], 300)
    expected = [[False, True, False], [True, False, False], [False, False, False]]
    assert fio == expected and mine == expected
    assert [g["groupid"] for g in doc["group_totals"]] == [0, 1]
    assert doc["group_totals"][0]["read"]["total_ios"] == sum(
        j["read"]["total_ios"] for j in doc["jobs"][:2])


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.name)
def test_what_gpufio_cannot_run_as_fio_is_refused_in_one_line(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli.invoke(app, ["run", str(path), "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert str(path) in res.stderr and _refusal(path) in res.stderr
    assert os.listdir(tmp_path) == []  # nothing laid out


def test_verify_md5_runs_as_gpufios_pattern_verify_and_says_so(tmp_path, monkeypatch):
    doc, stderr = _run_gpufio(CORPUS / "verify.fio", _workdir(tmp_path / "w"), monkeypatch)
    line = ("verify=md5 runs as gpufio's pattern verify (every block carries its offset and "
            "seed, checked as it is read; not fio's md5 headers)")
    assert f"gpufio: note: {line}\n" in stderr
    assert doc["notes"] == [line]
    (job,) = doc["jobs"]
    assert job["verify"] == {"enabled": True, "failures": 0, "bad_offsets": []}
    (phase,) = job["phases"]  # the written blocks read back and checked
    assert job["write"]["total_ios"] == 16 and "read-back" in phase["phase"]


def _resident(path: Path) -> int:
    """How many pages of a file are in the page cache (mincore over a private mapping)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        pages = -(-size // mmap.PAGESIZE)
        m = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    try:
        vec = (ctypes.c_ubyte * pages)()
        anchor = ctypes.c_char.from_buffer(m)
        rc = ctypes.CDLL(None, use_errno=True).mincore(
            ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor
    finally:
        m.close()
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec)


def _cache(path: str | Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass


@pytest.mark.parametrize("invalidate", [1, 0])
def test_a_buffered_job_starts_with_its_files_out_of_the_page_cache(invalidate, tmp_path,
                                                                      monkeypatch):
    """fio's invalidate=1 (its default): a buffered job's files leave the page cache before
    it reads 4 KiB of a 1 MiB file, so afterwards at most its read and readahead are cached;
    with invalidate=0 the whole file stays cached."""
    job = tmp_path / "inv.fio"
    job.write_text(f"[inv]\nsize=1m\nio_size=4k\nrw=read\ninvalidate={invalidate}\n")
    run = _workdir(tmp_path / "w")
    _run_gpufio(job, run, monkeypatch)  # lays the file out
    _cache(run / "inv.0.0")
    assert _resident(run / "inv.0.0") == 256
    doc, _ = _run_gpufio(job, run, monkeypatch)
    assert doc["jobs"][0]["resolved options"]["invalidate"] is bool(invalidate)
    assert doc["jobs"][0]["read"]["total_ios"] == 1
    if invalidate:
        assert _resident(run / "inv.0.0") <= 64
    else:
        assert _resident(run / "inv.0.0") == 256


def _buffers_mib() -> float:
    """The block devices' page cache (Buffers in /proc/meminfo), in MiB."""
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines()
                if x.startswith("Buffers:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("losetup"),
                    reason="needs root and losetup for a loop device")
def test_invalidate_flushes_a_block_devices_buffer_cache(tmp_path):
    """A 128 MiB loop device read through the buffer cache adds at least 96 MiB to it, and
    invalidate takes them out again (mincore sees no block device's cache, so the kernel's
    Buffers count tells, the margins leaving room for other devices' reads; the device is
    held open throughout, since its last close drops its cache anyway)."""
    from gpufio.core import targets as tg

    backing = tmp_path / "backing"
    with open(backing, "wb") as f:
        f.truncate(128 << 20)
    dev = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True,
                         text=True, check=True).stdout.strip()
    try:
        before = _buffers_mib()
        with open(dev, "rb", buffering=0) as held:
            while held.read(1 << 20):
                pass
            cached = _buffers_mib()
            assert cached - before >= 96
            target = tg.open_target(dev, direct=False)
            try:
                tg.invalidate([target])
            finally:
                target.close()
            assert cached - _buffers_mib() >= 96
    finally:
        subprocess.run(["losetup", "-d", dev], check=True)


def _example_dirs() -> list[Path]:
    """Where fio's own examples are: $GPUFIO_FIO_EXAMPLES (fio's examples/ directory), or
    where a distribution installs them (Debian's fio package ships none)."""
    found = [os.environ.get("GPUFIO_FIO_EXAMPLES", ""), "/usr/share/doc/fio/examples",
             "/usr/share/fio/examples"]
    return [Path(d) for d in found if d and Path(d).is_dir()]


# fio's examples copied into the tests, and those installed here
EXAMPLES = sorted(DATA.glob("fio-examples/*.fio")) + sorted(
    p for d in _example_dirs() for p in d.glob("*.fio"))


def _tiny(text: str) -> str:
    """A fio example at a size a test runs in a moment, as both tools run it: 1 MiB files,
    no time limit, no directory (the current one), device paths as file names."""
    out = ["[global]", "size=1m"]  # for the examples that give none, naming a device
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        key = key.strip()
        if key in ("size", "filesize"):
            line = f"{key}=1m"
        elif key in ("runtime", "time_based", "ramp_time", "io_size", "io_limit", "directory"):
            continue
        elif key == "filename" and sep:
            line = "filename=" + ":".join(os.path.basename(p) for p in value.split(":"))
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fios_examples_run_as_fio_runs_them_or_are_refused_in_one_line(path, tmp_path,
                                                                         monkeypatch):
    """Each of fio's examples gpufio loads, made tiny, lays out and groups as fio's run of
    the same tiny file does; every other is refused in one line naming the file and the
    option (never a traceback)."""
    monkeypatch.chdir(tmp_path)
    try:
        profile.load(str(path))
    except BadInput as e:
        assert "\n" not in str(e) and str(path) in str(e)
        assert re.search(r"line \d+ \[|key '", str(e)), str(e)
        return
    if FIO is None:
        pytest.skip("fio is not installed: the run beside fio's is not made")
    tiny = tmp_path / path.name
    tiny.write_text(_tiny(path.read_text()))
    fio_doc = _run_fio(tiny, _workdir(tmp_path / "fio"))
    doc, _ = _run_gpufio(tiny, _workdir(tmp_path / "gpufio"), monkeypatch)
    assert _layout(tmp_path / "gpufio") == _layout(tmp_path / "fio")
    assert _groups(doc) == _groups(fio_doc)


def test_fios_examples_are_found_or_the_reason_is_given():
    if not _example_dirs():
        pytest.skip("fio's examples are not installed here (Debian's fio ships none): set "
                    "GPUFIO_FIO_EXAMPLES to fio's examples/ directory to check them all")
    assert len(EXAMPLES) > len(list(DATA.glob("fio-examples/*.fio")))


def test_clones_sharing_a_name_each_keep_their_numbers_in_compare():
    """fio names every numjobs clone after its job, so a result holds jobs of one name:
    compare and check see each of them, not the last."""
    from gpufio.results.load import jobs_by_name

    doc = {"jobs": [{"jobname": "a", "n": 0}, {"jobname": "a", "n": 1}, {"jobname": "b"}]}
    assert {k: j.get("n") for k, j in jobs_by_name(doc).items()} == {"a": 0, "a#2": 1,
                                                                     "b": None}


def test_sections_choose_jobs_as_fios_section_option(tmp_path, monkeypatch):
    """parse(..., sections=[...]) runs only those jobs, [global] still applying (fio's
    --section); a section the file lacks is one line."""
    from gpufio.fio.jobfile import parse

    monkeypatch.chdir(tmp_path)
    text = (CORPUS / "groups.fio").read_text()
    data, _ = parse(text, "groups.fio", sections=["b", "e"])
    assert [(j["name"], j["size"], j["stonewall"]) for j in data["job"]] == [
        ("b", 32768, False), ("e", 65536, True)]
    with pytest.raises(BadInput, match=r"^groups.fio: no job section \[z\]$"):
        parse(text, "groups.fio", sections=["z"])


def test_parsed_sections_build_the_same_jobs_as_their_text(tmp_path, monkeypatch):
    """from_sections is the entry for jobs that come from elsewhere than a file (a command
    line): the same sections give the same jobs as the text."""
    from gpufio.fio.jobfile import Section, from_sections, parse

    monkeypatch.chdir(tmp_path)
    sections = [Section("x", 0, {"rw": (0, "randread"), "size": (0, "64k"),
                                 "numjobs": (0, "2")})]
    data, notes = from_sections(sections)
    assert data == parse("[x]\nrw=randread\nsize=64k\nnumjobs=2\n", "x.fio")[0]
    assert [j["targets"] for j in data["job"]] == [["x.0.0"], ["x.1.0"]]
    assert notes == ["rw=randread: fio's random map reads each block once a pass; gpufio draws "
                     "random offsets with replacement, as fio's norandommap"]
    with pytest.raises(BadInput, match=r"line 0 \[x\]: thinktime is not supported"):
        from_sections([Section("x", 0, {"thinktime": (0, "10")})])


def test_toml_profiles_group_as_fio_files_do():
    """stonewall and new_group are profile keys: with concurrent = true they cut the jobs
    into run groups and reporting groups; without it every job runs alone, as before."""
    jobs = [{"name": "a"}, {"name": "b"}, {"name": "c", "new_group": True},
            {"name": "d", "stonewall": True}, {"name": "e"}]
    data = {"global": {"concurrent": True, "size": "64k", "engine": "null"}, "job": jobs}
    prof = profile.from_dict(data, "g.toml", {})
    assert prof.groups == ((0, 0), (0, 0), (0, 1), (1, 2), (1, 2))
    assert [[j.name for j in b] for b in prof.batches(prof.jobs)] == [["a", "b", "c"],
                                                                      ["d", "e"]]
    alone = profile.from_dict({**data, "global": {"size": "64k", "engine": "null"}},
                              "g.toml", {})
    assert [[j.name for j in b] for b in alone.batches(alone.jobs)] == [[n] for n in "abcde"]
    every = profile.from_dict(data, "g.toml", {"stonewall": True})
    assert len(every.batches(every.jobs)) == 5
    with pytest.raises(BadInput, match="key 'stonewall'"):
        profile.from_dict({"job": [{"stonewall": "often"}]}, "g.toml", {})


@pytest.mark.parametrize("text, message", [
    ("[j]\nnumjobs=0\nsize=1m\n", "numjobs and nrfiles take whole numbers of at least 1"),
    ("[j]\nkb_base=abc\nsize=1m\n", "kb_base=abc: 1000 or 1024"),
    ("[j]\ntime_based=abc\nsize=1m\n", "time_based=abc: a flag is 0 or 1"),
    ("[j]\nsize=-5\n", "size=-5: not a size"),
    ("[j]\nbs=4k-16k\nsize=1m\n", "bs=4k-16k: gpufio runs one block size"),
    ("[j]\nbs=0\nsize=1m\n", "bs=0: a block needs at least one byte"),
])
def test_a_value_fio_would_not_take_is_one_line_naming_it(text, message, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.fio").write_text(text)
    res = cli.invoke(app, ["run", "bad.fio", "-q"])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.fio"]  # nothing laid out


def test_a_profile_of_no_job_is_one_line(tmp_path):
    (tmp_path / "empty.toml").write_text("job = []\n")
    res = cli.invoke(app, ["run", str(tmp_path / "empty.toml"), "-q"])
    assert res.exit_code == 2 and res.output.strip().endswith("empty.toml: no job to run")


def test_invalidate_takes_an_engine_that_reads_through_the_page_cache_as_buffered(
        monkeypatch):
    """mmap reads through the page cache whatever ``direct`` says: fio's invalidate (on by
    default) drops its targets' pages as it does a buffered job's, and not a direct job's."""
    from gpufio.engines import all_engines
    from gpufio.profile import from_dict
    from gpufio.workloads.block import phases

    dropped = []
    monkeypatch.setattr(phases, "invalidate", lambda targets: dropped.append(list(targets)))
    (job,) = from_dict({"global": {"direct": True, "size": "1m"}}, "p.toml", {}).jobs
    phases.invalidate_before(job, all_engines()["mmap"], ["t"])
    phases.invalidate_before(job, all_engines()["psync"], ["t"])
    assert dropped == [["t"]]
