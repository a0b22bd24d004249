"""The compiled per-I/O loops (io/loops.py) against the engines' Python loops: the same
I/Os, bytes and result shapes; the Python loop where nothing can be compiled; polled I/O
(hipri) offered by target capability; and what ``gpufio --help`` imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufio import profile
from gpufio.core import pattern
from gpufio.core.errors import BadInput
from gpufio.core.requests import ChannelSpec
from gpufio.core.targets import Target
from gpufio.engines import uring as uring_engine
from gpufio.facts import device, storage
from gpufio.io import loops, uring
from gpufio.profile import from_dict
from gpufio.workloads.block import runner
from gpufio.workloads.block.document import build_document

from checkout import REPO as ROOT

needs_cc = pytest.mark.skipif(not loops.available(), reason="no compiled loops (no C compiler)")
needs_uring = pytest.mark.skipif(not uring.probe()["available"], reason="io_uring unavailable")


def run(path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch, **opts) -> dict:
    """One budgeted job on ``path`` through the compiled loop or the Python one: the result
    document (workers fork after the patch, so they see it)."""
    monkeypatch.setattr(loops, "available", lambda: compiled)
    prof = from_dict({"global": {"targets": [str(path)], "bs": "4k", "direct": False,
                                 "randseed": 9, **opts}}, "t.toml", {})
    doc = build_document(runner.run_profile(prof, quiet=True), prof)
    return json.loads(json.dumps(doc))


def shape(value):
    """A document's keys, nested, with every leaf replaced by its type."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()
                if k not in ("percentile", "bins", "samples")}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__ if not isinstance(value, (int, float)) else "number"


def counts(doc: dict) -> list:
    job = doc["jobs"][0]
    return [(d, job[d]["total_ios"], job[d]["io_bytes"], job[d]["short_ios"], job[d]["lat_ns"]["N"])
            for d in ("read", "write")] + [job["errors"], job["failure"], job["targets"]]


CASES = [{"engine": "uring", "iodepth": 1, "rw": "randread"},
         {"engine": "uring", "iodepth": 4, "rw": "randread", "io_size": "1m"},
         {"engine": "uring", "iodepth": 8, "rw": "randrw", "registerfiles": True},
         {"engine": "uring", "iodepth": 2, "rw": "read", "op": "nop"},
         {"engine": "psync", "rw": "randread"},
         {"engine": "psync", "rw": "randrw"},
         {"engine": "null", "rw": "randread", "iodepth": 1}]


@needs_cc
@needs_uring
@pytest.mark.parametrize("opts", CASES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_compiled_and_python_loops_give_the_same_results(pattern_file, monkeypatch, opts):
    a = run(pattern_file, True, monkeypatch, **opts)
    b = run(pattern_file, False, monkeypatch, **opts)
    assert a["jobs"][0]["engine_facts"]["loop"] == "compiled"
    assert b["jobs"][0]["engine_facts"]["loop"] == "python"
    assert a["jobs"][0]["error"] == 0 and counts(a) == counts(b)
    assert shape(a) == shape(b)


@needs_cc
@needs_uring
@pytest.mark.parametrize("engine", ["uring", "psync"])
def test_compiled_writes_put_the_same_bytes_as_the_python_loop(tmp_path, monkeypatch, engine):
    """Each loop writes a fresh file with the pattern (random order, depth 4); the bytes are
    identical, and a verified read-back of each passes."""
    files = []
    for compiled in (True, False):
        path = tmp_path / f"{compiled}.dat"
        path.write_bytes(bytes(1 << 20))
        doc = run(path, compiled, monkeypatch, engine=engine, rw="randwrite", iodepth=4,
                  verify=True, overwrite=True)
        job = doc["jobs"][0]
        assert job["error"] == 0 and job["write"]["total_ios"] == 256, job["failure"]
        assert job["verify"]["failures"] == 0
        files.append(path.read_bytes())
    assert files[0] == files[1]
    expected, zero = pattern.fill(9, 0, 1 << 20), bytes(4096)  # the job's seed
    blocks = [files[0][o:o + 4096] for o in range(0, 1 << 20, 4096)]
    assert all(b in (expected[i * 4096:(i + 1) * 4096], zero) for i, b in enumerate(blocks))
    assert sum(b != zero for b in blocks) > 128


def test_without_a_compiler_the_python_loop_runs(tmp_path):
    """No compiler (CC names none) and nothing built before (a fresh cache): the run works
    through the Python loop and says so."""
    prof = tmp_path / "p.toml"
    prof.write_text(f'[global]\nengine = "uring"\ntargets = ["{tmp_path / "t.dat"}"]\n'
                    'size = "1m"\nrw = "randread"\nbs = "4k"\niodepth = 1\ndirect = false\n'
                    '[[job]]\nname = "a"\n')
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "XDG_CACHE_HOME": str(tmp_path),
           "GPUFIO_SCRATCH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "gpufio", "run", str(prof), "-f", "json", "-q"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["jobs"][0]
    assert job["engine_facts"]["loop"] == "python"
    assert job["read"]["total_ios"] == 256
    assert not list(tmp_path.glob("gpufio/native/*.so"))


def test_a_fio_files_hipri_reaches_the_uring_engine_with_fios_submit_batch(tmp_path):
    """fio's hipri (polled completions) on an io_uring job; the submit batch is fio's
    default (1), as fio's own run of the file would have it."""
    path = tmp_path / "p.fio"
    path.write_text("[global]\nioengine=io_uring\nhipri\ndirect=1\n"
                    "[r]\nfilename=/dev/nvme0n1\nrw=randread\nbs=4k\niodepth=8\n")
    (j,) = profile.load(str(path)).jobs
    assert j.engine == "uring" and j.engine_options["hipri"]
    assert uring_engine.Uring.settings(j).iodepth_batch_submit == 1


def test_hipri_is_refused_where_the_target_cannot_poll(shm_pattern_file):
    """A tmpfs file sits on no block device: polled I/O is refused, naming the target."""
    j = from_dict({"global": {"engine": "uring", "targets": [str(shm_pattern_file)],
                              "hipri": True}}, "t.toml", {}).jobs[0]
    fd = os.open(shm_pattern_file, os.O_RDONLY)
    try:
        with pytest.raises(BadInput, match=f"key 'hipri': {shm_pattern_file} cannot be polled: "
                                           "it is not on a block device"):
            uring_engine.Uring.channel(j, [Target(str(shm_pattern_file), fd, 1 << 20, True, 512,
                                                  7)], ChannelSpec(depth=1))
    finally:
        os.close(fd)


@pytest.mark.parametrize("io_poll,refused", [("1", None), ("0", "queue does not poll")])
def test_hipri_follows_the_queue_io_poll_attribute(tmp_path, monkeypatch, pattern_file,
                                                   io_poll, refused):
    disk = tmp_path / "nvme9n1"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue" / "io_poll").write_text(io_poll + "\n")
    monkeypatch.setattr(device, "disk_dir", lambda dev: disk)
    why = device.poll_refusal(str(pattern_file))
    assert why is None if refused is None else refused in why


def test_hipri_needs_o_direct():
    with pytest.raises(BadInput, match="key 'hipri': polled completions need O_DIRECT"):
        from_dict({"global": {"engine": "uring", "targets": ["x"], "hipri": True,
                              "direct": False}}, "t.toml", {})


def test_fio_job_files_may_ask_for_hipri(tmp_path):
    f = tmp_path / "j.fio"
    # fio's default is buffered I/O, which polled completions cannot use: direct=1
    f.write_text("[global]\nioengine=io_uring\nhipri\ndirect=1\nfilename=/dev/nvme0n1\n[a]\n"
                 "rw=randread\n")
    prof = profile.load(str(f))
    assert uring_engine.Uring.settings(prof.jobs[0]).hipri is True


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["engines", "--help"]])
def test_help_imports_only_what_it_needs(argv):
    """``gpufio --help`` must start fast: no NumPy, no Rich tables, no CuPy, no profile
    loader, runner or workloads behind it."""
    code = ("import sys\nfrom gpufio.cli import app\ntry:\n    app(%r)\nexcept SystemExit:\n"
            "    pass\nprint(' '.join(sorted(sys.modules)))" % argv)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    loaded = set(out.stdout.splitlines()[-1].split())
    heavy = {"numpy", "cupy", "rich.table", "tabulate", "gpufio.profile",
             "gpufio.workloads.block.runner", "gpufio.workloads", "gpufio.engines",
             "gpufio.results.render"}
    assert loaded & heavy == set()
    assert "gpufio.cli" in loaded


def test_gpu_uring_runs_one_sqpoll_thread_per_drive(pattern_file, shm_pattern_file):
    """By default a drive gets one SQPOLL thread for all its rings (more would only spin);
    RAM-backed targets keep one per ring; sq_threads still decides when given."""
    def threads(path, **opts):
        j = from_dict({"global": {"engine": "gpu-uring", "targets": [str(path)], "rings": 8,
                                  **opts}}, "t.toml", {}).jobs[0]
        return j.engine_settings.sq_threads

    if storage.ram_backing(str(pattern_file)):
        pytest.skip("the temporary directory is RAM-backed here")
    assert threads(pattern_file) == 1
    assert threads(shm_pattern_file) == 8
    assert threads(pattern_file, sq_threads=4) == 4
