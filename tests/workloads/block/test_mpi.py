"""MPI runs: ranks' documents merge exactly (counts summed, histograms added, percentiles of
the union), targets are shared out per rank, and `mpirun -n N gpufio run` reports one merged
document; a rank that fails, hangs or loses a worker ends the run with exit 1 naming the
rank, within 30 s, and no process is left behind."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core.job import Profile
from gpufio.core.stats import LatencyStats
from gpufio.profile import from_dict
from gpufio.workloads.block.world import World
from gpufio.workloads.block.document import hist_bins, rw_block
from gpufio.workloads.block.merge import merge_ranks

from checkout import REPO


def _mpirun() -> str | None:
    """The launcher of the MPI mpi4py runs on: MPICH's from the 'mpi' extra beside this
    Python, else the first on PATH; None without mpi4py."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


MPIRUN = _mpirun()
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="no mpi4py and mpirun here "
                               "(pip install 'gpufio[mpi]')")
cli = CliRunner()


@pytest.fixture(autouse=True)
def no_mpich_segments_left():
    """A run that ends in MPI_Abort (a failed, hung or killed rank) leaves MPICH's shared
    memory segment in /dev/shm; remove the ones these tests made, or every CI run on a
    long-lived machine would leave a few MB more."""
    shm = Path("/dev/shm")
    before = set(shm.glob("mpich_shm_*"))
    yield
    for seg in set(shm.glob("mpich_shm_*")) - before:
        seg.unlink(missing_ok=True)


def rank_doc(rank: int, host: str, lats: np.ndarray, runtime_ns: int = 2_000_000_000) -> dict:
    """A rank's one-job document holding ``lats`` as its reads."""
    lat = LatencyStats()
    lat.add(lats)
    read = rw_block(len(lats), 4096 * len(lats), runtime_ns, 0, lat, (50.0, 99.0, 99.9))
    write = rw_block(0, 0, runtime_ns, 0, LatencyStats(), (50.0, 99.0, 99.9))
    return {"gpufio version": "t", "host": {"host": host}, "interrupted": False,
            "rank": {"rank": rank, "local_rank": rank % 2, "host": host, "gate_wait_ns": 5,
                     "job_starts_ns": {"j": 1_000_000 * rank}},
            "jobs": [{"jobname": "j", "engine": "uring", "error": 0, "read": read, "write": write,
                      "sync": {"total_ios": 0, "seconds": 0.0, "lat_ns": {"mean": 0.0}},
                      "usr_cpu": 10.0, "sys_cpu": 5.0, "cpu_us_per_io": 1.0,
                      "resolved options": {"percentile_list": [50.0, 99.0, 99.9]},
                      "targets": [{"path": f"/t{rank}"}], "workers": [{"worker": 0}],
                      "errors": [], "verify": {"enabled": False, "failures": 0, "bad_offsets": []},
                      "samples": [{"t_ms": 500.0 * i, "iops": 10.0 + rank, "bw_bytes": 1.0}
                                  for i in range(3 + rank)],
                      "lat_hist": {"layout": "x", "bins": hist_bins(lat)},
                      "interrupted": False, "failure": None}]}


def test_merged_totals_are_sums_and_percentiles_those_of_all_samples():
    rng = np.random.default_rng(5)
    lats = [rng.lognormal(10 + r, 0.5, 1000 + 300 * r).astype(np.int64) for r in range(4)]
    docs = [rank_doc(r, "a" if r < 2 else "b", lats[r]) for r in range(4)]
    job = merge_ranks(docs)["jobs"][0]
    every = np.concatenate(lats)
    union = LatencyStats()
    union.add(every)
    assert job["read"]["total_ios"] == len(every) == sum(len(x) for x in lats)
    assert job["read"]["io_bytes"] == 4096 * len(every)
    assert job["read"]["iops"] == pytest.approx(len(every) / 2.0)
    want = union.percentiles((50.0, 99.0, 99.9))
    got = job["read"]["lat_ns"]["percentile"]
    assert [got["50.000000"], got["99.000000"], got["99.900000"]] == [want[50.0], want[99.0],
                                                                      want[99.9]]
    assert job["read"]["lat_ns"]["mean"] == pytest.approx(every.mean())
    assert job["read"]["lat_ns"]["stddev"] == pytest.approx(every.std(ddof=1), rel=1e-9)
    assert (job["read"]["lat_ns"]["min"], job["read"]["lat_ns"]["max"]) == (every.min(), every.max())
    assert [r["read"]["total_ios"] for r in job["mpi"]["ranks"]] == [len(x) for x in lats]
    assert [(h["host"], h["ranks"], h["read"]["total_ios"]) for h in job["mpi"]["hosts"]] == [
        ("a", 2, len(lats[0]) + len(lats[1])), ("b", 2, len(lats[2]) + len(lats[3]))]
    assert len(job["samples"]) == 3 and job["samples"][0]["iops"] == 10 + 11 + 12 + 13
    assert job["mpi"]["start_skew_ns"] == 3_000_000
    assert job["cpu_us_per_io"] == pytest.approx(1e6 * 4 * 0.15 * 2.0 / len(every))
    assert [t["rank"] for t in job["targets"]] == [0, 1, 2, 3]


def test_coordination_adds_the_gate_the_skew_the_messages_and_the_merge():
    docs = [rank_doc(r, "a", np.full(10, 1000)) for r in range(3)]
    docs[0]["rank"].update(gate_open_ns=2_000_000, recv_ns=1_000_000)
    mpi = merge_ranks(docs)["mpi"]
    # skew: the ranks' gates opened at 0, 1 and 2 ms
    assert mpi["coordination_ns"] == 2_000_000 + 2_000_000 + 1_000_000 + mpi["merge_ns"]
    assert mpi["coordination_share"] == pytest.approx(mpi["coordination_ns"] / 2e9)


def test_merging_64_ranks_takes_under_a_second():
    rng = np.random.default_rng(1)
    docs = [rank_doc(r, f"h{r // 8}", rng.integers(1000, 10**7, 5000)) for r in range(64)]
    t0 = time.perf_counter()
    doc = merge_ranks(docs)
    assert time.perf_counter() - t0 < 1.0  # the bound set for the merge itself
    assert doc["mpi"]["size"] == 64 and len(doc["mpi"]["hosts"]) == 8
    assert doc["jobs"][0]["read"]["total_ios"] == 64 * 5000


def world(rank, size=4, local_size=2, host="n1"):
    return World(None, rank, size, rank % local_size, local_size, host)


def test_targets_are_templated_or_shared_out_per_rank():
    w = world(3)
    assert w.share(("/mnt/nvme{local_rank}/d", "/x/{host}-{rank}")) == ("/mnt/nvme1/d", "/x/n1-3")
    assert w.share(("/a", "/b", "/c", "/d")) == ("/b", "/d")  # every local_size-th
    assert w.share(("/a", "/b", "/c")) == ("/a", "/b", "/c")  # cannot be split: shared
    prof = from_dict({"global": {"targets": ["/t{rank}"], "gpus": [0, 1, 2], "randseed": 7}},
                     "p.toml", {})
    job = world(3).profile_for(Profile(prof.path, prof.jobs, False)).jobs[0]
    assert job.targets == ("/t3",) and job.gpu == 1 and job.gpus == () and job.randseed == 10


PROFILE = """[global]
size = "4m"
runtime = "{runtime}"
time_based = true
sample_interval = "200ms"
targets = ["{d}/t{{rank}}.dat"]
[[job]]
name = "rr"
engine = "uring"
iodepth = 4
"""


def mpirun(tmp_path, n, text, *args, timeout_s="5"):
    prof = tmp_path / "p.toml"
    prof.write_text(text)
    env = dict(os.environ, GPUFIO_MPI_TIMEOUT_S=timeout_s)
    return subprocess.Popen([MPIRUN, "-n", str(n), sys.executable, "-m", "gpufio", "run", str(prof),
                             "-q", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(p, timeout_s):
    """``p.communicate`` within ``timeout_s``; past it, the launcher and its ranks (its
    session) are killed before the failure, so that no rank outlives the test."""
    try:
        return p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise


def none_left(tmp_path, within_s=10.0):
    """True once no process of the run is left (the launcher's kills take a moment)."""
    deadline = time.monotonic() + within_s
    while gpufio_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return gpufio_processes(tmp_path) == []


def gpufio_processes(tmp_path):
    """PIDs of gpufio processes running this test's profile: ranks and their workers."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if str(tmp_path / "p.toml").encode() in cmd and b"mpirun" not in cmd and b"hydra" not in cmd:
            found.append(int(pid))
    return sorted(found)


@needs_mpi
def test_mpirun_merges_every_rank(tmp_path):
    p = mpirun(tmp_path, 3, PROFILE.format(runtime="1s", d=tmp_path), "-f", "json")
    out, err = finish(p, 120)
    assert p.returncode == 0, err
    doc = json.loads(out)
    job = doc["jobs"][0]
    ranks = job["mpi"]["ranks"]
    assert doc["mpi"]["size"] == 3 and [r["rank"] for r in ranks] == [0, 1, 2]
    assert job["read"]["total_ios"] == sum(r["read"]["total_ios"] for r in ranks) > 0
    assert sorted(t["path"] for t in job["targets"]) == [str(tmp_path / f"t{r}.dat") for r in range(3)]
    assert job["mpi"]["start_skew_ns"] >= 0 and doc["mpi"]["merge_ns"] > 0
    assert all(r["gate_wait_ns"] >= 0 for r in doc["mpi"]["ranks"])
    assert doc["mpi"]["coordination_ns"] >= doc["mpi"]["merge_ns"]
    assert 0 < doc["mpi"]["coordination_share"] < 1
    res = cli.invoke(app, ["compare", *(2 * [str(_saved(tmp_path, out))]), "-f", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["rows"]


def _saved(tmp_path, text):
    path = tmp_path / "merged.json"
    path.write_text(text)
    return path


@needs_mpi
def test_a_rank_that_fails_ends_the_run_naming_it(tmp_path):
    (tmp_path / "d0").mkdir()
    (tmp_path / "d1").mkdir()
    text = PROFILE.format(runtime="1s", d=tmp_path).replace("t{rank}.dat", "d{rank}/t.dat")
    t0 = time.monotonic()
    p = mpirun(tmp_path, 3, text)
    _, err = finish(p, 60)
    assert p.returncode == 1 and time.monotonic() - t0 < 30
    assert "gpufio: error: rank 2 (" in err and f"{tmp_path}/d2 does not exist" in err
    assert none_left(tmp_path)


def _signal_after_start(tmp_path, p, pick, sig):
    """Send ``sig`` to one of the run's processes once the job is under way."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        procs = gpufio_processes(tmp_path)
        if len(procs) >= 6:  # three ranks, each with its worker: the job is running
            break
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(pick(procs), sig)


@needs_mpi
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["hung", "killed"])
def test_a_worker_that_hangs_or_dies_ends_the_run_naming_its_rank(tmp_path, sig):
    p = mpirun(tmp_path, 3, PROFILE.format(runtime="4s", d=tmp_path))
    t0 = time.monotonic()
    _signal_after_start(tmp_path, p, lambda procs: procs[-1], sig)  # the last-forked worker
    out, err = finish(p, 60)
    err += out  # a table on stdout carries the job's problem lines
    assert p.returncode == 1 and time.monotonic() - t0 < 30, err
    # a hung worker stalls its rank: rank 0 names it after 5 s, or, when it is rank 0's own,
    # the others name rank 0 after twice that
    assert (re.search(r"nothing for (5|10) s", err) if sig == signal.SIGSTOP
            else "died" in err), err
    assert "rank " in err
    assert none_left(tmp_path)


@needs_mpi
def test_a_rank_killed_outright_is_ended_by_the_launcher(tmp_path):
    """SIGKILL of a rank itself: MPICH's launcher ends every rank at once and names the
    process (exit 9); nothing is left running."""
    p = mpirun(tmp_path, 3, PROFILE.format(runtime="4s", d=tmp_path))
    t0 = time.monotonic()
    _signal_after_start(tmp_path, p, lambda procs: procs[1], signal.SIGKILL)
    out, err = finish(p, 60)
    assert p.returncode != 0 and time.monotonic() - t0 < 30
    assert "BAD TERMINATION" in out + err
    assert none_left(tmp_path)


@needs_mpi
def test_sigterm_to_the_launcher_stops_every_rank_and_keeps_the_merged_results(tmp_path):
    """scancel and Slurm's time limit send SIGTERM: mpiexec passes it to the ranks, which stop
    as at Ctrl-C, and rank 0 still writes the merged document of what they measured."""
    p = mpirun(tmp_path, 3, PROFILE.format(runtime="60s", d=tmp_path), "-f", "json")
    t0 = time.monotonic()
    _signal_after_start(tmp_path, p, lambda procs: p.pid, signal.SIGTERM)
    out, err = finish(p, 60)
    assert p.returncode != 0 and time.monotonic() - t0 < 30, err
    doc = json.loads(out)
    (job,) = doc["jobs"]
    assert doc["interrupted"] and job["interrupted"]
    assert job["read"]["total_ios"] == sum(r["read"]["total_ios"] for r in job["mpi"]["ranks"]) > 0
    assert "interrupted; results so far were written" in err
    assert none_left(tmp_path)


@needs_mpi
def test_workloads_that_run_as_one_process_refuse_mpirun(tmp_path):
    text = (f'[global]\nworkload = "checkpoint"\ndevice = "cpu"\nstate_size = "1m"\n'
            f'engine = "psync"\ntargets = ["{tmp_path}"]\n')
    p = mpirun(tmp_path, 2, text)
    _, err = finish(p, 60)
    assert p.returncode == 2 and "runs as one process" in err


@needs_mpi
def test_repeat_over_ranks_keeps_each_jobs_median_merged_run(tmp_path):
    p = mpirun(tmp_path, 2, PROFILE.format(runtime="300ms", d=tmp_path), "-f", "json",
               "--repeat", "3")
    out, err = finish(p, 120)
    assert p.returncode == 0, err
    job = json.loads(out)["jobs"][0]
    assert job["repeat"]["n"] == 3 and len(job["repeat"]["runs"]) == 3
    assert job["mpi"]["ranks"][1]["rank"] == 1  # each run is the ranks' merge
    assert job["read"]["iops"] in [r["iops"] for r in job["repeat"]["runs"]]


# rank 1 reaches MPI_Init while rank 0 holds back, so rank 1 waits inside MPI's C code
HELD_RANKS = """
import os, sys, time
from pathlib import Path
from gpufio.core.signals import sigterm_as_sigint, take_stop_signals
take_stop_signals(); sigterm_as_sigint()  # the handlers `gpufio run` sets
rank = int(os.environ["PMI_RANK"])
(Path(sys.argv[1]) / f"rank{rank}").write_text(str(os.getpid()))
if rank == 0:
    time.sleep(120)
from gpufio.workloads.block import world
world.detect()
"""


def _sigterm_caught(pid: int) -> bool | None:
    """Whether ``pid`` has a handler for SIGTERM (None once it is gone)."""
    try:
        caught = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigCgt"))
    except OSError:
        return None
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@needs_mpi
def test_a_rank_waiting_in_mpi_init_ends_on_sigterm(tmp_path):
    """A rank whose peers never arrive waits inside MPI_Init (C code, where Python's handlers
    never run): SIGTERM there takes its default action, the rank ends, and the launcher ends
    the rest, instead of a rank spinning on, deaf to SIGTERM."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([MPIRUN, "-n", "2", sys.executable, "-c", HELD_RANKS, str(tmp_path)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int((tmp_path / "rank1").read_text())
        # readiness: rank 1 has let go of its SIGTERM handler, i.e. it is at MPI_Init
        while _sigterm_caught(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sigterm_caught(pid) is False, "rank 1 kept its handler into MPI_Init"
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        finish(p, 60)
        assert p.returncode != 0 and time.monotonic() - t0 < 30
        rank0 = int((tmp_path / "rank0").read_text())
        gone = time.monotonic() + 10  # the launcher ends the held rank too; reaping takes a moment
        while (_sigterm_caught(pid), _sigterm_caught(rank0)) != (None, None) \
                and time.monotonic() < gone:
            time.sleep(0.05)
        assert (_sigterm_caught(pid), _sigterm_caught(rank0)) == (None, None)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def test_a_rank_whose_mpi_init_never_returns_ends_with_where_it_stood(tmp_path):
    """A launcher gone without a signal leaves MPI_Init spinning in C, where no Python
    handler runs: the rank still ends once GPUFIO_MPI_TIMEOUT_S pass, saying where it was.
    (An mpi4py whose MPI module never finishes loading stands in for it.)"""
    fake = tmp_path / "mpi4py"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "MPI.py").write_text("import time\ntime.sleep(600)\n")
    env = dict(os.environ, PMI_RANK="0", PMI_SIZE="2", GPUFIO_MPI_TIMEOUT_S="1",
               PYTHONPATH=f"{tmp_path}:{REPO}")
    p = subprocess.run([sys.executable, "-c",
                        "from gpufio.workloads.block import world; world.detect()"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "Timeout" in p.stderr and "mpi4py/MPI.py" in p.stderr and "detect" in p.stderr
