"""The write guard: files and devices holding someone's data are refused, byte for byte
untouched, unless the job confirms; the same targets with the confirmation are written.

The corpus is real: loop devices carrying what mkfs, mkswap, make-bcache, pvcreate, mdadm,
cryptsetup, sgdisk and sfdisk leave on them, each refused through libblkid and again with
libblkid hidden (gpufio's own signature list)."""

import os
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import guard, pattern
from gpufio.core.guard import Signature

cli = CliRunner()

# what gpufio's own list finds: (offset, magic) planted in a blank image -> its finding
PLANTED = {
    "gpt": (512, b"EFI PART", 'a partition table (PTTYPE="gpt")'),
    "dos": (510, b"\x55\xaa", 'a partition table (PTTYPE="dos")'),
    "ext": (1080, b"\x53\xef", 'a filesystem (TYPE="ext2/ext3/ext4")'),
    "xfs": (0, b"XFSB", 'a filesystem (TYPE="xfs")'),
    "lvm": (512, b"LABELONE", 'a RAID or volume-manager member (TYPE="LVM2_member")'),
    "swap": (4086, b"SWAPSPACE2", 'a device signature (TYPE="swap")'),
    "btrfs": (65600, b"_BHRfS_M", 'a filesystem (TYPE="btrfs")'),
    "md": (4096, b"\xfc\x4e\x2b\xa9",
           'a RAID or volume-manager member (TYPE="linux_raid_member")'),
    "bcache": (4120, bytes.fromhex("c68573f64e1a45ca8265f57f48ba6d81"),
               'a device signature (TYPE="bcache")'),
}
SIZE = 1 << 20
# a loop device's image: sparse, and large enough for mkfs.xfs (300 MB at least)
IMAGE_SIZE = 512 << 20
WRITTEN = 64 << 10  # what write_job writes, from byte 0


def planted(kind: str) -> bytes:
    data = bytearray(SIZE)
    off, magic, _ = PLANTED[kind]
    data[off:off + len(magic)] = magic
    return bytes(data)


def write_job(tmp_path, target, **extra):
    lines = ["[global]", 'engine = "psync"', 'rw = "write"', f'targets = ["{target}"]',
             f'size = "{WRITTEN}"'] + [f"{k} = {v}" for k, v in extra.items()]
    prof = tmp_path / "w.toml"
    prof.write_text("\n".join(lines) + "\n")
    return ["run", str(prof), "-q"]


@pytest.mark.parametrize("kind", list(PLANTED))
def test_the_own_list_recognises_each_magic(kind):
    assert list(map(str, guard.signatures(planted(kind)[:guard.HEAD_BYTES]))) == \
        [PLANTED[kind][2]]


def test_a_fat_boot_sector_is_vfat_not_an_mbr():
    data = bytearray(planted("dos"))
    data[82:90] = b"FAT32   "
    assert guard.signatures(bytes(data)) == [Signature("a filesystem", "TYPE", "vfat")]


def test_md_superblock_at_the_end_is_recognised():
    tail = bytearray(guard.HEAD_BYTES)
    tail[-65536:-65532] = b"\xfc\x4e\x2b\xa9"
    assert list(map(str, guard.signatures(bytes(guard.HEAD_BYTES), bytes(tail)))) == [
        PLANTED["md"][2]]


def _tool(name):
    if not shutil.which(name):
        pytest.skip(f"{name} is not installed (.ci/run installs it where apt-get works)")


def _make(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        pytest.skip(f"{cmd[0]} cannot make its signature here: "
                    f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")


def test_a_real_filesystem_image_file_is_refused_then_written_with_overwrite(tmp_path):
    _tool("mkfs.ext4")
    path = tmp_path / "ext4.img"
    path.write_bytes(bytes(8 << 20))
    _make(["mkfs.ext4", "-q", "-F", str(path)])
    before = path.read_bytes()
    res = cli.invoke(app, write_job(tmp_path, path))
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1
    assert f'target {path}: holds a filesystem (TYPE="ext4"), found by libblkid; ' \
        in res.stderr and "overwrite = true" in res.stderr
    assert path.read_bytes() == before
    res = cli.invoke(app, write_job(tmp_path, path, overwrite="true"))
    assert res.exit_code == 0, res.output
    assert path.read_bytes()[:WRITTEN] == pattern.fill(0x89, 0, WRITTEN)


def test_a_file_without_the_pattern_is_refused(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"someone's data" * 10_000)
    res = cli.invoke(app, write_job(tmp_path, path))
    assert res.exit_code == 2 and "does not carry gpufio's pattern" in res.stderr, res.output
    assert path.read_bytes() == b"someone's data" * 10_000


def test_a_file_gpufio_made_is_written_without_asking(tmp_path, pattern_file):
    """The pattern file is written without overwrite = true, with its own pattern (seed
    1234): a block zeroed inside the job's range carries the pattern again, one beyond it
    (the job writes WRITTEN bytes from 0) stays zero."""
    size = pattern_file.stat().st_size
    inside, beyond = 8192, WRITTEN + 8192
    with open(pattern_file, "r+b") as f:
        for off in (inside, beyond):
            f.seek(off)
            f.write(bytes(4096))
    res = cli.invoke(app, write_job(tmp_path, pattern_file))
    assert res.exit_code == 0, res.output
    data = pattern_file.read_bytes()
    assert len(data) == size
    assert data[:WRITTEN] == pattern.fill(1234, 0, WRITTEN)
    assert data[beyond:beyond + 4096] == bytes(4096)
    assert data[beyond + 4096:] == pattern.fill(1234, beyond + 4096, size - beyond - 4096)


def test_read_jobs_never_need_the_guard(tmp_path):
    path = tmp_path / "ext.img"
    before = planted("ext")
    path.write_bytes(before)
    prof = tmp_path / "r.toml"
    prof.write_text(f'[global]\nengine = "psync"\nrw = "read"\ntargets = ["{path}"]\n'
                    'size = "64k"\n')
    assert cli.invoke(app, ["run", str(prof), "-q"]).exit_code == 0
    assert path.read_bytes() == before


@pytest.fixture
def blank_device(tmp_path, losetup):
    """A loop device over a fresh sparse image: (device, image path)."""
    def attach(name="blank"):
        path = tmp_path / f"loop-{name}.img"
        with open(path, "wb") as f:
            f.truncate(IMAGE_SIZE)
        return losetup(path), path
    return attach


def _mdadm(version):
    def make(dev, tmp_path):
        if not os.path.exists("/proc/mdstat"):
            pytest.skip("no md driver here (/proc/mdstat): mdadm cannot create an array")
        name = f"/dev/md/gpufio-guard-{os.getpid()}"
        _make(["mdadm", "--create", name, "--run", "--level=1", "--raid-devices=2",
               f"--metadata={version}", dev, "missing"])
        _make(["mdadm", "--stop", name])
    return make


def _luks(version):
    def make(dev, tmp_path):
        key = tmp_path / "key"
        key.write_text("not a secret")
        _make(["cryptsetup", "luksFormat", "-q", "--type", version, "--pbkdf", "pbkdf2",
               "--pbkdf-force-iterations", "1000", "--key-file", str(key), dev])
    return make


def _mksquashfs(dev, tmp_path):
    src = tmp_path / "squash-src"
    src.mkdir()
    (src / "file").write_text("data")
    _make(["mksquashfs", str(src), dev, "-noappend", "-quiet"])


def _genisoimage(dev, tmp_path):
    src = tmp_path / "iso-src"
    src.mkdir()
    (src / "file").write_text("data")
    iso = tmp_path / "image.iso"
    _make(["genisoimage", "-quiet", "-o", str(iso), str(src)])
    with open(dev, "r+b") as f:
        f.write(iso.read_bytes())


def _sfdisk(dev, tmp_path):
    _make(["sfdisk", "-q", dev], input=",,L\n")


# kind -> (tool, its arguments before the device or a function(device, tmp_path) making
# the signature, what libblkid calls it, what gpufio's own list calls it where not the same)
CORPUS = {
    "ext2": ("mkfs.ext2", ["-q", "-F", "-E", "nodiscard"], 'TYPE="ext2"',
             'TYPE="ext2/ext3/ext4"'),
    "ext3": ("mkfs.ext3", ["-q", "-F", "-E", "nodiscard"], 'TYPE="ext3"',
             'TYPE="ext2/ext3/ext4"'),
    "ext4": ("mkfs.ext4", ["-q", "-F", "-E", "nodiscard"], 'TYPE="ext4"',
             'TYPE="ext2/ext3/ext4"'),
    "xfs": ("mkfs.xfs", ["-q", "-f", "-K"], 'TYPE="xfs"', None),
    "btrfs": ("mkfs.btrfs", ["-q", "-f", "-K"], 'TYPE="btrfs"', None),
    "vfat16": ("mkfs.vfat", ["-F", "16"], 'TYPE="vfat"', None),
    "vfat32": ("mkfs.vfat", ["-F", "32"], 'TYPE="vfat"', None),
    "f2fs": ("mkfs.f2fs", ["-q", "-f", "-t", "0"], 'TYPE="f2fs"', None),
    "ntfs": ("mkfs.ntfs", ["-q", "-f", "-F"], 'TYPE="ntfs"', None),
    "exfat": ("mkfs.exfat", [], 'TYPE="exfat"', None),
    "nilfs2": ("mkfs.nilfs2", ["-q", "-f", "-K"], 'TYPE="nilfs2"', None),
    "jfs": ("mkfs.jfs", ["-q"], 'TYPE="jfs"', None),
    "udf": ("mkudffs", [], 'TYPE="udf"', None),
    "minix": ("mkfs.minix", ["-3"], 'TYPE="minix"', None),
    "iso9660": ("genisoimage", _genisoimage, 'TYPE="iso9660"', None),
    "squashfs": ("mksquashfs", _mksquashfs, 'TYPE="squashfs"', None),
    "swap": ("mkswap", [], 'TYPE="swap"', None),
    "bcache-backing": ("make-bcache", ["-B"], 'TYPE="bcache"', None),
    "bcache-cache": ("make-bcache", ["-C"], 'TYPE="bcache"', None),
    "lvm-pv": ("pvcreate", ["-q", "-y"], 'TYPE="LVM2_member"', None),
    "md-0.90": ("mdadm", _mdadm("0.90"), 'TYPE="linux_raid_member"', None),
    "md-1.0": ("mdadm", _mdadm("1.0"), 'TYPE="linux_raid_member"', None),
    "md-1.1": ("mdadm", _mdadm("1.1"), 'TYPE="linux_raid_member"', None),
    "md-1.2": ("mdadm", _mdadm("1.2"), 'TYPE="linux_raid_member"', None),
    "luks1": ("cryptsetup", _luks("luks1"), 'TYPE="crypto_LUKS"', None),
    "luks2": ("cryptsetup", _luks("luks2"), 'TYPE="crypto_LUKS"', None),
    "gpt": ("sgdisk", ["-o", "-n", "1:0:0"], 'PTTYPE="gpt"', None),
    "dos": ("sfdisk", _sfdisk, 'PTTYPE="dos"', None),
}


def _sign(kind, tmp_path, losetup):
    """A loop device carrying ``kind``'s signature, made by its tool: (device, image)."""
    tool, how, _, _ = CORPUS[kind]
    _tool(tool)
    image = tmp_path / f"{kind}.img"
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    dev = losetup(image)
    if isinstance(how, list):
        _make([tool, *how, dev])
    else:
        how(dev, tmp_path)
    return dev, image


def _head(image):
    with open(image, "rb") as f:
        return f.read(SIZE)


@pytest.mark.parametrize("kind", list(CORPUS))
def test_a_device_carrying_a_real_signature_is_refused_even_when_named(
        kind, tmp_path, losetup, monkeypatch):
    dev, image = _sign(kind, tmp_path, losetup)
    before = _head(image)
    _, _, blkid_name, own_name = CORPUS[kind]
    job = write_job(tmp_path, dev, write_device=f'"{dev}"')
    res = cli.invoke(app, job)
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1
    assert f"target {dev}: holds " in res.stderr and f"{blkid_name}), found by libblkid" \
        in res.stderr, res.stderr
    assert "gpufio never writes over it" in res.stderr
    if kind.startswith("vfat"):  # a FAT boot sector is a filesystem, not an MBR
        assert "partition table" not in res.stderr
    assert _head(image) == before
    # where libblkid is missing, gpufio's own list refuses it too
    monkeypatch.setattr(guard, "_libblkid", lambda: None)
    res = cli.invoke(app, job)
    assert res.exit_code == 2, res.output
    assert f"{own_name or blkid_name}), found by gpufio's own list: no libblkid.so.1 here" \
        in res.stderr, res.stderr
    assert _head(image) == before


def test_a_damaged_gpt_that_libblkid_passes_over_is_refused_even_when_named(
        tmp_path, blank_device):
    """A bare GPT header magic with no valid checksum: libblkid reports nothing, yet a disk
    that carries it is someone's (a half-wiped or damaged table); gpufio's own list says so."""
    dev, image = blank_device()
    with open(image, "r+b") as f:
        f.seek(512)
        f.write(b"EFI PART")
    before = _head(image)
    if guard._libblkid() is not None:
        fd = os.open(dev, os.O_RDONLY)
        try:
            assert guard.blkid_signatures(guard._libblkid(), fd) == []
        finally:
            os.close(fd)
    res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{dev}"'))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert f'target {dev}: holds a partition table (PTTYPE="gpt"), found by gpufio\'s own ' \
        "list" in res.stderr, res.stderr
    assert _head(image) == before


def test_a_blank_device_needs_its_name_confirmed(tmp_path, blank_device):
    dev, image = blank_device()
    other, _ = blank_device("other")
    res = cli.invoke(app, write_job(tmp_path, dev))
    assert res.exit_code == 2 and f'confirm with write_device = "{dev}"' in res.stderr
    number = f"{os.major(os.stat(dev).st_rdev)}:{os.minor(os.stat(dev).st_rdev)}"
    other_number = f"{os.major(os.stat(other).st_rdev)}:{os.minor(os.stat(other).st_rdev)}"
    res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{other}"'))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert (f"target {dev}: write_device names {other} (block device {other_number}), but "
            f"the target is {dev} (block device {number}); confirm with write_device = "
            f'"{dev}"') in res.stderr, res.stderr
    res = cli.invoke(app, write_job(tmp_path, dev, write_device='"/dev/loop-gpufio-none"'))
    assert res.exit_code == 2
    assert "write_device names /dev/loop-gpufio-none (nothing that exists), but the target " \
        f"is {dev}" in res.stderr
    assert _head(image) == bytes(SIZE)
    # a link to the device names it too, and the confirmed write lands
    link = tmp_path / "by-id-link"
    link.symlink_to(dev)
    res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{link}"', verify="true"))
    assert res.exit_code == 0, res.output
    with open(dev, "rb") as f:
        assert f.read(WRITTEN) == pattern.fill(0x89, 0, WRITTEN)


def test_a_device_someone_holds_is_refused(tmp_path, blank_device):
    dev, image = blank_device()
    holder = os.open(dev, os.O_RDONLY | os.O_EXCL)
    try:
        res = cli.invoke(app, write_job(tmp_path, dev, write_device=f'"{dev}"'))
    finally:
        os.close(holder)
    assert res.exit_code == 2 and "is in use" in res.stderr, res.output
    assert _head(image) == bytes(SIZE)


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
