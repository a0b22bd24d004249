"""An IGB-shaped synthetic graph: power-law degrees like a citation graph, as CSR, seeded.

Chung-Lu style: every node gets a weight drawn from a Pareto distribution; each edge picks
its citing and cited node with probability proportional to weight, so degrees follow the
weights' heavy tail (a few nodes cited thousands of times, most a handful). The CSR lists,
for each node, the nodes it is connected to (in- and out-edges: a sampler walks both ways,
as GNN loaders do on citation graphs). Self loops and duplicate edges are dropped. Graphs are
cached on disk by (nodes, avg_degree, seed): a 3 M-node graph takes a while to build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

PARETO_SHAPE = 1.5  # degree tail exponent ~2.5, as measured on citation graphs
CHUNK = 1 << 22


@dataclass(frozen=True)
class Graph:
    """CSR adjacency: neighbours of node i are indices[indptr[i]:indptr[i + 1]]."""

    indptr: np.ndarray   # int64, nodes + 1
    indices: np.ndarray  # int64 (node ids), sorted within each row

    @property
    def nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)


def generate(nodes: int, avg_degree: float, seed: int) -> Graph:
    """A power-law graph with about ``nodes * avg_degree`` neighbour entries."""
    rng = np.random.default_rng([seed, nodes])
    weights = rng.pareto(PARETO_SHAPE, nodes) + 1.0
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    n_edges = int(nodes * avg_degree / 2)  # each edge appears in both endpoints' rows
    keys = []
    for lo in range(0, n_edges, CHUNK):
        k = min(CHUNK, n_edges - lo)
        src = np.minimum(np.searchsorted(cdf, rng.random(k)), nodes - 1)
        dst = np.minimum(np.searchsorted(cdf, rng.random(k)), nodes - 1)
        keys.append(edge_keys(src, dst, nodes))
    return from_keys(np.concatenate(keys) if keys else np.empty(0, np.int64), nodes)


def edge_keys(src: np.ndarray, dst: np.ndarray, nodes: int) -> np.ndarray:
    """Both directions of each edge as row-major keys (row * nodes + column), self loops
    dropped."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return np.concatenate([src * nodes + dst, dst * nodes + src])


def from_keys(keys: np.ndarray, nodes: int) -> Graph:
    """The CSR of edge keys, duplicates dropped, each row's neighbours sorted."""
    rows, cols = np.divmod(np.unique(keys), nodes)
    indptr = np.zeros(nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=nodes), out=indptr[1:])
    return Graph(indptr, cols.astype(np.int64))


def cached(nodes: int, avg_degree: float, seed: int, directory: Path) -> Graph:
    """``generate`` once per (nodes, avg_degree, seed), kept as an .npz in ``directory``."""
    path = directory / f"gnn-graph-{nodes}-{avg_degree:g}-{seed}.npz"
    if path.exists():
        with np.load(path) as z:
            return Graph(z["indptr"], z["indices"])
    graph = generate(nodes, avg_degree, seed)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, indptr=graph.indptr, indices=graph.indices)
    tmp.replace(path)
    return graph
