"""Whether a target's reads reach storage, decided from the target itself (facts/storage),
and what the user sees of it: the warning before the run, the table's status, the result's
``storage`` fact, the refusal of holes without ``allow_unbacked``, doctor, check, compare."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import targets
from gpufio.facts import device, storage
from gpufio.facts.extents import coverage
from gpufio.workloads.block.document import summary_rows

cli = CliRunner()
WARNING = "gpufio: warning: target "


def run_job(write_profile, target: str, **keys) -> tuple[object, dict]:
    """A short random-read job on ``target`` through the CLI: the result, and its document
    (None when it did not run)."""
    keys = {"targets": [target], "runtime": "200ms", "time_based": True, "size": "4m", **keys}
    text = "[global]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    res = cli.invoke(app, ["run", str(write_profile(text)), "-q", "-f", "json"])
    return res, json.loads(res.stdout) if res.exit_code == 0 else None


def status_of(doc: dict) -> str:
    """The status cell the table, CSV and Markdown show for the job."""
    (row,) = summary_rows(doc)
    return row["status"]


def storage_fact(doc: dict) -> dict:
    (t,) = doc["jobs"][0]["targets"]
    return t["storage"]


def warnings(res) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith(WARNING)]


def written_file(path: Path, nbytes: int = 4 << 20) -> Path:
    """A file gpufio lays out: every byte written (and out of the page cache)."""
    targets.create_file(str(path), nbytes, 3)
    return path


def fallocated(path: Path, nbytes: int = 4 << 20) -> Path:
    """A file allocated without being written; skips where the filesystem cannot tell
    unwritten extents (FIEMAP) or fills them with zeros."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)
    cov = coverage(str(path))
    if cov.method != "fiemap" or cov.unwritten != nbytes:
        pytest.skip(f"{path}'s filesystem shows no unwritten extents ({cov})")
    return path


@pytest.fixture
def on_a_drive(tmp_path):
    """tmp_path, where the machine keeps it on a drive (skipped with the reason where not)."""
    found = storage.classify(str(tmp_path))
    if found.kind != storage.DRIVE:
        pytest.skip(f"the tests' temporary directory is not on a drive: {found.reason}")
    return tmp_path


@pytest.fixture
def zram():
    """A fresh zram device of 16 MiB (hot_add), removed afterwards; skipped with the reason
    without root or zram."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a zram device")
    control = Path("/sys/class/zram-control")
    if not control.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    if not (control / "hot_add").exists():
        pytest.skip("no zram here (no /sys/class/zram-control after modprobe zram)")
    n = int((control / "hot_add").read_text())
    sysfs, node = Path(f"/sys/block/zram{n}"), Path(f"/dev/zram{n}")
    try:
        (sysfs / "disksize").write_text(str(16 << 20))
        deadline = time.monotonic() + 30
        while not node.exists():  # devtmpfs makes the node; wait for it, not a fixed time
            if time.monotonic() > deadline:
                pytest.skip(f"{node} did not appear after hot_add")
            time.sleep(0.01)
        yield str(node)
    finally:
        (sysfs / "reset").write_text("1")
        (control / "hot_remove").write_text(str(n))


# --- targets as they come: each named for what it is ---------------------------------------

def test_a_sparse_file_is_refused_unless_allowed_and_then_named_holes(tmp_path, write_profile):
    path = tmp_path / "sparse.dat"
    os.truncate(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), 4 << 20)
    found = storage.classify(str(path))
    assert (found.kind, found.reaches_storage, found.backed) == ("holes", False, 0.0)
    facts = device.path_facts(str(path))  # what 'gpufio info' shows
    assert facts["storage"]["kind"] == "holes" and facts["ram_backed"] is False
    res, _ = run_job(write_profile, str(path))
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
    assert res.stderr.startswith(f"gpufio: error: target {path}: all of bytes 0-4194304 ")
    assert "holes (a sparse file)" in res.stderr and "allow_unbacked = true" in res.stderr
    res, doc = run_job(write_profile, str(path), allow_unbacked=True)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (holes: not storage)"
    assert storage_fact(doc)["kind"] == "holes" and storage_fact(doc)["backed"] == 0.0
    (line,) = warnings(res)
    assert line.startswith(f"{WARNING}{path}: holes, not storage: all of bytes 0-4194304")


def test_a_fallocated_file_is_named_unwritten(tmp_path, write_profile):
    path = fallocated(tmp_path / "falloc.dat")
    found = storage.classify(str(path))
    assert (found.kind, found.reaches_storage) == ("unwritten", False)
    assert "allocated but never written (fallocate)" in found.reason
    res, _ = run_job(write_profile, str(path))
    assert res.exit_code == 2 and "allow_unbacked" in res.stderr
    res, doc = run_job(write_profile, str(path), allow_unbacked=True)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (unwritten: not storage)"
    (line,) = warnings(res)
    assert line.startswith(f"{WARNING}{path}: unwritten, not storage: all of bytes 0-4194304")


def test_only_the_range_the_job_reads_is_judged(tmp_path, write_profile):
    """The first half written, the second a hole: a job on the first half reads a drive."""
    path = tmp_path / "half.dat"
    written_file(path, 4 << 20)
    os.truncate(path, 8 << 20)
    assert storage.classify(str(path), 0, 4 << 20).kind == storage.DRIVE
    half = storage.classify(str(path))
    assert half.kind == "holes" and half.backed == 0.5 and half.reason.startswith("50% of ")
    res, doc = run_job(write_profile, str(path))  # size = 4m: the written half
    assert res.exit_code == 0 and status_of(doc) == "ok" and not warnings(res)
    res, _ = run_job(write_profile, str(path), offset="2m")
    assert res.exit_code == 2 and "50% of bytes 2097152-6291456" in res.stderr


def test_a_written_file_on_the_disk_is_not_flagged(on_a_drive, write_profile):
    path = written_file(on_a_drive / "written.dat")
    res, doc = run_job(write_profile, str(path))
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok" and not warnings(res)
    fact = storage_fact(doc)
    assert fact["kind"] == "drive" and fact["reaches_storage"] is True and fact["backed"] == 1.0
    assert fact["reason"].startswith(f"{path} on ")


def test_a_buffered_job_says_the_page_cache_may_answer(on_a_drive, write_profile):
    path = written_file(on_a_drive / "written.dat")
    res, doc = run_job(write_profile, str(path), direct=False)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (page cache: not storage)"
    assert storage_fact(doc)["reason"].startswith("buffered I/O (direct = 0): the page cache may serve it (")
    assert len(warnings(res)) == 1


def test_a_tmpfs_file_is_named_tmpfs(shm_pattern_file, write_profile):
    found = storage.classify(str(shm_pattern_file))
    assert (found.kind, found.reaches_storage) == ("tmpfs", False)
    assert storage.ram_backing(str(shm_pattern_file)) == "tmpfs"
    res, doc = run_job(write_profile, str(shm_pattern_file), size="1m", direct=False)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (tmpfs: not storage)"
    (line,) = warnings(res)
    assert line == f"{WARNING}{shm_pattern_file}: tmpfs, not storage: {shm_pattern_file} is on " \
                   "tmpfs, in RAM"


def test_zram_is_named_zram(zram, write_profile):
    found = storage.classify(zram)
    assert (found.kind, found.reaches_storage) == ("zram", False)
    res, doc = run_job(write_profile, zram)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (zram: not storage)"
    assert doc["jobs"][0]["targets"][0]["ram_backed"] is True
    (line,) = warnings(res)
    assert line == f"{WARNING}{zram}: zram, not storage: {os.path.basename(zram)} is a RAM " \
                   "disk (zram)"


def test_a_loop_device_without_direct_io_is_the_page_cache(on_a_drive, losetup,
                                                           write_profile):
    backing = written_file(on_a_drive / "backing.img", 8 << 20)
    backing.read_bytes()  # in the page cache now, where the loop device's reads go
    dev = losetup(backing, direct_io=False)
    assert Path(f"/sys/block/{os.path.basename(dev)}/loop/dio").read_text().strip() == "0"
    found = storage.classify(dev)
    assert (found.kind, found.reaches_storage) == ("page cache", False)
    assert found.reason == f"{os.path.basename(dev)} reads {backing} through its page cache " \
                           "(loop/dio = 0)"
    res, doc = run_job(write_profile, dev)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok (page cache: not storage)"
    assert doc["jobs"][0]["targets"][0]["ram_backed"] is False
    assert len(warnings(res)) == 1


def test_a_loop_device_with_direct_io_over_a_written_file_is_a_drive(on_a_drive, losetup,
                                                                    write_profile):
    backing = written_file(on_a_drive / "backing.img", 8 << 20)
    dev = losetup(backing, direct_io=True)
    if Path(f"/sys/block/{os.path.basename(dev)}/loop/dio").read_text().strip() != "1":
        pytest.skip("the kernel kept direct I/O off for this loop device")
    found = storage.classify(dev)
    assert (found.kind, found.reaches_storage) == ("drive", True)
    assert found.reason.startswith(f"{os.path.basename(dev)} over {backing} (loop/dio = 1): "
                                   f"{backing} on ")
    res, doc = run_job(write_profile, dev)
    assert res.exit_code == 0, res.output
    assert status_of(doc) == "ok" and not warnings(res)


def test_a_loop_device_with_direct_io_over_a_sparse_file_has_holes(on_a_drive, losetup,
                                                                  write_profile):
    """The loop device's range is its backing file's, from the byte it maps."""
    backing = on_a_drive / "sparse.img"
    written_file(backing, 4 << 20)
    os.truncate(backing, 8 << 20)
    dev = losetup(backing, direct_io=True)
    assert storage.classify(dev, 0, 4 << 20).reaches_storage is True
    found = storage.classify(dev, 4 << 20, 4 << 20)
    assert (found.kind, found.reaches_storage) == ("holes", False)
    res, _ = run_job(write_profile, dev, offset="4m")
    assert res.exit_code == 2 and f"target {dev}: " in res.stderr and "allow_unbacked" in res.stderr


def test_gpufios_own_layouts_are_written_never_sparse(tmp_path, scratch):
    path = tmp_path / "laid-out.dat"
    targets.create_file(str(path), 3 << 20, 9)
    cov = coverage(str(path))
    assert (cov.written, cov.unwritten, cov.holes) == (3 << 20, 0, 0)
    grown = targets.scratch_path(str(tmp_path), 9)
    targets.ensure_scratch(grown, 1 << 20, 9, quiet=True)
    targets.ensure_scratch(grown, 5 << 20, 9, quiet=True)
    assert coverage(grown).written == 5 << 20


# --- what doctor, check and compare say -------------------------------------------------

def test_doctor_names_the_kind_of_a_target(tmp_path, shm_pattern_file):
    sparse = tmp_path / "sparse.dat"
    os.truncate(os.open(sparse, os.O_WRONLY | os.O_CREAT, 0o644), 1 << 20)
    res = cli.invoke(app, ["doctor", "--target", str(sparse), "-f", "json"])
    (check,) = [c for c in json.loads(res.stdout)["checks"]
                if c["area"] == f"target {sparse}" and c["name"] == "storage"]
    assert check["status"] == "warn" and check["found"].startswith("holes: all of bytes ")
    res = cli.invoke(app, ["doctor", "--target", str(shm_pattern_file), "-f", "json"])
    (check,) = [c for c in json.loads(res.stdout)["checks"] if c["name"] == "storage"]
    assert check["status"] == "warn" and check["found"] == \
        f"tmpfs: {shm_pattern_file} is on tmpfs, in RAM"


def test_check_and_compare_show_a_target_that_is_not_storage(tmp_path, shm_pattern_file,
                                                             write_profile):
    _, doc = run_job(write_profile, str(shm_pattern_file), size="1m", direct=False)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(doc))
    res = cli.invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0 and f"{shm_pattern_file} (tmpfs, tmpfs: not storage)" in res.stdout
    res = cli.invoke(app, ["check", str(a), "--baseline", str(b), "--max-drop", "iops=50%"])
    assert f"gpufio: WARNING: result: target {shm_pattern_file}: tmpfs, not storage: " \
           f"{shm_pattern_file} is on tmpfs, in RAM" in res.stderr
    assert "gpufio: WARNING: baseline: target " in res.stderr


# --- the stacks, on a made-up sysfs ------------------------------------------------------

@pytest.fixture
def on_disk(tmp_path, monkeypatch):
    """classify a file whose ext4 filesystem sits on a made-up sysfs disk directory."""
    path = tmp_path / "t.dat"
    path.write_bytes(b"x" * 4096)
    monkeypatch.setattr(device, "fs_type", lambda dev: ("ext4", "/mnt"))

    def classify_on(disk: Path) -> storage.Storage:
        monkeypatch.setattr(device, "disk_dir", lambda dev: disk)
        return storage.classify(str(path), extents=False)
    return classify_on


def _dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("name,kind,reaches", [
    ("zram0", "zram", False), ("ram3", "brd", False), ("nbd0", "nbd", True),
    ("nvme0n1", "drive", True), ("ramdisk_not", "drive", True)])
def test_disks_are_named_by_their_driver(tmp_path, on_disk, name, kind, reaches):
    found = on_disk(_dir(tmp_path / "sys" / name))
    assert (found.kind, found.reaches_storage) == (kind, reaches)


def test_pmem_from_ram_is_not_storage_real_pmem_is(tmp_path, on_disk):
    emulated = _dir(tmp_path / "sys/e820_pmem/ndbus0/region0/namespace0.0/block/pmem0")
    real = _dir(tmp_path / "sys/ACPI0012:00/ndbus1/region1/namespace1.0/block/pmem1")
    assert on_disk(emulated).kind == "pmem (RAM)" and not on_disk(emulated).reaches_storage
    assert on_disk(real).kind == "pmem" and on_disk(real).reaches_storage


def test_device_mapper_and_md_stacks_are_followed_to_their_members(tmp_path, on_disk):
    sysfs = tmp_path / "sys"
    for name in ("zram0", "nvme0n1", "nvme1n1"):
        _dir(sysfs / name)
    md = _dir(sysfs / "md0" / "slaves")
    for name in ("nvme0n1", "nvme1n1"):
        os.symlink(sysfs / name, md / name)
    found = on_disk(sysfs / "md0")
    assert (found.kind, found.reaches_storage) == ("drive", True)
    assert found.reason.endswith("md0 over nvme0n1; nvme1n1")
    os.symlink(sysfs / "zram0", md / "zram0")  # one member in RAM: not all reads reach a drive
    found = on_disk(sysfs / "md0")
    assert (found.kind, found.reaches_storage) == ("zram", False)
    assert found.reason.endswith("md0 over nvme0n1, nvme1n1, zram0: zram0 is a RAM disk (zram)")
    _dir(sysfs / "dm-3" / "dm")  # a device-mapper zero target: no member at all
    _dir(sysfs / "dm-3" / "slaves")
    found = on_disk(sysfs / "dm-3")
    assert (found.kind, found.reaches_storage) == ("device-mapper", False)


@pytest.mark.parametrize("fstype,kind,reaches,said", [
    ("nfs4", "nfs4", True, "storage on another machine"),
    ("9p", "9p", True, "storage on another machine"),
    ("fuse.sshfs", "fuse.sshfs", True, "a FUSE filesystem"),
    ("ramfs", "ramfs", False, "in RAM")])
def test_network_fuse_and_ram_filesystems_are_named(tmp_path, monkeypatch, fstype, kind,
                                                    reaches, said):
    path = tmp_path / "t.dat"
    path.write_bytes(b"x")
    monkeypatch.setattr(device, "fs_type", lambda dev: (fstype, "/mnt"))
    monkeypatch.setattr(device, "mount_source", lambda dev: "server:/export")
    found = storage.classify(str(path))
    assert (found.kind, found.reaches_storage) == (kind, reaches) and said in found.reason
    assert storage.classify(str(path), direct=False).kind == ("page cache" if reaches else kind)
