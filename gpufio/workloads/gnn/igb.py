"""Real IGB data (``dataset = "igb"``): the paper nodes of an IGB download, as the GNN
workload reads them.

IGB's layout: ``<igb_root>/<igb_size>/processed/paper/node_feat.npy`` (float32 [N, 1024]),
``.../paper/node_label_19.npy`` (N labels) and ``.../paper__cites__paper/edge_index.npy``
(int64 [E, 2]). The ``large`` and ``full`` feature files are headerless float32 rows despite
their ``.npy`` name (IGB's own loader memmaps them without a header), so the kind is told
by the file's size, never by its name. The citation graph becomes CSR (both directions, self
loops and duplicates dropped, as for the generated graph) once, and is cached in gpufio's
scratch directory: nothing is ever written into the user's IGB directory.

Heterogeneous (``igb_hetero``, IGBH): the node types paper, author, fos and institute (and
journal and conference where the download has them, as IGBH600M does) get global ids in
GIDS's order, each type's ids starting at the sum of the counts before it (GIDS's
``key_offset``), and their features one table in that order, as GIDS's users write them to
the SSD: gpufio builds that table once in its scratch directory (a kernel-side copy of each
type's rows) and reuses it. Every relation's edges join one CSR over the global ids, both
directions; the mini-batches' seeds are papers, the only labelled type.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.workloads.gnn.features import npy_header
from gpufio.workloads.gnn.graph import Graph, edge_keys, from_keys

_MAGIC = b"\x93NUMPY"


# GIDS's order of IGBH's node types (its key_offset); the last two only in IGBH600M-style
# downloads
NODE_TYPES = ("paper", "author", "fos", "institute", "journal", "conference")
OPTIONAL_TYPES = ("journal", "conference")
RELATIONS = {"paper__cites__paper": ("paper", "paper"),
             "paper__written_by__author": ("paper", "author"),
             "author__affiliated_to__institute": ("author", "institute"),
             "paper__topic__fos": ("paper", "fos"),
             "paper__published__journal": ("paper", "journal"),
             "paper__venue__conference": ("paper", "conference")}
COPY_CHUNK = 1 << 30


@dataclass(frozen=True)
class IgbData:
    """The graph, the feature file and where its first row starts; the seed nodes (papers:
    ids 0 to ``seeds``) and, for IGBH, each node type's first global id."""

    graph: Graph
    features: str
    header: int
    seeds: int
    offsets: dict[str, int] | None = None


def _need(path: Path) -> Path:
    if not path.is_file():
        raise BadInput(f"IGB data: {path} is missing (expected IGB's layout "
                       "<igb_root>/<igb_size>/processed/...)")
    return path


def _array(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError) as e:
        raise BadInput(f"IGB data: {path}: not a readable .npy {what} ({e})") from None


def feature_layout(path: Path, nodes: int, dim: int) -> int:
    """The byte where the first feature row starts: 0 for a headerless file of exactly
    ``nodes`` rows of ``dim`` float32, else the .npy header's length (checked against the
    shape and dtype it declares); BadInput when it is neither."""
    size = path.stat().st_size
    if size == nodes * dim * 4:
        return 0
    with open(path, "rb") as f:
        magic = f.read(len(_MAGIC))
    if magic != _MAGIC:
        raise BadInput(f"IGB data: {path}: {size} bytes, neither {nodes} headerless rows of "
                       f"{dim} float32 ({nodes * dim * 4} bytes) nor a .npy file")
    header, shape, dtype = npy_header(str(path))
    if dtype != np.float32 or tuple(shape) != (nodes, dim) or size < header + nodes * dim * 4:
        raise BadInput(f"IGB data: {path}: holds {dtype} {tuple(shape)} in {size} bytes; the "
                       f"{nodes} papers need float32 ({nodes}, {dim}) (key 'feature_dim')")
    return header


def type_rows(path: Path, dim: int) -> tuple[int, int]:
    """(rows, header bytes) of a node type's feature file: a .npy by its magic, else
    headerless float32 rows that must fill the file exactly."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(len(_MAGIC))
    if magic == _MAGIC:
        header, shape, dtype = npy_header(str(path))
        if dtype != np.float32 or len(shape) != 2 or shape[1] != dim:
            raise BadInput(f"IGB data: {path}: holds {dtype} {tuple(shape)}; expected float32 "
                           f"rows of {dim} (key 'feature_dim')")
        if size < header + shape[0] * dim * 4:
            raise BadInput(f"IGB data: {path}: truncated: {size} bytes, its header declares "
                           f"{shape[0]} rows ({header + shape[0] * dim * 4} bytes)")
        return int(shape[0]), header
    if size % (dim * 4):
        raise BadInput(f"IGB data: {path}: {size} bytes is not a whole number of headerless "
                       f"rows of {dim} float32 (truncated, or another key 'feature_dim')")
    return size // (dim * 4), 0


def csr(edges: np.ndarray, nodes: int) -> Graph:
    """Both directions of every citation, self loops and duplicates dropped, as CSR."""
    src, dst = np.asarray(edges[:, 0], np.int64), np.asarray(edges[:, 1], np.int64)
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= nodes):
        raise BadInput(f"IGB data: edge_index names nodes outside 0..{nodes - 1}")
    return from_keys(edge_keys(src, dst, nodes), nodes)


def _cached_graph(path: Path, build) -> Graph:
    """The CSR cached at ``path``, or ``build()`` saved there first."""
    if path.exists():
        with np.load(path) as z:
            return Graph(z["indptr"], z["indices"])
    graph = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, indptr=graph.indptr, indices=graph.indices)
    tmp.replace(path)
    return graph


def _key(paths: list[Path]) -> str:
    """A name part keyed by the files' paths, sizes and modification times."""
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:12]


def _edges(path: Path) -> np.ndarray:
    edges = _array(path, "edge index")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise BadInput(f"IGB data: {path}: shape {edges.shape}, expected (E, 2)")
    return edges


def load(root: str, size: str, dim: int, cache: Path, hetero: bool = False,
         allow_large: bool = False) -> IgbData:
    """The paper nodes of ``<root>/<size>`` (with ``hetero``: every node type, see
    ``load_hetero``; ``allow_large``: the job's consent to a large table copy); the CSR is
    built once and cached in ``cache`` under a name keyed by the edge file's path, size and
    modification time."""
    if hetero:
        return load_hetero(root, size, dim, cache, allow_large)
    base = Path(root).expanduser() / size / "processed"
    feats = _need(base / "paper" / "node_feat.npy")
    labels = _array(_need(base / "paper" / "node_label_19.npy"), "label array")
    edge_path = _need(base / "paper__cites__paper" / "edge_index.npy")
    nodes = len(labels)
    header = feature_layout(feats, nodes, dim)
    graph = _cached_graph(cache / f"gnn-graph-igb-{size}-{_key([edge_path])}.npz",
                          lambda: csr(_edges(edge_path), nodes))
    return IgbData(graph, str(feats), header, nodes)


def load_hetero(root: str, size: str, dim: int, cache: Path,
                allow_large: bool = False) -> IgbData:
    """Every node type of ``<root>/<size>``, global ids in GIDS's order: one CSR over all
    relations and one feature table in ``cache`` (both built once, keyed by the files)."""
    base = Path(root).expanduser() / size / "processed"
    ntypes = [t for t in NODE_TYPES if t not in OPTIONAL_TYPES or (base / t).is_dir()]
    feats = {t: _need(base / t / "node_feat.npy") for t in ntypes}
    papers = len(_array(_need(base / "paper" / "node_label_19.npy"), "label array"))
    rows = {t: type_rows(feats[t], dim) for t in ntypes}
    if rows["paper"][0] != papers:
        raise BadInput(f"IGB data: {feats['paper']}: {rows['paper'][0]} rows for "
                       f"{papers} paper labels")
    offsets, total = {}, 0
    for t in ntypes:
        offsets[t], total = total, total + rows[t][0]
    rels = {r: _need(base / r / "edge_index.npy") for r, (a, b) in RELATIONS.items()
            if a in offsets and b in offsets}

    def build() -> Graph:
        keys = []
        for rel, path in rels.items():
            a, b = RELATIONS[rel]
            e = _edges(path)
            src, dst = np.asarray(e[:, 0], np.int64), np.asarray(e[:, 1], np.int64)
            for ids, t in ((src, a), (dst, b)):
                if len(ids) and (ids.min() < 0 or ids.max() >= rows[t][0]):
                    raise BadInput(f"IGB data: {path}: names {t} nodes outside "
                                   f"0..{rows[t][0] - 1}")
            keys.append(edge_keys(src + offsets[a], dst + offsets[b], total))
        return from_keys(np.concatenate(keys), total)

    files = [feats[t] for t in ntypes]
    graph = _cached_graph(cache / f"gnn-graph-igbh-{size}-{_key(list(rels.values()))}.npz",
                          build)
    table = cache / f"gnn-features-igbh-{size}-{dim}-{_key(files)}.f32"
    if not table.exists() or table.stat().st_size != total * dim * 4:
        _concatenate(table, [(feats[t], rows[t][1], rows[t][0] * dim * 4) for t in ntypes],
                     allow_large)
    return IgbData(graph, str(table), 0, papers, offsets)


def _concatenate(table: Path, parts: list[tuple[Path, int, int]], allow_large: bool) -> None:
    """Write each (file, first byte, bytes) part after the other into ``table``, copied in
    the kernel (copy_file_range), through a temporary name so a cut-short copy is never
    taken for the table; a large share of the free space only with consent."""
    from gpufio.core import events, space

    total = sum(n for _, _, n in parts)
    space.check_layout(str(table), total, allow_large)
    events.emit("layout", f"gpufio: writing IGBH's features as one table to {table} "
                f"({total / 1e9:.1f} GB, once; later runs reuse it)")
    table.parent.mkdir(parents=True, exist_ok=True)
    tmp = table.with_suffix(f".{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for path, start, nbytes in parts:
                with open(path, "rb") as src:
                    done = 0
                    while done < nbytes:
                        n = os.copy_file_range(src.fileno(), out.fileno(),
                                               min(COPY_CHUNK, nbytes - done), start + done)
                        if n == 0:
                            raise BadInput(f"IGB data: {path}: ended {done} bytes into its "
                                           f"{nbytes} bytes of rows")
                        done += n
        tmp.replace(table)
    finally:
        tmp.unlink(missing_ok=True)
