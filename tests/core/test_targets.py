import errno
import os
import subprocess
import threading

import numpy as np
import pytest

from gpufio.core import pattern, targets
from gpufio.core.errors import BadInput
from gpufio.facts import device as devinfo
from gpufio.profile import from_dict
from gpufio.run import opening


def test_created_file_carries_the_pattern(pattern_file):
    data = pattern_file.read_bytes()
    assert len(data) == 4 << 20
    assert data == pattern.fill(1234, 0, 4 << 20)


def test_existing_paths_are_never_overwritten(pattern_file):
    before = pattern_file.read_bytes()
    with pytest.raises(BadInput, match="already exists; gpufio never overwrites"):
        targets.create_file(str(pattern_file), 4096, 1)
    assert pattern_file.read_bytes() == before


def test_interrupted_fill_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def fill(seed, start, n):
        calls.append(start)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return pattern.expected_words(seed, start, n).tobytes()

    monkeypatch.setattr(pattern, "fill", fill)
    path = tmp_path / "big.dat"
    with pytest.raises(KeyboardInterrupt):
        targets.create_file(str(path), 3 * targets.FILL_CHUNK, 1)
    assert os.listdir(tmp_path) == []


def test_open_reads_facts_and_seed(pattern_file):
    t = targets.open_target(str(pattern_file), direct=True)
    try:
        assert (t.size, t.pattern_seed, t.is_block) == (4 << 20, 1234, False)
        assert t.facts["kind"] == "file" and t.dio_align >= 1
        with pytest.raises(OSError) as err:
            os.write(t.fd, b"x")
        assert err.value.errno == errno.EBADF  # opened read-only
    finally:
        t.close()
        t.close()


@pytest.mark.parametrize("make,message", [
    (lambda p: p / "missing.dat", "does not exist"),
    (lambda p: p, "is a directory"),
])
def test_bad_targets(tmp_path, make, message):
    with pytest.raises(BadInput, match=message):
        targets.open_target(str(make(tmp_path)), direct=True)


def test_character_device_is_refused():
    with pytest.raises(BadInput, match="neither a regular file nor a block device"):
        targets.open_target("/dev/null", direct=False)


@pytest.mark.parametrize("err,message", [
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
    (OSError(errno.EINVAL, "Invalid argument"), "does not support O_DIRECT"),
])
def test_open_failures_become_one_line_errors(pattern_file, monkeypatch, err, message):
    def refuse(*args, **kwargs):
        raise err
    monkeypatch.setattr(targets.os, "open", refuse)
    with pytest.raises(BadInput, match=f"^target {pattern_file}: .*{message}"):
        targets.open_target(str(pattern_file), direct=True)


def check(t, **kw):
    args = dict(offset=0, size=None, bs=4096, direct=True, need_pattern=False)
    args.update(kw)
    return targets.check_region(t, **args)


def test_region_checks(pattern_file, tmp_path, monkeypatch):
    t = targets.open_target(str(pattern_file), direct=True)
    try:
        assert check(t) == (0, 1024)
        assert check(t, offset=1 << 20, size=1 << 20, bs=65536) == (1 << 20, 16)
        with pytest.raises(BadInput, match="smaller than offset\\+size = 5242880 bytes; "
                           "--set size=3m fits after offset 1m$"):
            check(t, offset=1 << 20, size=4 << 20)
        with pytest.raises(BadInput, match="--set size=1020k fits after offset 3075k$"):
            check(t, offset=(3 << 20) + 3072, size=4 << 20, bs=4096)  # whole blocks only
        with pytest.raises(BadInput, match="offset 4m leaves no whole 4096-byte block$"):
            check(t, offset=4 << 20, size=None, bs=4096)
        with pytest.raises(BadInput, match="offset 100 is not a multiple of its O_DIRECT"):
            check(t, offset=100)
        assert check(t, offset=100, direct=False, size=8192) == (100, 2)
        t.dio_align = 4096
        with pytest.raises(BadInput, match="bs 512 is not a multiple of its O_DIRECT alignment 4096"):
            check(t, bs=512)
    finally:
        t.close()
    plain = tmp_path / "plain.dat"
    plain.write_bytes(b"\1" * 8192)
    t = targets.open_target(str(plain), direct=False)
    try:
        with pytest.raises(BadInput, match="does not carry gpufio's data pattern"):
            check(t, need_pattern=True)
    finally:
        t.close()


def test_alignment_comes_from_statx(pattern_file, monkeypatch):
    monkeypatch.setattr(devinfo, "dio_alignment", lambda path: (4096, 4096))
    t = targets.open_target(str(pattern_file), direct=True)
    t.close()
    assert t.dio_align == 4096


def _job(**glob):
    return from_dict({"global": glob}, "p.toml", {}).jobs[0]


def test_one_scratch_file_per_seed_grows_with_the_largest_size(scratch):
    (path,) = opening.job_targets(_job(size="64k", randseed=5), quiet=True)
    assert path == str(scratch / "gpufio-seed5.dat")
    assert os.path.getsize(path) == 65536
    assert opening.job_targets(_job(size="16k", randseed=5), quiet=True) == [path]
    assert os.path.getsize(path) == 65536  # a smaller size reuses it as it is
    assert opening.job_targets(_job(size="1m", offset="4k", randseed=5), quiet=True) == [path]
    data = open(path, "rb").read()
    assert len(data) == (1 << 20) + 4096 and data == pattern.fill(5, 0, len(data))
    assert sorted(os.listdir(scratch)) == ["gpufio-seed5.dat"]


def test_a_scratch_file_that_lost_its_pattern_is_not_grown(scratch):
    scratch.mkdir()
    (scratch / "gpufio-seed5.dat").write_bytes(b"\0" * 4096)
    with pytest.raises(BadInput, match="does not carry gpufio's pattern of seed 5"):
        opening.job_targets(_job(size="64k", randseed=5), quiet=True)
    assert os.path.getsize(scratch / "gpufio-seed5.dat") == 4096


def test_stale_partial_files_of_dead_processes_are_removed(scratch):
    scratch.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = scratch / f"gpufio-seed5.dat.partial-{dead.pid}"
    stale.write_bytes(pattern.fill(5, 0, 8192))
    live = scratch / f"gpufio-seed6.dat.partial-{os.getpid()}"
    live.write_bytes(pattern.fill(6, 0, 4096))
    foreign = scratch / f"notes.txt.partial-{dead.pid}"  # not ours: left alone
    foreign.write_text("hello")
    opening.job_targets(_job(size="64k", randseed=5), quiet=True)
    assert not stale.exists() and live.exists() and foreign.exists()


@pytest.mark.parametrize("path,message", [
    ("/dev/nvme0n1", "^target /dev/nvme0n1: no such block device \\(gpufio never creates "
                     "files under /dev\\)$"),
    ("/dev/disk/x.dat", "never creates files under /dev"),
    ("/run/gpufio-x.dat", "never creates files under /run"),
    ("/proc/x.dat", "never creates files under /proc"),
    ("/sys/x.dat", "never creates files under /sys"),
])
def test_no_file_is_ever_created_under_the_kernels_trees(path, message):
    for size in ("16g", None):
        job = _job(targets=[path], **({"size": size} if size else {}))
        with pytest.raises(BadInput, match=message):
            opening.job_targets(job, quiet=True)
    assert not os.path.exists(path)


def test_the_shared_memory_tmpfs_is_the_one_place_under_dev_for_files():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    path = f"/dev/shm/gpufio-test-{os.getpid()}.dat"
    try:
        opening.job_targets(_job(targets=[path], size="64k"), quiet=True)
        assert open(path, "rb").read() == pattern.fill(0x89, 0, 65536)
        assert devinfo.path_facts(path)["ram_backed"] is True
    finally:
        os.unlink(path)


def test_a_device_name_is_never_created_elsewhere_either(tmp_path):
    path = tmp_path / "nvme1n1"
    with pytest.raises(BadInput, match="its name is a block device's"):
        opening.job_targets(_job(targets=[str(path)], size="1m"), quiet=True)
    assert not path.exists()


def test_a_regular_file_left_under_dev_is_not_measured(monkeypatch):
    monkeypatch.setattr(devinfo, "fs_type", lambda dev: ("devtmpfs", "/dev"))
    with pytest.raises(BadInput, match="is a regular file in /dev \\(RAM\\)"):
        targets.open_target(__file__, direct=False)


def test_missing_directories_are_errors_not_created(tmp_path):
    with pytest.raises(BadInput, match="key 'directory': .*/data1 does not exist"):
        opening.job_targets(_job(size="1m", directory=str(tmp_path / "data1")), quiet=True)
    with pytest.raises(BadInput, match="directory .*/sub does not exist"):
        opening.job_targets(_job(size="1m", targets=[str(tmp_path / "sub" / "x.dat")]), quiet=True)
    assert not (tmp_path / "data1").exists() and not (tmp_path / "sub").exists()


def test_an_empty_target_list_is_an_error():
    with pytest.raises(BadInput, match="key 'targets': the list is empty"):
        _job(targets=[], size="1m")


@pytest.mark.parametrize("size", [1001, 4099, 12345])
def test_sizes_that_are_not_a_multiple_of_8_are_created(tmp_path, size):
    path = tmp_path / "odd.dat"
    opening.job_targets(_job(size=size, bs=512, targets=[str(path)]), quiet=True)
    assert path.read_bytes() == pattern.fill(0x89, 0, size)


def test_scratch_files_lists_what_gpufio_left(scratch):
    scratch.mkdir()
    for name in ("gpufio-seed1.dat", "gnn-features-10x4-seed1.f32", "gnn-graph-10-4-1.npz",
                 "mine.txt"):
        (scratch / name).write_bytes(b"x")
    # core names only its own layouts; each workload names its files ('gpufio clean')
    assert [os.path.basename(p) for p in targets.scratch_files([str(scratch)])] == [
        "gpufio-seed1.dat"]


def test_missing_target_without_size(tmp_path):
    job = from_dict({"global": {"targets": [str(tmp_path / "x.dat")]}}, "p.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="does not exist, and the job gives no size"):
        opening.job_targets(job, quiet=True)
    job = from_dict({}, "p.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="no targets and no size"):
        opening.job_targets(job, quiet=True)


def test_block_device_facts_when_present():
    if not os.path.exists("/sys/block"):
        pytest.skip("no sysfs")
    disks = [d for d in os.listdir("/sys/block") if os.path.exists(f"/dev/{d}")]
    if not disks:
        pytest.skip("no block devices visible")
    facts = devinfo.block_facts(devinfo.Path("/sys/block") / disks[0])
    assert facts["device"] == disks[0]
    assert facts["logical_block_size"] in (512, 1024, 2048, 4096)


def test_aligned_buffer_is_page_aligned():
    mem = targets.aligned_buffer(10000)
    addr = np.frombuffer(mem, np.uint8).ctypes.data
    assert addr % 4096 == 0 and len(mem) >= 10000


def test_pci_link_names_the_generation(tmp_path):
    for key, value in (("current_link_speed", "16.0 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe"),
                       ("current_link_width", "4"), ("max_link_width", "4"), ("numa_node", "1")):
        (tmp_path / key).write_text(value + "\n")
    facts = devinfo.pci_link(tmp_path)
    assert facts["current_pcie_gen"] == 4 and facts["max_pcie_gen"] == 5  # a Gen5 drive in Gen4
    assert facts["current_link_width"] == "4" and facts["numa_node"] == "1"
    assert devinfo.pci_link(tmp_path / "missing") == {}


def test_a_file_on_tmpfs_is_labelled_ram_backed(monkeypatch, shm_pattern_file):
    facts = devinfo.path_facts(str(shm_pattern_file))
    assert facts["ram_backed"] is True and facts["ram_backing"] == "tmpfs"
    assert facts["storage"]["kind"] == "tmpfs" and not facts["storage"]["reaches_storage"]
    monkeypatch.setattr(devinfo, "fs_type", lambda dev: ("ext4", "/"))
    monkeypatch.setattr(devinfo, "disk_dir", lambda dev: None)
    facts = devinfo.path_facts(__file__)
    assert facts["ram_backed"] is False and "ram_backing" not in facts


def test_zram_is_labelled_ram_backed_when_present():
    if not os.path.exists("/dev/zram0"):
        pytest.skip("no /dev/zram0 here")
    facts = devinfo.path_facts("/dev/zram0")
    assert facts["kind"] == "block" and facts["ram_backed"] and facts["ram_backing"] == "zram"


def test_two_workers_closing_one_target_close_its_descriptor_once(pattern_file, monkeypatch):
    """A job's thread workers share its targets (bam's GPU workers close them before taking
    the controller): the second close, arriving while the first is inside os.close, must not
    close the descriptor again; the number may already be another worker's."""
    t = targets.open_target(str(pattern_file), direct=False)
    fd, closed = t.fd, []
    inside, second_done = threading.Event(), threading.Event()
    real_close = os.close

    def slow_close(n):
        closed.append(n)
        if len(closed) == 1:  # the other worker's close runs while this one is inside
            inside.set()
            second_done.wait(10)
        real_close(n)

    monkeypatch.setattr(targets.os, "close", slow_close)
    first = threading.Thread(target=t.close)
    first.start()
    assert inside.wait(10)
    t.close()
    second_done.set()
    first.join()
    assert closed == [fd] and t.fd == -1
