"""The node-feature table: values, file layout, striping over targets, and .npy inputs.

Row i holds node i's ``dim`` float32 features at i * row_bytes, as IGB's files do. With
several targets the rows are striped: node i lives on target i % n at row i // n, so each
drive serves an equal share of every mini-batch. Generated values are a pure function of
(seed, node, column), in [-1, 1), so any fetched row can be checked against the generator
without reading the file again.
"""

from __future__ import annotations

import os

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.pattern import seed_mix, splitmix64
from gpufio.core.rows import Layout

WRITE_ROWS = 4096


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
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise BadInput(f"feature file {path}: {e.strerror}") from None
    if size < need:
        raise BadInput(f"feature file {path}: {size} bytes, too small for {nodes} nodes "
                       f"({layout.rows_on(target, nodes)} rows of {layout.row_bytes} bytes "
                       f"from offset {layout.header} need {need})")


def write_share(path: str, target: int, layout: Layout, nodes: int, dim: int,
                seed: int, xp=np) -> None:
    """Write target ``target``'s rows of the striped generated table into ``path``; the
    values are computed with ``xp`` (CuPy makes a table of many GB take seconds, not
    minutes of NumPy)."""
    ids = np.arange(target, nodes, layout.ntargets, dtype=np.int64)
    with open(path, "wb") as f:
        f.truncate(layout.bytes_needed(target, nodes))
        for lo in range(0, len(ids), WRITE_ROWS):
            chunk = ids[lo:lo + WRITE_ROWS]
            rows = np.zeros((len(chunk), layout.row_bytes // 4), np.float32)
            vals = values(seed, xp.asarray(chunk), dim, xp)
            rows[:, :dim] = vals if xp is np else vals.get()
            f.seek(layout.header + lo * layout.row_bytes)
            f.write(rows.tobytes())
        os.fsync(f.fileno())  # written back, so evicting the file's pages really drops them


def holds_generated(path: str, target: int, layout: Layout, dim: int, seed: int) -> bool:
    """True if the first row in ``path`` is the generator's row for its node."""
    with open(path, "rb") as f:
        f.seek(layout.header)
        row = np.frombuffer(f.read(dim * 4), dtype=np.float32)
    return len(row) == dim and bool(np.array_equal(row, values(seed, np.array([target]), dim)[0]))


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
