"""What a job does with a target whose reads would not reach storage (facts/storage says
which): it reads a file's holes or unwritten extents only when it says ``allow_unbacked``,
as the write guard writes only with consent; anything else not storage (RAM, the page
cache) runs, with a warning before it and the target's ``storage`` fact in the result."""

from __future__ import annotations

from gpufio.core import events
from gpufio.core.errors import BadInput
from gpufio.core.targets import Target
from gpufio.facts import storage

# what a read of these returns is zeros the filesystem makes up: no drive is read
UNBACKED = (storage.HOLES, storage.UNWRITTEN)


def judge(target: Target, *, offset: int, length: int, buffered: bool, reads_existing: bool,
          allow_unbacked: bool) -> None:
    """Classify bytes [offset, offset + length) of ``target`` as the job reads them
    (``buffered``: through the page cache; ``reads_existing``: it reads data it has not
    written first, so holes matter), record it as the target's ``storage`` fact and warn
    when its reads would not reach storage. BadInput for holes or unwritten extents read
    without ``allow_unbacked``."""
    path = target.facts.get("namespace") or target.path
    found = storage.classify(path, offset, length, direct=not buffered, extents=reads_existing)
    target.facts["storage"] = found.as_dict()
    if found.kind in UNBACKED and not allow_unbacked:
        raise BadInput(f"target {target.path}: {found.reason}; write it first, or set "
                       "allow_unbacked = true to measure it anyway")
    if not found.reaches_storage:
        events.emit("warning", f"gpufio: warning: target {target.path}: {found.kind}, not "
                               f"storage: {found.reason}")
