"""The bam engine's host side in the NVMe rig (QEMU's emulated controllers, the emulated
IOMMU on): bring-up over vfio-pci, identify, queue pairs, PRP lists, reads and writes from
the CPU stand-in, teardown and the nvme driver's namespace afterwards (tests/bam_guest.py);
then gpufio's own jobs on the CPU stand-in, the engine's channel: block jobs in the block
loop and a GNN job whose feature rows the gather reads from a namespace. Each group is one
batch of the rig's warm interpreter, TCG being slow."""

from __future__ import annotations

import json

import pytest

from rig import Py, Sh

pytestmark = pytest.mark.nvme


@pytest.fixture(scope="module")
def host_side(nvme_rig) -> dict:
    """What tests/bam_guest.py saw on rig-gen5 (512-byte blocks). Not rig-gen4: the nvme
    tests read its poll queues later in the same guest, and in the full run a controller
    handed back to nvme had none."""
    modprobe, res = nvme_rig.batch(Sh("modprobe vfio-pci"), Py("tests/bam_guest.py", ("rig-gen5",)),
                                   timeout=900)
    assert modprobe.returncode == 0 and res.returncode == 0, modprobe.stderr + res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_bring_up_identifies_the_controller(host_side: dict) -> None:
    assert host_side["driver_during"] == "vfio-pci"
    assert host_side["block_device_during"] is False
    assert host_side["serial"] == "rig-gen5"
    assert host_side["ns"] == {"1": {"blocks": 2 * 1024 * 1024, "lba_bytes": 512}}
    assert [p[:2] for p in host_side["pairs"]] == [[1, 64], [2, 64]]


def test_prp_list_read_and_two_page_write(host_side: dict) -> None:
    assert host_side["prp_entries"] == 4
    assert host_side["read_status"] == 0 and host_side["read_ok"]
    assert host_side["write_status"] == 0
    # LBA Out of Range (generic status 0x80)
    assert host_side["past_end_status"] == 0x80


def test_given_back_to_nvme_and_reads(host_side: dict) -> None:
    assert host_side["driver_after"] == "nvme"
    assert host_side["write_read_back"] is True
    assert "no such PCI device" in host_side["refuse_missing"]


def _profile(path, ns: str, **job) -> str:
    """A one-job profile on namespace ``ns``."""
    lines = ["[[job]]", f'targets = ["{ns}"]', 'size = "16m"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in job.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# the GNN job's feature table: generated rows laid onto the namespace past the block jobs'
# 16 MiB, read back through bam as feature_file (512-byte rows: whole logical blocks)
GNN = {"nodes": 4096, "feature_dim": 128, "randseed": 7, "feature_offset": 32 << 20}
LAY_FEATURES = r"""
import os, sys
import numpy as np
from gpufio.workloads.gnn import features

ns, nodes, dim, seed, at = sys.argv[1], *map(int, sys.argv[2:])
rows = features.values(seed, np.arange(nodes), dim)
fd = os.open(ns, os.O_WRONLY)
os.pwrite(fd, rows.tobytes(), at)
os.fsync(fd)
os.close(fd)
"""


def _gnn_profile(path, ns: str, d) -> str:
    """A GNN job on the CPU (device = "cpu") reading its rows from namespace ``ns``."""
    g = GNN
    path.write_text(
        f'[[job]]\nname = "gnn"\nworkload = "gnn"\nengine = "bam"\ndevice = "cpu"\n'
        f'feature_file = ["{ns}"]\nfeature_offset = {g["feature_offset"]}\n'
        f'nodes = {g["nodes"]}\nfeature_dim = {g["feature_dim"]}\nrandseed = {g["randseed"]}\n'
        f'avg_degree = 4\nbatch_size = 32\nfanout = [4, 2]\nhidden = 16\niterations = 3\n'
        f'warmup = 1\nverify_rows = 64\ndirectory = "{d}"\n')
    return str(path)


@pytest.fixture(scope="module")
def engine_runs(nvme_rig, tmp_path_factory) -> list:
    """gpufio's CLI in the guest, in one interpreter: a pattern laid out by psync, bam block
    jobs verified against it, a write refused, a write behind the guard (with fsync = N and
    end_fsync: NVMe Flushes), doctor, and a GNN job whose rows come from the namespace."""
    d = tmp_path_factory.mktemp("bam-jobs")
    ns = nvme_rig.namespace("rig-gen5", 1)
    run = ["run", "-q", "-f", "json"]
    (d / "lay_features.py").write_text(LAY_FEATURES)
    modprobe, *runs = nvme_rig.batch(
        Sh("modprobe vfio-pci"),
        [*run, _profile(d / "lay.toml", ns, name="lay", engine="psync", rw="write", bs="1m",
                        write_device=ns)],
        [*run, _profile(d / "rr.toml", ns, name="rr", engine="bam", rw="randread", bs="4k",
                        iodepth=16, numjobs=2, io_size="2m", verify=True)],
        [*run, _profile(d / "seq.toml", ns, name="seq", engine="bam", rw="read", bs="16k",
                        iodepth=4, io_size="2m", verify=True)],
        [*run, _profile(d / "w0.toml", ns, name="w0", engine="bam", rw="write", bs="8k")],
        [*run, _profile(d / "w1.toml", ns, name="w1", engine="bam", rw="randwrite", bs="8k",
                        iodepth=8, io_size="1m", verify=True, write_device=ns, fsync=32,
                        end_fsync=True)],
        ["doctor"],
        Py(str(d / "lay_features.py"), (ns, str(GNN["nodes"]), str(GNN["feature_dim"]),
                                        str(GNN["randseed"]), str(GNN["feature_offset"]))),
        [*run, _gnn_profile(d / "gnn.toml", ns, d)],
        Sh(f"test -b {ns}"), timeout=2400)
    assert modprobe.returncode == 0, modprobe.stderr
    return runs


def _job(res) -> dict:
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["jobs"][0]


def test_bam_block_jobs_verify(engine_runs: list) -> None:
    assert engine_runs[0].returncode == 0, engine_runs[0].stderr
    for res, ios in ((engine_runs[1], 1024), (engine_runs[2], 128)):
        job = _job(res)
        assert job["engine_facts"]["submitter"] == "cpu-stand-in"
        assert job["read"]["total_ios"] == ios
        assert job["error"] == 0 and not job["failure"]


def test_bam_write_needs_the_guard_and_verifies(engine_runs: list) -> None:
    refused = engine_runs[3]
    assert refused.returncode == 2
    assert "write_device" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    job = _job(engine_runs[4])
    assert job["write"]["total_ios"] == 128 and job["error"] == 0 and not job["failure"]


def test_doctor_names_the_controllers(engine_runs: list) -> None:
    out = engine_runs[5].stdout
    assert "vfio-pci" in out and "IOMMU groups" in out and "can be taken" in out


def test_bam_flushes_for_fsync_and_end_fsync(engine_runs: list) -> None:
    # 128 writes, a Flush after every 32 (fio's fsync = 32) and one at the end
    assert _job(engine_runs[4])["sync"]["total_ios"] == 128 // 32 + 1


def test_gnn_rows_come_through_the_cpu_stand_in_and_verify(engine_runs: list) -> None:
    lay, gnn, still = engine_runs[6:9]
    assert lay.returncode == 0, lay.stderr
    job = _job(gnn)
    assert job["engine_mode"] == "cpu-stand-in" and job["fetch"]["submitter"] == "cpu-stand-in"
    assert job["fetch"]["buffers"] == "bounced"  # the gather's landing rows are its own
    assert job["iterations_done"] == 3 and job["aggregation"]["rows"] > 0
    assert job["verify"] == {"rows_checked": 3 * 64, "mismatches": 0}
    assert job["error"] == 0 and not job.get("failure")
    # given back under the same name: the gather held no descriptor of the namespace
    assert still.returncode == 0


# the runner is a process of its own, forked from this script (itself forked from the rig's
# warm interpreter, so no Python start-up), as a user's `gpufio run` is one
KILL = r"""
import os, re, signal, subprocess, sys, time
from pathlib import Path
from gpufio import cli

ns, d = sys.argv[1], Path(sys.argv[2])
pci = Path(os.path.realpath(f"/sys/block/{os.path.basename(ns)}/device/device"))


def waitfor(what, cond):  # a condition, checked for 120 s at most; what went on, when not
    deadline = time.monotonic() + 120
    while not cond():
        if time.monotonic() > deadline:
            log = d / "long.out"
            sys.exit(f"timed out: {what}; {log.read_text() if log.exists() else ''}")
        time.sleep(0.05)


def driver():  # the link goes and comes while the guardian rebinds: read it once
    try:
        return os.path.basename(os.readlink(pci / "driver"))
    except OSError:
        return ""


def first_namespace():
    for c in sorted((pci / "nvme").glob("nvme*")):
        for n in sorted(c.iterdir()):
            if re.fullmatch(r"nvme\d+n1", n.name) and os.path.exists(f"/dev/{n.name}"):
                return f"/dev/{n.name}"
    return None


def namespace():  # the controller's first namespace, once the nvme driver has it again
    waitfor("a namespace from the nvme driver", first_namespace)
    return first_namespace()


def holds_vfio(pid):
    try:
        return any("/dev/vfio/" in os.readlink(f"/proc/{pid}/fd/{fd}")
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def start():  # a long bam job on it; returns once it holds the controller
    (d / "long.toml").write_text(
        '[[job]]\nname = "long"\nengine = "bam"\nrw = "randread"\nbs = "4k"\n'
        f'time_based = true\nruntime = "600s"\ntargets = ["{namespace()}"]\n')
    pid = os.fork()
    if pid == 0:
        log = os.open(d / "long.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1), os.dup2(log, 2)
        sys.argv = ["gpufio", "run", "-q", str(d / "long.toml")]
        code = 1
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    waitfor("the runner holding /dev/vfio", lambda: holds_vfio(pid))
    print("taken" if driver() == "vfio-pci" else f"not taken: {driver()}", flush=True)
    return pid


pid = start()
os.kill(pid, signal.SIGTERM)
os.waitpid(pid, 0)
print("sigterm: given back" if driver() == "nvme" else f"sigterm: {driver()}", flush=True)
pid = start()
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
waitfor("the nvme driver back", lambda: driver() == "nvme")
print("kill -9: given back", flush=True)
read = subprocess.run(["dd", f"if={namespace()}", "of=/dev/null", "bs=4096", "count=1",
                       "iflag=direct"], capture_output=True)
print("reads" if read.returncode == 0 else f"no read: {read.stderr}", flush=True)
"""


def test_sigterm_and_kill_9_of_the_runner_give_the_controller_back(nvme_rig, tmp_path) -> None:
    ns = nvme_rig.namespace("rig-4k", 1)
    (tmp_path / "kill.py").write_text(KILL)
    modprobe, res = nvme_rig.batch(Sh("modprobe vfio-pci"),
                                   Py(str(tmp_path / "kill.py"), (ns, str(tmp_path))), timeout=600)
    assert modprobe.returncode == 0, modprobe.stderr
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split("\n")[:4] == ["taken", "sigterm: given back", "taken",
                                          "kill -9: given back"]
    assert "reads" in res.stdout
