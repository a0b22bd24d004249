"""The SSD list: resolve, create, open and check the targets a job reads.

gpufio never writes to a target that exists: it only creates missing files (filled with
the self-describing pattern, written under a temporary name and renamed when complete, so an
interrupted fill never looks ready). Existing files and block devices are opened read-only.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpufio import devinfo, pattern
from gpufio.errors import BadInput
from gpufio.units import format_size

FILL_CHUNK = 8 << 20


def default_scratch_dir() -> str:
    """Where auto-created target files go when a profile names neither targets nor directory."""
    env = os.environ.get("GPUFIO_SCRATCH")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpufio")


def auto_target_path(directory: str | None, nbytes: int, seed: int) -> str:
    """The scratch file a job without targets uses; its name says its size and seed."""
    base = directory or default_scratch_dir()
    return os.path.join(base, f"gpufio-{nbytes}-seed{seed}.dat")


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

    def close(self) -> None:
        """Close the descriptor; safe to call twice."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create_file(path: str, nbytes: int, seed: int,
                progress: Callable[[int, int], None] | None = None) -> None:
    """Create ``path`` holding ``nbytes`` of the pattern; refuses to touch an existing path."""
    if os.path.lexists(path):
        raise BadInput(f"target {path}: already exists; gpufio never overwrites a target")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise BadInput(f"target {path}: cannot create directory {parent}: {e.strerror}") from None
    tmp = f"{path}.partial-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        raise BadInput(f"target {path}: cannot create: {e.strerror}") from None
    try:
        done = 0
        while done < nbytes:
            n = min(FILL_CHUNK, nbytes - done)
            os.write(fd, pattern.fill(seed, done, n))
            done += n
            if progress:
                progress(done, nbytes)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as e:
        os.close(fd)
        os.unlink(tmp)
        raise BadInput(f"target {path}: cannot fill: {e.strerror}") from None
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def _stderr_progress(path: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if done == total or done % (256 << 20) == 0:
            print(f"gpufio: laying out {path}: {format_size(done)} of {format_size(total)}",
                  file=sys.stderr, flush=True)
    return report


def ensure_exists(path: str, nbytes: int | None, seed: int, quiet: bool = False) -> bool:
    """Create ``path`` if missing (True when created); BadInput if it cannot be."""
    if os.path.lexists(path):
        return False
    if nbytes is None:
        raise BadInput(f"target {path}: does not exist, and the job gives no size to create it with")
    create_file(path, nbytes, seed, None if quiet else _stderr_progress(path))
    return True


def _read_first_block(path: str) -> bytes:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(pattern.BLOCK)
    except OSError:
        return b""


def open_target(path: str, direct: bool) -> Target:
    """Open ``path`` read-only (O_DIRECT when ``direct``) and gather its facts."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput(f"target {path}: does not exist") from None
    except OSError as e:
        raise BadInput(f"target {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"target {path}: is a directory, not a file or block device")
    is_block = stat.S_ISBLK(st.st_mode)
    if not (is_block or stat.S_ISREG(st.st_mode)):
        raise BadInput(f"target {path}: is neither a regular file nor a block device")
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:
        raise BadInput(f"target {path}: permission denied (gpufio needs read access)") from None
    except OSError as e:
        if e.errno == errno.EINVAL and direct:
            raise BadInput(f"target {path}: its filesystem does not support O_DIRECT "
                           "(set direct = false to read through the page cache)") from None
        raise BadInput(f"target {path}: cannot open: {e.strerror}") from None
    size = os.lseek(fd, 0, os.SEEK_END)
    facts = devinfo.path_facts(path)
    align = facts.get("dio_offset_align") or facts.get("logical_block_size") or 512
    return Target(path=path, fd=fd, size=size, is_block=is_block, dio_align=int(align),
                  pattern_seed=pattern.read_seed(_read_first_block(path)), facts=facts)


def check_region(target: Target, *, offset: int, size: int | None, bs: int, direct: bool,
                 need_pattern: bool) -> tuple[int, int]:
    """The (first byte, number of bs blocks) a job may touch on ``target``, or BadInput."""
    length = size if size is not None else target.size - offset
    if offset + max(length, 0) > target.size or length <= 0:
        raise BadInput(f"target {target.path}: is {format_size(target.size)} ({target.size} bytes), "
                       f"smaller than offset+size = {offset + max(length, 0)} bytes")
    if direct:
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


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory, suitable for O_DIRECT and for registration."""
    return mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def resolve(paths: tuple[str, ...]) -> list[str]:
    """Absolute target paths, in profile order, for messages and results."""
    return [str(Path(p).expanduser()) for p in paths]
