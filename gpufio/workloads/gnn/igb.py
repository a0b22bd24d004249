"""Real IGB data (``dataset = "igb"``): the paper nodes of an IGB download, as the GNN
workload reads them.

IGB's layout: ``<igb_root>/<igb_size>/processed/paper/node_feat.npy`` (float32 [N, 1024]),
``.../paper/node_label_19.npy`` (N labels) and ``.../paper__cites__paper/edge_index.npy``
(int64 [E, 2]). The ``large`` and ``full`` feature files are headerless float32 rows despite
their ``.npy`` name (IGB's own loader memmaps them without a header), so the kind is told
by the file's size, never by its name. The citation graph becomes CSR (both directions, self
loops and duplicates dropped, as for the generated graph) once, and is cached in gpufio's
scratch directory: nothing is ever written into the user's IGB directory.
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

SIZES = ("tiny", "small", "medium", "large", "full")
_MAGIC = b"\x93NUMPY"


@dataclass(frozen=True)
class IgbData:
    """The paper nodes' graph, feature file and where its first row starts."""

    graph: Graph
    features: str
    header: int


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


def csr(edges: np.ndarray, nodes: int) -> Graph:
    """Both directions of every citation, self loops and duplicates dropped, as CSR."""
    src, dst = np.asarray(edges[:, 0], np.int64), np.asarray(edges[:, 1], np.int64)
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= nodes):
        raise BadInput(f"IGB data: edge_index names nodes outside 0..{nodes - 1}")
    return from_keys(edge_keys(src, dst, nodes), nodes)


def load(root: str, size: str, dim: int, cache: Path) -> IgbData:
    """The paper nodes of ``<root>/<size>``; the CSR is built once and cached in ``cache``
    under a name keyed by the edge file's path, size and modification time."""
    base = Path(root).expanduser() / size / "processed"
    feats = _need(base / "paper" / "node_feat.npy")
    labels = _array(_need(base / "paper" / "node_label_19.npy"), "label array")
    edge_path = _need(base / "paper__cites__paper" / "edge_index.npy")
    nodes = len(labels)
    header = feature_layout(feats, nodes, dim)
    st = edge_path.stat()
    key = hashlib.sha256(f"{edge_path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    path = cache / f"gnn-graph-igb-{size}-{key.hexdigest()[:12]}.npz"
    if path.exists():
        with np.load(path) as z:
            graph = Graph(z["indptr"], z["indices"])
    else:
        edges = _array(edge_path, "edge index")
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise BadInput(f"IGB data: {edge_path}: shape {edges.shape}, expected (E, 2)")
        graph = csr(edges, nodes)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, indptr=graph.indptr, indices=graph.indices)
        tmp.replace(path)
    return IgbData(graph, str(feats), header)
