"""uring-cmd on the CPU, without an NVMe device: fio job files map onto it, the targets it
refuses (no NVMe namespace, a kernel without passthrough, hipri without poll queues) are one
line each, the generic device is found through sysfs, and doctor says what passthrough needs.
Against real NVMe namespaces it runs in the QEMU rig: tests/engines/test_uring_cmd_rig.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app
from gpufio.core import targets
from gpufio.core.errors import BadInput
from gpufio.core.requests import ChannelSpec
from gpufio.engines import all_engines
from gpufio.facts import nvme_generic
from gpufio.facts.system import Host
from gpufio.io import uring
from gpufio.profile import from_dict

ENGINE = "uring-cmd"
cli = CliRunner()


def job(**opts):
    return from_dict({"global": {"engine": ENGINE, "targets": ["/dev/ng0n1"], **opts}},
                     "p.toml", {}).jobs[0]


def test_fio_io_uring_cmd_files_map_to_it(tmp_path):
    path = tmp_path / "pt.fio"
    path.write_text("[global]\nioengine=io_uring_cmd\ncmd_type=nvme\nhipri\nfixedbufs\n"
                    "[r]\nfilename=/dev/ng0n1\nrw=randread\nbs=4k\niodepth=32\n")
    (j,) = profile.load(str(path)).jobs
    assert (j.engine, j.targets, j.iodepth) == (ENGINE, ("/dev/ng0n1",), 32)
    assert j.engine_options["hipri"] and j.engine_options["fixedbufs"]
    path.write_text("[r]\nioengine=io_uring_cmd\ncmd_type=bsg\nfilename=/dev/ng0n1\n")
    with pytest.raises(BadInput, match=r"line 3 \[r\]: cmd_type=bsg is not supported "
                                       r"\(only cmd_type=nvme\)"):
        profile.load(str(path))


def test_settings_it_cannot_honour_are_refused():
    cls = all_engines()[ENGINE]
    with pytest.raises(BadInput, match="fsync/fdatasync sync nothing"):
        cls.check_job(job(rw="write", fsync=4))
    with pytest.raises(BadInput, match="hipri and sqpoll together"):
        cls.check_job(job(hipri=True, sqpoll=True))
    assert cls.generic_targets(job()) and not all_engines()["uring"].generic_targets(job())


def test_a_kernel_without_passthrough_is_one_line(tmp_path, monkeypatch):
    reason = "io_uring SQE128/CQE32 (NVMe passthrough) needs Linux >= 5.19 (this kernel is 5.15)"
    monkeypatch.setattr(uring, "probe", lambda: {"available": True, "big": False,
                                                 "big_reason": reason})
    p = tmp_path / "p.toml"
    p.write_text(f'[global]\nengine = "{ENGINE}"\ntargets = ["/dev/null"]\n[[job]]\nname = "x"\n')
    res = cli.invoke(app, ["run", str(p), "-q"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [
        f"gpufio: error: job 'x': engine '{ENGINE}' cannot run here: {reason}"]


def test_targets_that_are_no_nvme_namespace_are_one_line(tmp_path):
    f = tmp_path / "f.dat"
    f.write_bytes(b"\0" * 4096)
    for path, what in (("/dev/null", "is not an NVMe namespace"), (str(f), "is not an NVMe "
                       "namespace"), (str(tmp_path / "none"), "does not exist")):
        with pytest.raises(BadInput, match=f"target {path}: {what}; NVMe passthrough needs a "
                                           "namespace's generic char device"):
            targets.open_target(path, direct=True, generic=True)


def _fake_namespace(root: Path, poll: str = "0") -> tuple[str, Path]:
    """A char node /dev/ng0n1 (the numbers of /dev/null) and the sysfs of its namespace."""
    dev, sys = root / "dev", root / "sys"
    dev.mkdir()
    try:
        os.mknod(dev / "ng0n1", 0o600 | 0o020000, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")
    files = {"class/nvme-generic/ng0n1/dev": "1:3", "block/nvme0n1/dev": "259:0",
             "block/nvme0n1/nsid": "3", "block/nvme0n1/size": "2048",
             "block/nvme0n1/queue/logical_block_size": "4096",
             "block/nvme0n1/queue/io_poll": poll, "block/nvme0n1/queue/max_hw_sectors_kb": "512"}
    for rel, text in files.items():
        (sys / rel).parent.mkdir(parents=True, exist_ok=True)
        (sys / rel).write_text(text + "\n")
    return str(dev / "ng0n1"), sys


def test_a_generic_device_is_found_through_sysfs(tmp_path):
    node, sys = _fake_namespace(tmp_path)
    ns = nvme_generic.lookup(node, sys)
    assert ns == nvme_generic.Namespace(
        generic=node, block=str(tmp_path / "dev/nvme0n1"), nsid=3, lba_bytes=4096,
        size=2048 * 512, poll_queues=False, max_bytes=512 << 10)
    (sys / "class/nvme-generic/ng0n1/dev").write_text("1:5\n")  # another device's numbers
    assert nvme_generic.lookup(node, sys) is None
    assert nvme_generic.lookup("/dev/null", sys) is None
    assert nvme_generic.generic_devices(str(tmp_path / "dev")) == [node]


def test_hipri_without_poll_queues_is_refused_before_any_io(tmp_path):
    t = targets.Target(path="/dev/ng0n1", fd=-1, size=1 << 20, is_block=True, dio_align=4096,
                       pattern_seed=None, facts={"poll_queues": False, "nsid": 1,
                                                 "namespace": "/dev/nvme0n1"}, lba=4096)
    with pytest.raises(BadInput, match="target /dev/ng0n1: hipri needs poll queues, and "
                                       "/dev/nvme0n1 has none"):
        all_engines()[ENGINE].channel(job(hipri=True), [t], ChannelSpec(depth=1))


def test_whole_blocks_and_one_commands_worth_per_io():
    t = targets.Target(path="/dev/ng0n1", fd=-1, size=1 << 20, is_block=True, dio_align=4096,
                       pattern_seed=None, facts={"max_transfer": 128 << 10}, lba=4096)
    with pytest.raises(BadInput, match="bs 512 is not a multiple of its namespace's logical "
                                       "block size 4096"):
        targets.check_region(t, offset=0, size=None, bs=512, direct=False, need_pattern=False)
    with pytest.raises(BadInput, match="offset 512 is not a multiple"):
        targets.check_region(t, offset=512, size=None, bs=4096, direct=False, need_pattern=False)
    with pytest.raises(BadInput, match="bs 262144 is more than one NVMe command"):
        targets.check_region(t, offset=0, size=None, bs=256 << 10, direct=False,
                             need_pattern=False)
    assert targets.check_region(t, offset=0, size=None, bs=8192, direct=False,
                                need_pattern=False) == (0, 128)


def test_doctor_says_whether_passthrough_can_run(tmp_path):
    def host(release: str, devices: tuple[str, ...]) -> Host:
        root = tmp_path / release
        (root / "proc/sys/kernel").mkdir(parents=True)
        (root / "proc/sys/kernel/osrelease").write_text(release)
        (root / "dev").mkdir()
        for d in devices:
            (root / "dev" / d).write_text("")
        return Host(str(root), env={})

    cls = all_engines()[ENGINE]
    old = {c.name: c for c in cls.doctor(host("5.15.0", ()), [])}
    assert old["passthrough kernel"].status == "fail" and "5.19" in old["passthrough kernel"].fix
    assert old["generic devices"].status == "warn" and "passthrough permission" not in old
    new = {c.name: c for c in cls.doctor(host("6.8.0", ("ng0n1", "ng1n2", "nvme0n1")),
                                         [job(hipri=True)])}
    assert new["passthrough kernel"].status == "ok"
    assert new["generic devices"].found.endswith("dev/ng0n1, " + str(tmp_path / "6.8.0/dev/ng1n2"))
    assert new["passthrough permission"].status == "ok"  # readable, and 6.8 needs no root
    assert new["polled passthrough"].status == "ok"
    gpu = {c.name: c for c in all_engines()["gpu-uring"].doctor(
        host("6.9.0", ("ng0n1",)), [from_dict({"global": {"engine": "gpu-uring",
                                                          "passthrough": True}}, "p", {}).jobs[0]])}
    assert gpu["passthrough kernel"].area == "gpu-uring passthrough"
