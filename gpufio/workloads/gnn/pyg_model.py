"""``model = "pyg-sage"``: PyG's SAGEConv layers trained on the rows gpufio fetched, with
gpufio's sampler (PyG's NeighborLoader needs pyg-lib or torch-sparse). Each sampled layer
becomes a bipartite ``edge_index`` (source positions in the layer's src nodes, target
positions in its dst nodes); the rows arrive as CuPy (shared with torch through DLPack, no
copy) or NumPy arrays. The same interface as model.GraphSage: loss_and_grads, then step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.workloads.gnn.sampler import MiniBatch


def _torch() -> Any:
    try:
        import torch
        import torch_geometric  # noqa: F401
    except ImportError:
        raise BadInput("key 'model': \"pyg-sage\" needs torch and torch_geometric "
                       "(pip install 'gpufio[pyg]')") from None
    return torch


def as_torch(torch: Any, a: Any) -> Any:
    """A torch tensor over the same memory as ``a`` (CuPy through DLPack, NumPy directly)."""
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else torch.from_dlpack(a)


class PygSage:
    """GraphSAGE from PyG's SAGEConv (mean aggregation), on ``device``, SGD."""

    def __init__(self, xp: Any, in_dim: int, hidden: int, classes: int, layers: int,
                 seed: int, lr: float) -> None:
        torch = self.torch = _torch()
        from torch_geometric.nn import SAGEConv

        torch.manual_seed(seed)
        self.xp = xp
        self.device = torch.device("cpu" if xp is np else f"cuda:{xp.cuda.Device().id}")
        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(
            SAGEConv(dims[i], dims[i + 1], aggr="mean") for i in range(layers)).to(self.device)
        self.opt = torch.optim.SGD(self.convs.parameters(), lr=lr)

    def _edges(self, layer: Any) -> Any:
        """The layer's sampled neighbours as edge_index: [source in src, target in dst]."""
        nbr = as_torch(self.torch, self.xp.ascontiguousarray(layer.nbr)).to(self.device)
        dst = self.torch.arange(nbr.shape[0], device=self.device)[:, None].expand_as(nbr)
        ok = nbr >= 0
        return self.torch.stack([nbr[ok].long(), dst[ok]])

    def loss_and_grads(self, mb: MiniBatch, x: Any, labels: Any) -> tuple[float, None]:
        torch = self.torch
        h = as_torch(torch, x).to(self.device)
        for i, layer in enumerate(reversed(mb.layers)):
            nd = len(layer.dst_nodes)
            h = self.convs[i]((h, h[:nd]), self._edges(layer), size=(h.shape[0], nd))
            if i != len(self.convs) - 1:
                h = torch.relu(h)
        y = as_torch(torch, self.xp.ascontiguousarray(labels)).to(self.device).long()
        loss = torch.nn.functional.cross_entropy(h, y)
        self.opt.zero_grad()
        loss.backward()
        return float(loss.detach()), None

    def step(self, grads: None, lr: float) -> None:
        self.opt.step()
