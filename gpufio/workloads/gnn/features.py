"""The node-feature table: values, file layout, striping over targets, and .npy inputs.

Row i holds node i's ``dim`` float32 features at i * row_bytes, as IGB's files do. With
several targets the rows are striped (core/rows.Layout): as BaM stripes its pages, 4 KiB
page i of the table on target i % n (``stripe = "page"``; a row of 4 KiB or more, or one
that does not divide a page, is a stripe of its own), or row i on target i % n
(``stripe = "row"``), so each drive serves an equal share of every mini-batch. Generated
values are a pure function of (seed, node, column), in [-1, 1), so any fetched row can be
checked against the generator
without reading the file again.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from gpufio.core import events
from gpufio.core.errors import BadInput
from gpufio.core.pattern import seed_mix, splitmix64
from gpufio.core.rows import Layout
from gpufio.core.targets import aligned_buffer

# bytes a generated table is written in: large sequential writes, two buffers taking turns
# (one written while the next is generated)
WRITE_BYTES = 64 << 20
PROGRESS_S = 2.0


PAGE = 4096


def stripe_rows(row_bytes: int, stripe: str) -> int:
    """Rows a stripe holds: a page's worth for ``stripe = "page"`` where rows divide a page,
    else one."""
    if stripe == "page" and row_bytes < PAGE and PAGE % row_bytes == 0:
        return PAGE // row_bytes
    return 1


def target_counts(layout: Layout, nodes: np.ndarray) -> np.ndarray:
    """How many of ``nodes`` (host ids) each target holds: the rows asked of each drive."""
    tgt, _ = layout.locate(nodes)
    return np.bincount(tgt, minlength=layout.ntargets)


def values(seed: int, nodes: np.ndarray, dim: int, xp=np) -> "np.ndarray":
    """Feature rows of ``nodes`` (any int array), shape (len(nodes), dim), float32."""
    n = xp.asarray(nodes, dtype=xp.uint64)
    z = (n[:, None] * xp.uint64(dim) + xp.arange(dim, dtype=xp.uint64)[None, :])
    z = splitmix64(z ^ seed_mix(seed))  # the data pattern's mixing, over (node, column)
    return ((z >> xp.uint64(40)).astype(xp.float32) / xp.float32(1 << 23) - xp.float32(1.0))


def npy_header(path: str) -> tuple[int, tuple[int, ...], np.dtype]:
    """(data offset, shape, dtype) of a .npy file, read from its header."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(f)
        if fortran:
            raise BadInput(f"feature file {path}: Fortran-ordered .npy is not row-major")
        return f.tell(), shape, dtype


def check_file(path: str, layout: Layout, target: int, nodes: int) -> None:
    """BadInput unless ``path`` holds every row the layout puts on it."""
    need = layout.bytes_needed(target, nodes)
    try:  # its end, not st_size: a device's (a namespace the table is laid out on) is 0
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    except OSError as e:
        raise BadInput(f"feature file {path}: {e.strerror}") from None
    if size < need:
        raise BadInput(f"feature file {path}: {size} bytes, too small for {nodes} nodes "
                       f"({layout.rows_on(target, nodes)} rows of {layout.row_bytes} bytes "
                       f"from offset {layout.header} need {need})")


def write_share(path: str, target: int, layout: Layout, nodes: int, dim: int,
                seed: int, xp=np) -> None:
    """Write target ``target``'s rows of the striped generated table into ``path``, at
    storage speed: the values are computed with ``xp`` (on the GPU with CuPy) into one of
    two host buffers (pinned for CuPy) while a thread writes the other with large
    sequential writes (O_DIRECT where the rows are page-aligned), with progress lines
    giving the rate and the time left."""
    ids = layout.rows_of(target, nodes)
    per = max(1, WRITE_BYTES // layout.row_bytes)
    total = layout.bytes_needed(target, nodes)
    direct = layout.header % 4096 == 0 and (per * layout.row_bytes) % 4096 == 0
    bufs = [_host_buffer(per * layout.row_bytes, xp) for _ in range(2)]
    with open(path, "wb") as f:
        f.truncate(total)
    fds = [_open_for_writes(path, direct)]
    if direct:  # the last piece need not be page-aligned: it goes through the page cache
        fds.append(_open_for_writes(path, False))
    writer = _Writer(path, total)
    try:
        for k, lo in enumerate(range(0, len(ids), per)):
            chunk = ids[lo:lo + per]
            buf = bufs[k % 2]
            writer.wait_free(k % 2)
            rows = np.frombuffer(buf, np.float32, len(chunk) * layout.row_bytes // 4)
            rows = rows.reshape(len(chunk), layout.row_bytes // 4)
            vals = values(seed, xp.asarray(chunk), dim, xp)
            if xp is np:
                rows[:, :dim] = vals
            elif rows.shape[1] == dim:
                vals.get(out=rows)  # straight into the pinned buffer
            else:
                rows[:, :dim] = vals.get()
            nbytes = len(chunk) * layout.row_bytes
            writer.put(k % 2, fds[-1] if nbytes % 4096 else fds[0], memoryview(buf)[:nbytes],
                       layout.header + lo * layout.row_bytes)
        writer.finish()
        os.fsync(fds[0])  # written back, so evicting the file's pages really drops them
    finally:
        writer.close()  # no write may still be using a descriptor closed here
        for fd in fds:
            os.close(fd)


def _host_buffer(nbytes: int, xp) -> Any:
    """A page-aligned host buffer: pinned memory for CuPy's copies, else an anonymous map."""
    if xp is not np:
        import cupyx

        # pinned memory comes from a pool that aligns to less than a page (O_DIRECT's need)
        whole = cupyx.empty_pinned((nbytes + 4096,), np.uint8)
        skip = -whole.ctypes.data % 4096
        return whole[skip:skip + nbytes]
    return aligned_buffer(nbytes)


def _open_for_writes(path: str, direct: bool) -> int:
    """A descriptor writing ``path``: O_DIRECT where asked and the filesystem takes it."""
    if direct:
        try:
            return os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError:  # a filesystem without O_DIRECT: through the page cache
            pass
    return os.open(path, os.O_WRONLY)


class _Writer:
    """The writing thread: each put buffer is written through its descriptor at its offset
    while the next one is generated; wait_free(b) returns once buffer b is written; progress
    lines on the way."""

    def __init__(self, path: str, total: int) -> None:
        import queue
        import threading

        self._path, self._total, self.done = path, total, 0
        self._queue: Any = queue.Queue(maxsize=1)
        self._free = [threading.Event(), threading.Event()]
        for e in self._free:
            e.set()
        self._error: BaseException | None = None
        self._t0 = self._shown = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gnn-writer")
        self._thread.start()

    def put(self, b: int, fd: int, data: memoryview, offset: int) -> None:
        self._free[b].clear()
        self._queue.put((b, fd, data, offset))

    def wait_free(self, b: int) -> None:
        self._free[b].wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Let the queued writes end and the thread with them."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def finish(self) -> None:
        """close(), then raise what a write raised."""
        self.close()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            b, fd, data, offset = item
            try:
                while len(data):
                    n = os.pwrite(fd, data, offset)
                    data, offset = data[n:], offset + n
                    self.done += n
                self._progress()
            except BaseException as e:  # raised in the generating thread
                self._error = e
            finally:
                self._free[b].set()

    def _progress(self) -> None:
        now = time.perf_counter()
        if now - self._shown < PROGRESS_S and self.done < self._total:
            return
        self._shown = now
        rate = self.done / max(now - self._t0, 1e-9)
        left = (self._total - self.done) / rate if rate else 0.0
        events.emit("progress", f"gpufio: {self._path}: {self.done / 1e9:.1f} of "
                                f"{self._total / 1e9:.1f} GB, {rate / 1e9:.2f} GB/s, "
                                f"{left:.0f} s left")


def holds_generated(path: str, target: int, layout: Layout, dim: int, seed: int) -> bool:
    """True if the first row in ``path`` is the generator's row for its node."""
    with open(path, "rb") as f:
        f.seek(layout.header)
        row = np.frombuffer(f.read(dim * 4), dtype=np.float32)
    first = np.array([target * layout.stripe_rows])
    return len(row) == dim and bool(np.array_equal(row, values(seed, first, dim)[0]))


def file_rows(paths: list[str], layout: Layout, nodes: np.ndarray, dim: int) -> np.ndarray:
    """The rows of ``nodes`` as the files hold them (float32, ``dim`` columns), read with
    NumPy, to check what an engine fetched from files gpufio did not generate."""
    ids = np.asarray(nodes, dtype=np.int64)
    out = np.empty((len(ids), dim), np.float32)
    tgt, off = layout.locate(ids)
    for t, path in enumerate(paths):
        mine = np.flatnonzero(tgt == t)
        if not len(mine):
            continue
        table = np.memmap(path, dtype=np.uint8, mode="r")
        rows = off[mine][:, None] + np.arange(dim * 4)[None, :]
        out[mine] = table[rows].view(np.float32).reshape(len(mine), dim)
    return out
