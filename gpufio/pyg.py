"""``gpufio.pyg.FeatureStore``: a ``torch_geometric.data.FeatureStore`` whose rows come
through a gpufio engine's data path (the GNN workload's gather over the engine's channel,
or the engine's own GPU fetcher), straight into a torch tensor: a CUDA tensor over the CuPy
rows fetched (DLPack, no copy), or a CPU
tensor over NumPy rows with ``device = "cpu"``. A PyG training loop then reads its features
the way gpufio measures them. Read-only: the table is the files'.

    store = FeatureStore(["/mnt/nvme0/feat.f32"], dim=1024, engine=ENGINE)  # see 'gpufio engines'
    x = store["paper", "x", node_ids]     # or store.get_tensor("paper", "x", index=...)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.core.rows import Layout, RowRequest, RowTable
from gpufio.engines import all_engines
from gpufio.io import gpu
from gpufio.profile import from_dict
from gpufio.loops.rows import fetcher

try:
    from torch_geometric.data import FeatureStore as _PygStore
    from torch_geometric.data import TensorAttr
except ImportError:  # the class below needs PyG; importing this module without it says so
    _PygStore, TensorAttr = object, None


class FeatureStore(_PygStore):
    """Rows of ``dim`` float32 in ``paths`` (striped: row i in file i % len(paths), after a
    ``header`` of bytes), fetched through ``engine`` with its ``options`` (profile keys such
    as rings, iodepth, sqe_async), for the node type ``group_name`` and attribute
    ``attr_name``; at most ``max_rows`` rows a fetch."""

    def __init__(self, paths: list[str] | str, dim: int, *, engine: str,
                 device: str = "gpu", header: int = 0, group_name: str | None = None,
                 attr_name: str = "x", max_rows: int = 1 << 20, **options: Any) -> None:
        if TensorAttr is None:
            raise BadInput("gpufio.pyg needs torch and torch_geometric (pip install 'gpufio[pyg]')")
        if device not in ("gpu", "cpu"):  # checked first: a misspelt "cpu" must not load CUDA
            raise BadInput(f"gpufio.pyg: device '{device}': use \"gpu\" or \"cpu\"")
        super().__init__()
        import torch

        self._torch = torch
        paths = [paths] if isinstance(paths, str) else list(paths)
        layout = Layout(len(paths), dim * 4, header)
        rows = sum((os.path.getsize(p) - header) // (dim * 4) for p in paths)
        # the engine's own keys, resolved as a profile's would be
        job = from_dict({"global": {"engine": engine, **options}}, "gpufio.pyg", {}).jobs[0]
        cls = all_engines()[job.engine]
        support = cls.row_support()
        if support is None:
            raise BadInput(f"gpufio.pyg: engine '{engine}' fetches no rows")
        if device == "cpu" and support.gpu_only:
            raise BadInput(f"gpufio.pyg: engine '{engine}' fetches rows into GPU memory only; "
                           "use device = \"gpu\"")
        self._xp = gpu.array_module(device, job.gpu)
        request = RowRequest(dim=dim, max_rows=max_rows, direct=job.direct,
                             iodepth=job.iodepth if "iodepth" in options else None)
        self._fetcher = fetcher(cls, job, RowTable(tuple(paths), layout, rows), self._xp,
                                request)
        self._attr = TensorAttr(group_name, attr_name)
        self._rows, self._dim, self._max = rows, dim, max_rows

    def _ids(self, index: Any) -> Any:
        """The node ids an attribute's index names (all rows for None), on the fetch side."""
        if index is None:
            index = slice(None)
        if isinstance(index, slice):
            return self._xp.arange(self._rows, dtype=self._xp.int64)[index]
        if isinstance(index, self._torch.Tensor):
            index = index.to(self._torch.int64)
            if self._xp is not np and index.is_cuda:
                return self._xp.from_dlpack(index)  # already on the GPU: no copy
            index = index.cpu().numpy()
        return self._xp.asarray(index, dtype=self._xp.int64)

    def _fetch(self, ids: Any) -> Any:
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self._rows):
            raise IndexError(f"gpufio.pyg: node ids must lie in 0..{self._rows - 1}")
        parts = [self._fetcher.fetch(ids[lo:lo + self._max])
                 for lo in range(0, len(ids), self._max)] or [self._xp.empty((0, self._dim),
                                                                             self._xp.float32)]
        rows = parts[0] if len(parts) == 1 else self._xp.concatenate(parts)
        return (self._torch.from_numpy(rows) if self._xp is np
                else self._torch.from_dlpack(rows))

    def _mine(self, attr: Any) -> bool:
        return (attr.group_name == self._attr.group_name
                and attr.attr_name == self._attr.attr_name)

    def _get_tensor(self, attr: Any) -> Any:
        return self._fetch(self._ids(attr.index)) if self._mine(attr) else None

    def _multi_get_tensor(self, attrs: list[Any]) -> list[Any]:
        """One fetch for every attribute's rows (the engine keeps more reads in flight),
        split back per attribute."""
        if not all(self._mine(a) for a in attrs):
            return [self._get_tensor(a) for a in attrs]
        ids = [self._ids(a.index) for a in attrs]
        rows = self._fetch(self._xp.concatenate(ids) if ids else self._ids([]))
        return list(self._torch.split(rows, [len(i) for i in ids]))

    def _get_tensor_size(self, attr: Any) -> tuple[int, int] | None:
        return (self._rows, self._dim) if self._mine(attr) else None

    def get_all_tensor_attrs(self) -> list[Any]:
        return [TensorAttr(self._attr.group_name, self._attr.attr_name)]

    def _put_tensor(self, tensor: Any, attr: Any) -> bool:
        return False  # read-only: the table is the files'

    def _remove_tensor(self, attr: Any) -> bool:
        return False

    def close(self) -> None:
        """Release the engine's rings, buffers and files."""
        self._fetcher.close()
