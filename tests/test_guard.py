"""The write guard: files and devices holding someone's data are refused, byte for byte
untouched, unless the job confirms; the same targets with the confirmation are written."""

import os
import subprocess

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import guard, pattern

cli = CliRunner()

# (name, offset, bytes): what a filesystem or partition table leaves at the start of a disk
SIGNATURES = {
    "ext4": (1080, b"\x53\xef", "an ext2/3/4 filesystem superblock"),
    "gpt": (512, b"EFI PART", "a GPT partition table"),
    "mbr": (510, b"\x55\xaa", "an MBR partition table or boot sector"),
    "xfs": (0, b"XFSB", "an XFS filesystem"),
    "lvm": (512, b"LABELONE", "an LVM physical volume"),
    "swap": (4086, b"SWAPSPACE2", "a swap area"),
    "btrfs": (65600, b"_BHRfS_M", "a btrfs filesystem"),
    "md": (4096, b"\xfc\x4e\x2b\xa9", "a Linux RAID (md) member, superblock 1.2"),
}
SIZE = 1 << 20


def image(path, kind):
    data = bytearray(SIZE)
    off, magic, _ = SIGNATURES[kind]
    data[off:off + len(magic)] = magic
    path.write_bytes(bytes(data))
    return bytes(data)


def write_job(tmp_path, target, **extra):
    lines = ["[global]", 'engine = "psync"', 'rw = "write"', f'targets = ["{target}"]',
             'size = "64k"'] + [f"{k} = {v}" for k, v in extra.items()]
    prof = tmp_path / "w.toml"
    prof.write_text("\n".join(lines) + "\n")
    return ["run", str(prof), "-q"]


@pytest.mark.parametrize("kind", list(SIGNATURES))
def test_signatures_are_recognised(kind, tmp_path):
    data = image(tmp_path / "x.img", kind)
    assert guard.signatures(data[:guard.HEAD_BYTES]) == [SIGNATURES[kind][2]]


def test_md_superblock_at_the_end_is_recognised():
    tail = bytearray(guard.HEAD_BYTES)
    tail[-65536:-65532] = b"\xfc\x4e\x2b\xa9"
    assert guard.signatures(bytes(guard.HEAD_BYTES), bytes(tail)) == [
        "a Linux RAID (md) member, superblock 0.90/1.0"]


@pytest.mark.parametrize("kind", ["ext4", "gpt", "mbr"])
def test_a_file_holding_data_is_refused_then_written_with_overwrite(kind, tmp_path):
    path = tmp_path / f"{kind}.img"
    before = image(path, kind)
    res = cli.invoke(app, write_job(tmp_path, path))
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1
    assert f"target {path}: holds {SIGNATURES[kind][2]}" in res.stderr
    assert "overwrite = true" in res.stderr
    assert path.read_bytes() == before
    res = cli.invoke(app, write_job(tmp_path, path, overwrite="true"))
    assert res.exit_code == 0, res.output
    assert path.read_bytes()[:64 << 10] == pattern.fill(0x89, 0, 64 << 10)


def test_a_file_gpufio_made_is_written_without_asking(tmp_path, pattern_file):
    res = cli.invoke(app, write_job(tmp_path, pattern_file))
    assert res.exit_code == 0, res.output


def test_read_jobs_never_need_the_guard(tmp_path):
    path = tmp_path / "ext4.img"
    before = image(path, "ext4")
    prof = tmp_path / "r.toml"
    prof.write_text(f'[global]\nengine = "psync"\nrw = "read"\ntargets = ["{path}"]\n'
                    'size = "64k"\n')
    assert cli.invoke(app, ["run", str(prof), "-q"]).exit_code == 0
    assert path.read_bytes() == before


@pytest.fixture
def loop_device(tmp_path, losetup):
    def attach(kind=None):
        path = tmp_path / f"loop-{kind or 'blank'}.img"
        if kind:
            before = image(path, kind)
        else:
            before = bytes(SIZE)
            path.write_bytes(before)
        return losetup(path), path, before

    return attach


@pytest.mark.parametrize("kind", ["ext4", "gpt", "mbr"])
def test_a_device_holding_data_is_refused_even_when_named(kind, tmp_path, loop_device):
    dev, path, before = loop_device(kind)
    res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{dev}"'))
    assert res.exit_code == 2, res.output
    assert f"target {dev}: holds {SIGNATURES[kind][2]}" in res.stderr
    assert res.stderr.count("\n") == 1
    assert path.read_bytes() == before


def test_a_blank_device_needs_its_name_confirmed(tmp_path, loop_device):
    dev, path, before = loop_device()
    res = cli.invoke(app, write_job(tmp_path, dev))
    assert res.exit_code == 2 and f'confirm with write_device = "{dev}"' in res.stderr
    res = cli.invoke(app, write_job(tmp_path, dev, write_device='"/dev/loop999"'))
    assert res.exit_code == 2 and "confirm with write_device" in res.stderr
    assert path.read_bytes() == before
    res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{dev}"', verify="true"))
    assert res.exit_code == 0, res.output
    with open(dev, "rb") as f:
        assert f.read(64 << 10) == pattern.fill(0x89, 0, 64 << 10)


def test_a_device_someone_holds_is_refused(tmp_path, loop_device):
    dev, path, before = loop_device()
    holder = os.open(dev, os.O_RDONLY | os.O_EXCL)
    try:
        res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{dev}"'))
    finally:
        os.close(holder)
    assert res.exit_code == 2 and "is in use" in res.stderr, res.output
    assert path.read_bytes() == before


def test_a_read_only_mount_is_refused(tmp_path, pattern_file):
    ro = tmp_path / "ro"
    ro.mkdir()
    res = subprocess.run(["mount", "--bind", "-o", "ro", str(pattern_file.parent), str(ro)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {res.stderr.strip()}")
    try:
        target = ro / pattern_file.name
        res = cli.invoke(app, write_job(tmp_path, target))
        assert res.exit_code == 2 and "read-only mount" in res.stderr, res.output
    finally:
        subprocess.run(["umount", str(ro)], check=False)
