"""Bad input as a user meets it: every profile in tests/bad_profiles/ (and the generated
encodings below) run through the CLI ends in exactly one line on stderr, exit code 2, no
traceback, and no file laid out. Each corpus file names the message it expects in its first
line (``# expect: ...`` or, for fio files, ``; expect: ...``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio.cli import app

from checkout import PROFILES, TESTS

CORPUS = TESTS / "bad_profiles"
cli = CliRunner()


def _expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    return first.split("expect:", 1)[1].strip()


def _assert_one_line_bad_input(res, scratch: Path, *fragments: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("gpufio: error: "), res.stderr
    assert "Traceback" not in res.output
    for fragment in fragments:
        assert fragment in res.stderr, res.stderr
    assert not scratch.exists() or os.listdir(scratch) == []  # nothing laid out


@pytest.mark.parametrize("path", sorted(CORPUS.iterdir()), ids=lambda p: p.name)
def test_every_bad_profile_is_one_line_and_exit_2(path, scratch, monkeypatch):
    monkeypatch.delenv("GPUFIO_UNSET_FOR_TEST", raising=False)
    res = cli.invoke(app, ["run", str(path), "--quiet"])
    _assert_one_line_bad_input(res, scratch, _expected(path))


@pytest.mark.parametrize("name,data,fragment", [
    ("utf16.toml", "[global]\nbs = 4096\n".encode("utf-16"), "it is UTF-16"),
    ("utf16.fio", "[j]\nbs=4k\n".encode("utf-16"), "it is UTF-16"),
    ("binary.toml", bytes(range(256)) * 4, "not UTF-8 text"),
    ("latin1.toml", "[global]\nname = \"caf\xe9\"\n".encode("latin-1"), "not UTF-8 text"),
])
def test_profiles_that_are_not_utf8_are_one_line(tmp_path, scratch, name, data, fragment):
    path = tmp_path / name
    path.write_bytes(data)
    res = cli.invoke(app, ["run", str(path), "--quiet"])
    _assert_one_line_bad_input(res, scratch, str(path), fragment)


@pytest.mark.parametrize("argv,fragment", [
    (["run", "/nonexistent/p.toml"], "/nonexistent/p.toml: no such profile"),
    (["run", "{corpus}", "--format", "xml"], "--format: 'xml' is not one of"),
    (["run", "{ok}", "--set", "bs"], "--set 'bs': expected KEY=VALUE"),
    (["run", "{ok}", "--set", "nmjobs=2"], "--set: unknown key 'nmjobs'"),
    (["run", "{ok}", "--set", "targets=[/a, /b]"], "--set targets: '[/a, /b]' is not a TOML"),
    (["engines", "--format", "yaml"], "--format: 'yaml' is not one of table, json"),
    (["info", "--format", "yaml"], "--format: 'yaml' is not one of table, json"),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json"], "no such"),
])
def test_bad_command_lines_are_one_line(write_profile, scratch, argv, fragment):
    ok = write_profile('[global]\nsize = "1m"\nruntime = "100ms"\n')
    argv = [a.format(corpus=CORPUS / "typo-key.toml", ok=ok) for a in argv]
    _assert_one_line_bad_input(cli.invoke(app, argv), scratch, fragment)


@pytest.mark.parametrize("shipped,job,workload", [
    ("gnn-cpu-check.toml", "mmap", "gnn"),
    ("checkpoint-cpu-check.toml", "checkpoint-cpu-check.0", "checkpoint")])
@pytest.mark.parametrize("setting", ["rw=randwrite", "numjobs=4", "runtime=10s", "verify=true",
                                     "fsync=1", "time_based=true", "ramp_time=1s"])
def test_a_block_key_given_to_a_gnn_or_checkpoint_job_is_one_line(scratch, shipped, job,
                                                                  workload, setting):
    """A key of the block workload's I/O run does nothing in a GNN or checkpoint job: the
    CLI refuses it naming the file, the job and the key, before anything is laid out."""
    key = setting.split("=")[0]
    res = cli.invoke(app, ["run", str(PROFILES / shipped), "--quiet", "--set", setting])
    _assert_one_line_bad_input(
        res, scratch, f"{PROFILES / shipped}: job '{job}': key '{key}' does nothing in a job "
        f"of workload '{workload}' (it is a key of block jobs)")


@pytest.mark.parametrize("workload,extra", [("gnn", 'device = "cpu"'),
                                            ("checkpoint", 'device = "cpu"\nstate_size = "1m"')])
@pytest.mark.parametrize("key,value", [("rw", '"write"'), ("numjobs", "2"),
                                       ("runtime", '"5s"'), ("verify", "true")])
def test_a_block_key_in_a_profiles_job_table_is_one_line(write_profile, scratch, workload,
                                                         extra, key, value):
    path = write_profile(f'[global]\nworkload = "{workload}"\n{extra}\n'
                         f'[[job]]\nname = "j"\n{key} = {value}\n')
    for command in ("run", "prepare", "info"):
        argv = [command, str(path), "--quiet"] if command == "run" else [command, str(path)]
        _assert_one_line_bad_input(cli.invoke(app, argv), scratch,
                                   f"{path}: job 'j': key '{key}' does nothing in a job of "
                                   f"workload '{workload}'")


def test_set_values_are_toml_lists_strings_numbers_and_booleans(write_profile, tmp_path):
    from gpufio import profile

    path = write_profile('[global]\nsize = "64k"\n')
    a, b = tmp_path / "a.dat", tmp_path / "b.dat"
    sets = profile.parse_set([f'targets=["{a}", "{b}"]', "numjobs=2", "direct=false",
                              "name=1", "bs=4k", f"directory={tmp_path}"])
    (job,) = profile.load(str(path), sets).jobs
    assert job.targets == (str(a), str(b)) and job.numjobs == 2 and job.direct is False
    assert job.name == "1" and job.bs == 4096 and job.directory == str(tmp_path)
    (job,) = profile.load(str(path), profile.parse_set([f"targets={a},{b}"])).jobs
    assert job.targets == (str(a), str(b))  # the bare form still works
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "--set",
                           f'targets=["{a}", "{b}"]', "--set", "runtime=100ms"])
    assert res.exit_code == 0, res.output
    assert a.exists() and b.exists() and not (Path.cwd() / '["').exists()


def test_too_many_processes_for_the_kernel_is_one_line(write_profile, scratch, monkeypatch):
    from gpufio.workloads.block import limits

    monkeypatch.setattr(limits, "_process_room", lambda: 3)
    path = write_profile('[global]\nsize = "1m"\nnumjobs = 4\nruntime = "1s"\n')
    res = cli.invoke(app, ["run", str(path), "--quiet"])
    _assert_one_line_bad_input(res, scratch, "numjobs 4 needs 4 worker processes; the kernel "
                               "has room for 3 more")


def test_an_unforeseen_error_is_one_line_unless_debug(write_profile, scratch, monkeypatch):
    from gpufio.workloads.block import runner

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(runner, "run_profile", broken)
    path = write_profile('[global]\nsize = "1m"\nruntime = "100ms"\n')
    monkeypatch.delenv("GPUFIO_DEBUG", raising=False)
    res = cli.invoke(app, ["run", str(path), "--quiet"])
    assert res.exit_code == 3 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("gpufio: internal error: ZeroDivisionError: division by zero "
                                 "second line (a gpufio bug; --debug or GPUFIO_DEBUG=1")
    res = cli.invoke(app, ["--debug", "run", str(path), "--quiet"])
    assert res.exit_code != 0 and isinstance(res.exception, ZeroDivisionError)
