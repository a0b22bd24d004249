"""Disk space: a layout that takes a large share of a filesystem's free space is laid out
only with the user's consent.

A user who typed ``runtime=2s`` does not expect gpufio to fill 10 GiB first (fio's example
job files ask for 10g). Code that lays files out calls ``check_layout`` before writing; the
CLI says how consent is given for the run (``answering``: ``--yes``, or a question on a
TTY), and what shows on the terminal meanwhile (the live table) steps aside while the
question is asked (``aside``). A job gives its own consent with ``allow_large_layout``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

from gpufio.core.errors import BadInput
from gpufio.core.units import format_size

# the share of the free space a layout may take without asking
SHARE = 0.10

# question -> the user's yes or no
Ask = Callable[[str], bool]

_ask: Ask | None = None
_yes = False
_aside: list[Callable[[], AbstractContextManager[None]]] = []
# the paths the user has said yes to in this block (not asked again file by file)
_granted: set[str] = set()


@contextmanager
def answering(ask: Ask | None, yes: bool) -> Iterator[None]:
    """For the block: ``yes`` consents to every layout (--yes); otherwise ``ask`` asks the
    user (None: no one to ask, a large layout is refused)."""
    global _ask, _yes
    previous = _ask, _yes, set(_granted)
    _ask, _yes = ask, yes
    try:
        yield
    finally:
        _ask, _yes = previous[:2]
        _granted.clear()
        _granted.update(previous[2])


@contextmanager
def aside(pause: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """For the block: ``pause()`` is entered while a question is asked (a live display
    stops redrawing over it)."""
    _aside.append(pause)
    try:
        yield
    finally:
        _aside.remove(pause)


def _existing_dir(path: str) -> str:
    """The nearest existing directory ``path`` will be created under."""
    where = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(where) and where != os.path.dirname(where):
        where = os.path.dirname(where)
    return where


def free_bytes(path: str) -> int:
    """The bytes an unprivileged writer may still use on the filesystem ``path`` will be
    created on."""
    vfs = os.statvfs(_existing_dir(path))
    return vfs.f_bavail * vfs.f_frsize


def check_layout(path: str, nbytes: int, allowed: bool) -> None:
    """BadInput unless laying out ``nbytes`` more at ``path`` may go ahead (``check_layouts``)."""
    check_layouts([(path, nbytes)], allowed)


def check_layouts(layouts: list[tuple[str, int]], allowed: bool) -> None:
    """BadInput unless laying out each (path, bytes) may go ahead: what goes onto one
    filesystem fits, and takes at most SHARE of its free space, or the job (``allowed``) or
    the user consents (asked once for all of it)."""
    groups: dict[int, list[tuple[str, int]]] = {}
    for path, nbytes in layouts:
        try:
            fs = os.stat(_existing_dir(path)).st_dev
        except OSError:
            continue  # an unreadable directory is the caller's error to report, when it writes
        groups.setdefault(fs, []).append((path, nbytes))
    for group in groups.values():
        _check_group(group, allowed)


def _check_group(group: list[tuple[str, int]], allowed: bool) -> None:
    paths = [p for p, _ in group]
    nbytes = sum(n for _, n in group)
    try:
        free = free_bytes(paths[0])
    except OSError:
        return
    what = paths[0] if len(paths) == 1 else f"{paths[0]} and {len(paths) - 1} more"
    where = f"target {what}: laying {'it' if len(paths) == 1 else 'them'} out writes " \
            f"{format_size(nbytes)}"
    if nbytes > free:
        raise BadInput(f"{where}, more than the {format_size(free)} free on its filesystem")
    if nbytes <= SHARE * free or allowed or _yes or _granted.issuperset(paths):
        return
    share = f"{100 * nbytes / free:.0f}% of the {format_size(free)} free on its filesystem"
    if _ask is not None:
        with ExitStack() as stack:
            for pause in _aside:
                stack.enter_context(pause())
            if _ask(f"gpufio: {where}, {share}. Lay {'it' if len(paths) == 1 else 'them'} "
                    "out?"):
                _granted.update(paths)
                return
        raise BadInput(f"{where}, {share}: not laid out (declined)")
    raise BadInput(f"{where}, {share} (more than {SHARE:.0%}); confirm with --yes or "
                   "allow_large_layout = true, or give a smaller size")
