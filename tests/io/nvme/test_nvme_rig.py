"""The NVMe rig itself (tests/rig.py): its command line to the guest and the controllers the
guest shows, so a failing NVMe test is never the rig's fault unnoticed."""

import subprocess
import sys

import pytest

from rig import REPO, Py, Sh

pytestmark = pytest.mark.nvme


def test_run_gives_status_output_cwd_and_interpreter(nvme_rig, tmp_path):
    (tmp_path / "from-host").write_text("host\n")
    res = nvme_rig.run(f"pwd; python3 -c 'import sys; print(sys.executable)'; "
                       f"cat {tmp_path}/from-host; echo oops >&2; "
                       f"echo guest > {tmp_path}/from-guest; exit 3")
    assert res.returncode == 3
    assert res.stdout.split() == [str(REPO), sys.executable, "host"]
    assert res.stderr == "oops\n"
    assert (tmp_path / "from-guest").read_text() == "guest\n"
    with pytest.raises(subprocess.TimeoutExpired):
        nvme_rig.run("sleep 30", timeout=1)
    assert nvme_rig.run("true").returncode == 0  # the rig answers after a timeout


def test_batch_runs_each_step_as_a_process_of_its_own(nvme_rig, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nsys.exit(4)\n")
    sh, py, cli = nvme_rig.batch(Sh("echo out; echo err >&2; exit 3"), Py(str(script), ("a",)),
                                 ["--help"])
    assert (sh.returncode, sh.stdout, sh.stderr) == (3, "out\n", "err\n")
    assert (py.returncode, py.stdout, py.stderr) == (4, "['a']\n", "")
    assert cli.returncode == 0 and "Usage" in cli.stdout
    slow, later = nvme_rig.batch(Sh("sleep 30"), Sh("echo never"), timeout=1)
    assert (slow.returncode, later.returncode, later.stdout) == (124, 124, "")
    assert nvme_rig.batch(Sh("echo again"))[0].stdout == "again\n"  # it serves after that


def test_controllers_and_namespaces(nvme_rig):
    gen4, gen5 = nvme_rig.namespace("rig-gen4", 1), nvme_rig.namespace("rig-gen5", 1)
    assert (gen4, gen5) == ("/dev/nvme0n1", "/dev/nvme1n1")  # as profiles/gen4-vs-gen5.toml
    assert nvme_rig.generic("rig-gen4", 1) == "/dev/ng0n1"
    k4 = nvme_rig.namespace("rig-4k", 1)
    heads = [nvme_rig.namespace("rig-mp", n) for n in (1, 2)]
    assert len(set(heads)) == 2 and len(nvme_rig.controller_names("rig-mp")) == 2
    name = k4.removeprefix("/dev/")
    x, z = heads[0].removeprefix("/dev/nvme").split("n")
    res = nvme_rig.run(f"cat /sys/block/{name}/queue/logical_block_size; "
                       f"ls -d /sys/block/nvme{x}c*n{z} | wc -l; "
                       f"ls /sys/kernel/iommu_groups | wc -l; "
                       f"for d in {gen4} {gen5} {k4} {' '.join(heads)}; do "
                       f"echo $(($(blockdev --getsize64 $d) >> 20)); done")
    lbs, paths, groups, *mib = res.stdout.split()
    assert (lbs, paths) == ("4096", "2") and int(groups) > 0
    assert mib == ["1024", "1024", "256", "256", "256"]
    with pytest.raises(KeyError, match="rig-none"):
        nvme_rig.namespace("rig-none", 1)

