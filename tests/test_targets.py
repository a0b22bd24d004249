import errno
import os

import numpy as np
import pytest

from gpufio import devinfo, pattern, runner, targets
from gpufio.errors import BadInput
from gpufio.profile import from_dict


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
        with pytest.raises(BadInput, match="smaller than offset\\+size = 5242880"):
            check(t, offset=1 << 20, size=4 << 20)
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


def test_auto_target_in_scratch(scratch):
    job = from_dict({"global": {"size": "64k", "randseed": 5}}, "p.toml", {}).jobs[0]
    (path,) = runner.job_targets(job, quiet=True)
    assert path == str(scratch / "gpufio-65536-seed5.dat")
    assert pattern.read_seed(open(path, "rb").read(4096)) == 5
    assert runner.job_targets(job, quiet=True) == [path]  # reused, not rewritten


def test_missing_target_without_size(tmp_path):
    job = from_dict({"global": {"targets": [str(tmp_path / "x.dat")]}}, "p.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="does not exist, and the job gives no size"):
        runner.job_targets(job, quiet=True)
    job = from_dict({}, "p.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="no targets and no size"):
        runner.job_targets(job, quiet=True)


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
