"""The SSD list: resolve, create, open and check the targets a job reads.

gpufio creates missing files (filled with the self-describing pattern, written under a
temporary name and renamed when complete, so an interrupted fill never looks ready), and only
plain files in existing directories, never where a device was meant. Existing files and block
devices are opened read-only, unless the job writes and the write guard (core/guard.py)
allows it for that target.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpufio.core import events, pattern, space
from gpufio.core.errors import BadInput
from gpufio.core.guard import WriteConsent
from gpufio.core.units import format_size, size_spec
from gpufio.facts import device as devinfo
from gpufio.facts import nvme_generic
from gpufio.facts.storage import ram_backing

FILL_CHUNK = 8 << 20
# kernel and runtime trees: a file created there lives in RAM or is refused by the kernel
SYSTEM_DIRS = ("/dev", "/proc", "/sys", "/run")
# the one place under /dev meant for files: the shared-memory tmpfs (targets there are
# labelled ram-backed like any tmpfs file)
SHM_DIR = "/dev/shm"
# names the kernel gives block devices: a missing path with such a name is a mistyped device
_DEVICE_NAME = re.compile(r"(nvme\d+n\d+(p\d+)?|nvme\d+c\d+n\d+|[shvx]+d[a-z]+\d*|loop\d+|"
                          r"zram\d+|ram\d+|md\d+|dm-\d+|nbd\d+|pmem\d+|mmcblk\d+(p\d+)?|"
                          r"rbd\d+|sr\d+)")
# a job's thread workers share its targets: two closing one must not close its fd twice
# (the second close may hit a descriptor another worker has just opened)
_CLOSING = threading.Lock()
_PARTIAL = re.compile(r"\.partial-(\d+)$")
# the names of the files gpufio's own layouts leave in a scratch directory, half-written
# ones included; every other file it lays out is known by its pattern header, and each
# workload names its own (GNN tables, checkpoints) for 'gpufio clean'
SCRATCH_NAMES = re.compile(r"gpufio-.*\.dat(\.partial-\d+)?")


def default_scratch_dir() -> str:
    """Where auto-created target files go when a profile names neither targets nor directory."""
    env = os.environ.get("GPUFIO_SCRATCH")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpufio")


def scratch_path(directory: str | None, seed: int) -> str:
    """The scratch file a job without targets reads: one per seed, grown to the largest size
    asked for, since the pattern at an offset does not depend on the file's length."""
    return os.path.join(directory or default_scratch_dir(), f"gpufio-seed{seed}.dat")


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def _system_dir(directory: str) -> str | None:
    """The kernel tree ``directory`` lies in (None for /dev/shm and everywhere else)."""
    real = os.path.realpath(directory)
    if _under(real, SHM_DIR):
        return None
    return next((d for d in SYSTEM_DIRS if _under(real, d)), None)


def check_creatable(path: str) -> None:
    """BadInput unless a missing ``path`` may become a plain file: never under the kernel's
    trees, never with a block device's name, only in a directory that exists."""
    parent = os.path.dirname(os.path.abspath(path))
    system = _system_dir(parent)
    if system == "/dev":
        raise BadInput(f"target {path}: no such block device (gpufio never creates files "
                       "under /dev)")
    if system:
        raise BadInput(f"target {path}: does not exist (gpufio never creates files under "
                       f"{system})")
    if _DEVICE_NAME.fullmatch(os.path.basename(path)):
        raise BadInput(f"target {path}: does not exist, and its name is a block device's "
                       "(gpufio never creates a file where a device was named)")
    if not os.path.isdir(parent):
        raise BadInput(f"target {path}: directory {parent} does not exist (gpufio creates "
                       "files only in existing directories)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, and someone else's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _filling(name: str) -> bool:
    """Whether ``name`` is a ``.partial-PID`` file whose process still fills it."""
    m = _PARTIAL.search(name)
    return bool(m) and _pid_alive(int(m.group(1)))


def remove_stale_partials(directory: str) -> list[str]:
    """Remove half-written ``*.partial-PID`` files of processes that no longer run, if they
    carry gpufio's pattern (or are empty); returns the paths removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        if not _PARTIAL.search(name) or _filling(name) or not os.path.isfile(path):
            continue
        if os.path.getsize(path) and pattern.read_seed(_read_first_block(path)) is None \
                and not SCRATCH_NAMES.fullmatch(name):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def scratch_files(directories: list[str], left: re.Pattern[str] = SCRATCH_NAMES) -> list[str]:
    """The files gpufio laid out in ``directories``: every file carrying its pattern header
    (scratch targets, the targets of TOML profiles and fio job files, whatever their name)
    and the files whose names match ``left`` (each workload's: GNN tables and graphs,
    checkpoints; a ``.partial-PID`` suffix allowed), except those a live process still
    fills (what ``gpufio clean`` removes)."""
    found = []
    for d in dict.fromkeys(os.path.abspath(d) for d in directories):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            if _filling(name) or os.path.islink(path) or not os.path.isfile(path):
                continue
            if left.fullmatch(_PARTIAL.sub("", name)) or \
                    pattern.read_seed(_read_first_block(path)) is not None:
                found.append(path)
    return found


@dataclass
class Target:
    """One opened target: its descriptor, usable size, alignment needs and device facts."""

    path: str
    fd: int
    size: int
    is_block: bool
    dio_align: int
    pattern_seed: int | None
    facts: dict[str, Any] = field(default_factory=dict)
    # the logical block size of an NVMe namespace opened for passthrough: every I/O moves
    # whole blocks (0: a file or block device, no such rule beyond O_DIRECT's)
    lba: int = 0

    def sync(self) -> None:
        """fsync what the target's writes went to. A namespace opened for passthrough syncs
        through its block device: its char device has no fsync, and the block device's
        sends the drive a flush."""
        if not self.lba:
            os.fsync(self.fd)
            return
        fd = os.open(self.facts["namespace"], os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the descriptor; safe to call twice, from several threads at once."""
        with _CLOSING:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def create_file(path: str, nbytes: int, seed: int,
                progress: Callable[[int, int], None] | None = None,
                allow_large: bool = False) -> None:
    """Create ``path`` holding ``nbytes`` of the pattern; refuses to touch an existing path,
    to create one where a device was meant (``check_creatable``), or to take a large share
    of the free space without consent (``space.check_layout``; ``allow_large``: the job's)."""
    if os.path.lexists(path):
        raise BadInput(f"target {path}: already exists; gpufio never overwrites a target")
    check_creatable(path)
    space.check_layout(path, nbytes, allow_large)
    remove_stale_partials(os.path.dirname(os.path.abspath(path)))
    tmp = f"{path}.partial-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        raise BadInput(f"target {path}: cannot create: {e.strerror}") from None
    try:
        _fill(fd, path, 0, nbytes, seed, progress)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def _fill(fd: int, path: str, start: int, end: int, seed: int,
          progress: Callable[[int, int], None] | None) -> None:
    """Write the pattern for bytes [start, end) of ``fd``, flushed and out of the page cache
    (a later O_DIRECT-less read must come from storage, not from this fill)."""
    try:
        done = start
        while done < end:
            n = min(FILL_CHUNK, end - done)
            os.pwrite(fd, pattern.fill(seed, done, n), done)
            done += n
            if progress:
                progress(done, end)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as e:
        raise BadInput(f"target {path}: cannot fill: {e.strerror}") from None


def ensure_scratch(path: str, nbytes: int, seed: int, quiet: bool = False,
                   allow_large: bool = False) -> None:
    """Make the scratch file ``path`` hold at least ``nbytes`` (rounded up to whole pattern
    blocks) of seed ``seed``'s pattern: create it, or grow it under a lock (a large layout
    with consent only, ``create_file``)."""
    nbytes = -(-nbytes // pattern.BLOCK) * pattern.BLOCK
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(path):
        if directory == os.path.abspath(default_scratch_dir()):
            try:
                os.makedirs(directory, exist_ok=True)  # gpufio's own cache directory
            except OSError as e:
                raise BadInput(f"scratch directory {directory}: cannot create: "
                               f"{e.strerror}") from None
        try:
            create_file(path, nbytes, seed, None if quiet else _layout_progress(path),
                        allow_large)
            return
        except BadInput:
            if not os.path.lexists(path):  # not lost to a concurrent creator: a real error
                raise
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise BadInput(f"scratch file {path}: cannot open: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if pattern.read_seed(os.pread(fd, pattern.BLOCK, 0)) != seed:
            raise BadInput(f"scratch file {path}: does not carry gpufio's pattern of seed "
                           f"{seed}; remove it ('gpufio clean')")
        size = os.fstat(fd).st_size
        if size < nbytes:
            space.check_layout(path, nbytes - size, allow_large)
            _fill(fd, path, size, nbytes, seed, None if quiet else _layout_progress(path))
    finally:
        os.close(fd)


def _layout_progress(path: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if done == total or done % (256 << 20) == 0:
            events.emit("layout", f"gpufio: laying out {path}: {format_size(done)} of "
                                  f"{format_size(total)}")
    return report


def ensure_exists(path: str, nbytes: int | None, seed: int, quiet: bool = False,
                  allow_large: bool = False) -> bool:
    """Create ``path`` if missing (True when created); BadInput if it cannot be."""
    if os.path.lexists(path):
        return False
    if nbytes is None:
        check_creatable(path)  # a mistyped device gets the device message, not "no size"
        raise BadInput(f"target {path}: does not exist, and the job gives no size to create it with")
    create_file(path, nbytes, seed, None if quiet else _layout_progress(path), allow_large)
    return True


def _read_first_block(path: str) -> bytes:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(pattern.BLOCK)
    except OSError:
        return b""


def _read_first_block_direct(path: str) -> bytes:
    """The first block of a block device read past the page cache, which passthrough writes
    never update."""
    buf = aligned_buffer(pattern.BLOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
        return bytes(buf[:n])
    except OSError:
        return b""
    finally:
        buf.close()


NO_STORAGE = "(no storage)"


def no_storage(size: int) -> Target:
    """The target of a job whose engine touches no storage (null) and that names none: an
    offset space of ``size`` bytes with no file behind it, as fio's null engine has, so
    gpufio lays nothing out for it."""
    return Target(path=NO_STORAGE, fd=-1, size=size, is_block=False, dio_align=1,
                  pattern_seed=None, facts={"kind": "none"})


def open_target(path: str, direct: bool, consent: WriteConsent | None = None,
                generic: bool = False) -> Target:
    """Open ``path`` (O_DIRECT when ``direct``) and gather its facts: read-only, or for
    writing when the job's ``consent`` passes the write guard for it. ``generic``: the job's
    engine sends NVMe commands, so ``path`` must be an NVMe namespace, and its generic char
    device is opened (open_namespace)."""
    if generic:
        return open_namespace(path, consent)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput(f"target {path}: does not exist") from None
    except OSError as e:
        raise BadInput(f"target {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"target {path}: is a directory, not a file or block device")
    is_block = stat.S_ISBLK(st.st_mode)
    if stat.S_ISREG(st.st_mode) and ram_backing(path) == "devtmpfs":
        raise BadInput(f"target {path}: is a regular file in /dev (RAM), not a block device; "
                       "remove it (an older gpufio created such files)")
    if stat.S_ISCHR(st.st_mode) and nvme_generic.lookup(path):
        raise BadInput(f"target {path}: is an NVMe generic char device, which only engines "
                       "that send NVMe commands read (fio's io_uring_cmd); name its block "
                       "device for this engine")
    if not (is_block or stat.S_ISREG(st.st_mode)):
        raise BadInput(f"target {path}: is neither a regular file nor a block device")
    if consent is not None:
        consent.check(path, is_block)
    flags = (os.O_RDONLY if consent is None else os.O_RDWR) | (os.O_DIRECT if direct else 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:
        need = "read" if consent is None else "read and write"
        raise BadInput(f"target {path}: permission denied (gpufio needs {need} access)") from None
    except OSError as e:
        if e.errno == errno.EINVAL and direct:
            raise BadInput(f"target {path}: its filesystem does not support O_DIRECT "
                           "(set direct = false to read through the page cache)") from None
        raise BadInput(f"target {path}: cannot open: {e.strerror}") from None
    size = os.lseek(fd, 0, os.SEEK_END)
    # holes are judged for the range a job reads, which it may write first (core/backing)
    facts = devinfo.path_facts(path, direct, extents=False)
    align = facts.get("dio_offset_align") or facts.get("logical_block_size") or 512
    return Target(path=path, fd=fd, size=size, is_block=is_block, dio_align=int(align),
                  pattern_seed=pattern.read_seed(_read_first_block(path)), facts=facts)


def open_namespace(path: str, consent: WriteConsent | None = None) -> Target:
    """Open the generic char device of the NVMe namespace ``path`` names (its /dev/ngXnY,
    or its block device /dev/nvmeXnY, which stands for the same namespace, as fio's
    io_uring_cmd users name it), for NVMe passthrough. Writes pass the write guard as the
    namespace's block device; ``write_device`` may name either node."""
    ns = nvme_generic.lookup(path)
    if ns is None:
        what = "does not exist" if not os.path.exists(path) else "is not an NVMe namespace"
        raise BadInput(f"target {path}: {what}; NVMe passthrough needs a namespace's generic "
                       "char device (/dev/ngXnY) or its block device (/dev/nvmeXnY)")
    if not ns.lba_bytes or not ns.size:
        raise BadInput(f"target {path}: sysfs gives no logical block size or size for "
                       f"{ns.block}, so its NVMe commands cannot be built")
    if consent is not None:
        confirmed = consent.device
        if confirmed and os.path.realpath(confirmed) == os.path.realpath(ns.generic):
            confirmed = ns.block  # the same namespace
        WriteConsent(consent.overwrite, confirmed).check(ns.block, True)
    try:
        fd = os.open(ns.generic, os.O_RDONLY if consent is None else os.O_RDWR)
    except PermissionError:
        need = "read" if consent is None else "read and write"
        raise BadInput(f"target {path}: permission denied on {ns.generic} (NVMe passthrough "
                       f"needs {need} access to it; Linux before 6.2 also CAP_SYS_ADMIN)") from None
    except OSError as e:
        raise BadInput(f"target {path}: cannot open {ns.generic}: {e.strerror}") from None
    try:
        nsid = nvme_generic.namespace_id(fd)
    except OSError as e:
        os.close(fd)
        raise BadInput(f"target {path}: {ns.generic} answers no NVMe namespace id "
                       f"(NVME_IOCTL_ID: {e.strerror})") from None
    facts = {**devinfo.path_facts(ns.block), "generic_device": ns.generic,
             "namespace": ns.block, "nsid": nsid, "lba_bytes": ns.lba_bytes,
             "poll_queues": ns.poll_queues, "max_transfer": ns.max_bytes}
    return Target(path=path, fd=fd, size=ns.size, is_block=True, dio_align=ns.lba_bytes,
                  pattern_seed=pattern.read_seed(_read_first_block_direct(ns.block)), facts=facts,
                  lba=ns.lba_bytes)


def check_region(target: Target, *, offset: int, size: int | None, bs: int, direct: bool,
                 need_pattern: bool) -> tuple[int, int]:
    """The (first byte, number of bs blocks) a job may touch on ``target``, or BadInput."""
    length = size if size is not None else target.size - offset
    if offset + max(length, 0) > target.size or length <= 0:
        fits = (target.size - offset) // bs * bs  # whole blocks past the offset
        fix = (f"--set size={size_spec(fits)} fits" + (f" after offset {size_spec(offset)}"
                                                       if offset else "")
               if fits > 0 else f"offset {size_spec(offset)} leaves no whole {bs}-byte block")
        raise BadInput(f"target {target.path}: is {format_size(target.size)} ({target.size} bytes), "
                       f"smaller than offset+size = {offset + max(length, 0)} bytes; {fix}")
    if target.lba:
        for key, value in (("bs", bs), ("offset", offset)):
            if value % target.lba:
                raise BadInput(f"target {target.path}: {key} {value} is not a multiple of its "
                               f"namespace's logical block size {target.lba} (NVMe commands "
                               "move whole blocks)")
        most = target.facts.get("max_transfer")
        if most and bs > most:
            raise BadInput(f"target {target.path}: bs {bs} is more than one NVMe command of "
                           f"this controller moves ({most} bytes, max_hw_sectors_kb)")
    elif direct:
        for key, value in (("bs", bs), ("offset", offset)):
            if value % target.dio_align:
                raise BadInput(f"target {target.path}: {key} {value} is not a multiple of its "
                               f"O_DIRECT alignment {target.dio_align} (or set direct = false)")
    if length < bs:
        raise BadInput(f"target {target.path}: region of {length} bytes holds no block of bs {bs}")
    if need_pattern and target.pattern_seed is None:
        raise BadInput(f"target {target.path}: does not carry gpufio's data pattern, so verify "
                       "cannot check it (create it with 'gpufio prepare')")
    return offset, length // bs


# ioctl(2) request that writes out and drops a block device's buffer cache (linux/fs.h)
BLKFLSBUF = 0x1261


def invalidate(targets: list[Target]) -> None:
    """fio's ``invalidate``: drop the targets' pages before a buffered job reads them, so
    its reads reach storage: posix_fadvise DONTNEED on a file, the buffer cache flushed
    (BLKFLSBUF) on a block device. As in fio, a target that will not let go (a device
    without CAP_SYS_ADMIN) gets a warning, not an error."""
    for t in targets:
        if t.fd < 0 or t.lba:  # no storage, or a namespace's char device: no page cache
            continue
        try:
            if t.is_block:
                fcntl.ioctl(t.fd, BLKFLSBUF)
            else:
                os.posix_fadvise(t.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            events.emit("advice", f"gpufio: warning: cannot drop the page cache of {t.path} "
                        f"(invalidate): {e.strerror}; its reads may come from memory")


def evict(paths: list[str] | tuple[str, ...]) -> None:
    """Drop the files' pages from the page cache (posix_fadvise DONTNEED), for cold runs."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory, suitable for O_DIRECT and for registration."""
    return mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def resolve(paths: tuple[str, ...]) -> list[str]:
    """Absolute target paths, in profile order, for messages and results."""
    return [str(Path(p).expanduser()) for p in paths]
