"""A GraphSAGE model (mean aggregator) with its backward pass written out, NumPy or CuPy.

The training stage of the GNN workload: enough real compute per iteration (sized by
``hidden`` and the number of layers) that the aggregation share means what it means in the
experiment, without pulling in a deep-learning framework. Layer l maps each destination
node to relu(h_self W_self + mean(h_neighbours) W_neigh + b); the last layer has no relu
and gives class logits; the loss is softmax cross-entropy; the step is plain SGD.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufio.workloads.gnn.sampler import MiniBatch


def neighbour_mean(xp, h_src: Any, nbr: Any, count: Any) -> Any:
    """Mean of each destination's sampled neighbours' rows; zeros for isolated nodes."""
    out = xp.zeros((nbr.shape[0], h_src.shape[1]), dtype=h_src.dtype)
    for k in range(nbr.shape[1]):
        col = nbr[:, k]
        out += xp.where((col >= 0)[:, None], h_src[xp.maximum(col, 0)], 0)
    return out / xp.maximum(count, 1)[:, None].astype(h_src.dtype)


class GraphSage:
    """Weights per layer: (W_self, W_neigh, b); dims in_dim -> hidden ... -> classes."""

    def __init__(self, xp, in_dim: int, hidden: int, classes: int, layers: int, seed: int,
                 dtype: Any = np.float32) -> None:
        self.xp = xp
        rng = np.random.default_rng(seed)
        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        self.params = []
        for a, b in zip(dims[:-1], dims[1:]):
            lim = np.sqrt(6.0 / (a + b))
            self.params.append([xp.asarray(rng.uniform(-lim, lim, (a, b)).astype(dtype)),
                                xp.asarray(rng.uniform(-lim, lim, (a, b)).astype(dtype)),
                                xp.zeros(b, dtype=dtype)])

    def loss_and_grads(self, mb: MiniBatch, x: Any, labels: Any) -> tuple[float, list]:
        """Forward over the mini-batch's layers (outermost first) from input rows ``x``,
        cross-entropy against ``labels`` of the seeds, and the gradient of every weight."""
        xp, n_layers = self.xp, len(self.params)
        h, caches = x, []
        for i, layer in enumerate(reversed(mb.layers)):
            ws, wn, b = self.params[i]
            nd = len(layer.dst_nodes)
            h_self, h_nb = h[:nd], neighbour_mean(xp, h, layer.nbr, layer.count)
            z = h_self @ ws + h_nb @ wn + b
            last = i == n_layers - 1
            caches.append((layer, h.shape[0], h_self, h_nb, z))
            h = z if last else xp.maximum(z, 0)
        z = h - h.max(axis=1, keepdims=True)
        p = xp.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = len(labels)
        loss = float(-xp.log(p[xp.arange(n), labels] + 1e-12).mean())
        dz = p
        dz[xp.arange(n), labels] -= 1
        dz /= n
        grads: list = [None] * n_layers
        for i in reversed(range(n_layers)):
            layer, n_src, h_self, h_nb, z = caches[i]
            if i != n_layers - 1:
                dz = dz * (z > 0)
            ws, wn, _ = self.params[i]
            grads[i] = [h_self.T @ dz, h_nb.T @ dz, dz.sum(axis=0)]
            if i == 0:
                break  # the input features are data, not parameters
            dh = xp.zeros((n_src, ws.shape[0]), dtype=dz.dtype)
            dh[:len(layer.dst_nodes)] += dz @ ws.T
            d_nb = (dz @ wn.T) / xp.maximum(layer.count, 1)[:, None].astype(dz.dtype)
            for k in range(layer.nbr.shape[1]):
                col = layer.nbr[:, k]
                ok = col >= 0
                xp.add.at(dh, col[ok], d_nb[ok])  # repeated indices add up
            dz = dh
        return loss, grads

    def step(self, grads: list, lr: float) -> None:
        """Plain SGD."""
        for params, g in zip(self.params, grads):
            for w, dw in zip(params, g):
                w -= lr * dw
