"""Neighbour sampling for mini-batches (GraphSAGE / DGL's sample_neighbors), NumPy or CuPy.

From the seed nodes outward, each layer takes, for every frontier node, all its neighbours
when it has at most ``fanout`` of them, else ``fanout`` drawn uniformly (with replacement,
as DGL's replace=True). A layer is kept as a padded table: row r lists the positions (in
the next layer's node list) of frontier node r's sampled neighbours, -1 where it has fewer,
so aggregation is ``fanout`` gathers instead of a sparse product. The last layer's node list
is every node whose features the mini-batch needs: what the aggregation stage fetches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Layer:
    """Message passing from ``src_nodes`` into ``dst_nodes`` (dst is a prefix of src)."""

    dst_nodes: Any   # global ids, the previous frontier
    src_nodes: Any   # global ids: dst_nodes first, then newly reached nodes
    nbr: Any         # (len(dst_nodes), fanout) positions into src_nodes, -1 = none
    count: Any       # neighbours per dst node (float32, 0 for isolated nodes)


@dataclass
class MiniBatch:
    seeds: Any
    layers: list[Layer]  # layers[0] touches the seeds; layers[-1] the outermost nodes

    @property
    def input_nodes(self) -> Any:
        """Every node whose features this mini-batch needs."""
        return self.layers[-1].src_nodes


def _append_new(xp, dst: Any, found: Any) -> tuple[Any, Any]:
    """src = dst followed by the nodes of ``found`` not in dst (each once); and each found
    node's position in src."""
    uniq, inverse = xp.unique(found, return_inverse=True)
    fresh = uniq[~xp.isin(uniq, dst)]
    src = xp.concatenate((dst, fresh))
    # position of every unique node in src: dst ones by lookup, fresh ones after dst
    order = xp.argsort(src)
    pos_of_uniq = order[xp.searchsorted(src[order], uniq)]
    return src, pos_of_uniq[inverse.ravel()]


def max_input_nodes(batch: int, fanouts: list[int], nodes: int) -> int:
    """The most nodes a mini-batch can need: every layer adds at most ``fanout`` per node of
    its frontier, and no graph has more than ``nodes``."""
    most = batch
    for fanout in fanouts:
        most = min(most * (1 + fanout), nodes)
    return most


def sample(xp, indptr: Any, indices: Any, seeds: Any, fanouts: list[int], rng: Any) -> MiniBatch:
    """Sample one mini-batch around ``seeds``; ``rng`` is xp.random.Generator-like (random())."""
    layers = []
    dst = seeds
    for fanout in fanouts:
        start, deg = indptr[dst], indptr[dst + 1] - indptr[dst]
        take = xp.minimum(deg, fanout)
        ends = xp.cumsum(take)
        total = int(ends[-1]) if len(ends) else 0
        # row r repeated take[r] times (cupy.repeat takes no array of counts)
        row = xp.searchsorted(ends, xp.arange(total), side="right")
        rank = xp.arange(total) - (ends - take)[row]
        drawn = xp.floor(rng.random(len(row)) * deg[row]).astype(xp.int64)
        pos = xp.where(deg[row] <= fanout, rank, drawn)
        found = indices[start[row] + pos]
        src, found_pos = _append_new(xp, dst, found)
        nbr = xp.full((len(dst), fanout), -1, dtype=xp.int64)
        nbr[row, rank] = found_pos
        layers.append(Layer(dst, src, nbr, take.astype(xp.float32)))
        dst = src
    return MiniBatch(seeds, layers)
