"""fio's I/O logs (iologs): the GNN workload writes its aggregation reads as one (version 2),
and a block job replays one (``read_iolog``), so that fio itself and every gpufio engine can
run the very same reads.

Version 2, as fio's ``write_iolog`` writes it (fio's HOWTO, "I/O replay")::

    fio version 2 iolog
    /data/feat.bin add
    /data/feat.bin open
    /data/feat.bin read 40960 4096
    /data/feat.bin close

Version 3 puts a timestamp in ms before each line; gpufio replays without stalling (as
fio's ``replay_no_stall``), so it reads those timestamps and sets them aside. Every problem
in a log is one line naming the file, the line and what is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TextIO

import numpy as np

from gpufio.core.errors import BadInput

HEADERS = {"fio version 2 iolog": 2, "fio version 3 iolog": 3}
FILE_ACTIONS = ("add", "open", "close")
IO_ACTIONS = {"read": False, "write": True}
# actions fio logs that move no data: a replay keeps none of them (said in the result)
SKIPPED = ("sync", "datasync", "trim", "wait")


@dataclass(frozen=True)
class Trace:
    """A log's I/Os in order: each one's file (index into ``files``), offset, length and
    direction."""

    files: tuple[str, ...]
    tgt: np.ndarray
    offs: np.ndarray
    lens: np.ndarray
    writes: np.ndarray
    version: int
    skipped: int


def read(path: str) -> Trace:
    """The trace in ``path`` (cached by path, size and modification time)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise BadInput(f"read_iolog {path}: {e.strerror}") from None
    return _read(path, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4)
def _read(path: str, size: int, mtime: int) -> Trace:
    files: list[str] = []
    index: dict[str, int] = {}
    tgt, offs, lens, writes = [], [], [], []
    skipped = 0
    with open(path) as f:
        version = HEADERS.get(f.readline().strip())
        if version is None:
            raise BadInput(f"read_iolog {path}: line 1: not an fio iolog (expected "
                           f"'fio version 2 iolog' or 'fio version 3 iolog')")
        for n, line in enumerate(f, start=2):
            words = line.split()
            if not words:
                continue
            if version == 3:
                words = words[1:]  # the timestamp: a replay does not stall on it
            where = f"read_iolog {path}: line {n}"
            if len(words) == 2 and words[1] in FILE_ACTIONS:
                if words[1] == "add" and words[0] not in index:
                    index[words[0]] = len(files)
                    files.append(words[0])
                continue
            if len(words) >= 2 and words[1] in SKIPPED:
                skipped += 1
                continue
            if len(words) != 4 or words[1] not in IO_ACTIONS:
                raise BadInput(f"{where}: expected 'FILE read|write OFFSET LENGTH', got "
                               f"{line.strip()!r}")
            if words[0] not in index:
                raise BadInput(f"{where}: {words[0]} was never added ('{words[0]} add')")
            try:
                off, length = int(words[2]), int(words[3])
            except ValueError:
                raise BadInput(f"{where}: offset and length must be integers, got "
                               f"{words[2]!r} {words[3]!r}") from None
            if off < 0 or length <= 0:
                raise BadInput(f"{where}: offset {off} and length {length} must be >= 0 and > 0")
            tgt.append(index[words[0]])
            offs.append(off)
            lens.append(length)
            writes.append(IO_ACTIONS[words[1]])
    if not tgt:
        raise BadInput(f"read_iolog {path}: no read or write to replay")
    return Trace(tuple(files), np.array(tgt, np.int32), np.array(offs, np.uint64),
                 np.array(lens, np.uint32), np.array(writes, bool), version, skipped)


class Writer:
    """A version 2 log of reads over ``files``, written as they come (``reads``) and closed
    with each file's close."""

    def __init__(self, path: str, files: list[str]) -> None:
        self.path, self._files = path, [os.path.abspath(p) for p in files]
        try:
            self._f: TextIO = open(path, "w")
        except OSError as e:
            raise BadInput(f"gnn_iolog {path}: {e.strerror}") from None
        self._f.write("fio version 2 iolog\n")
        for p in self._files:
            self._f.write(f"{p} add\n")
        for p in self._files:
            self._f.write(f"{p} open\n")
        self.entries = 0

    def reads(self, tgt: np.ndarray, offs: np.ndarray, length: int) -> None:
        """One read of ``length`` bytes per (target index, offset), in order."""
        names = np.array(self._files, dtype=object)[np.asarray(tgt, np.int64)]
        self._f.writelines(f"{name} read {int(off)} {length}\n"
                           for name, off in zip(names.tolist(), np.asarray(offs).tolist()))
        self.entries += len(offs)

    def close(self) -> None:
        if self._f.closed:
            return
        for p in self._files:
            self._f.write(f"{p} close\n")
        self._f.close()
