"""The path users write today, as the checkpoint table's baseline row: ``torch.save`` of a
GPU state copies each tensor to new host memory (``.get()``) and writes it with
``file.write`` through the page cache; ``torch.load`` reads each back with ``readinto`` and
copies it up. The same files, extents and sync as the engines' rows, so only the path
differs; it is the workload's own code, not a data path of gpufio's."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from gpufio.core.requests import sync_files
from gpufio.core.targets import Target
from gpufio.core.tensors import Extent, TensorIOError

LABEL = "naive (get + write)"


class NaiveMover:
    """core/tensors.Mover over plain Python file objects."""

    page_cache = True

    def __init__(self, files: Sequence[Target], extents: Sequence[Extent], xp: Any) -> None:
        self._files, self._extents, self._xp = files, extents, xp
        self.facts: dict[str, Any] = {}

    def _host(self, shard: Any) -> np.ndarray:
        return shard.copy() if self._xp is np else shard.get()

    def save(self, tensors: Sequence[Any]) -> int:
        first = 0
        for e, shard in zip(self._extents, tensors):
            path = self._files[e.file].path
            try:
                with open(path, "r+b") as f:
                    f.seek(e.offset)
                    f.write(self._host(shard).data)
            except OSError as err:
                raise TensorIOError(f"save of shard {e.shard}: {path}: {err.strerror}") from None
            first = first or time.perf_counter_ns()
        return first

    def sync(self) -> None:
        sync_files([f.fd for f in self._files])

    def restore(self, tensors: Sequence[Any]) -> int:
        first = 0
        for e, shard in zip(self._extents, tensors):
            path = self._files[e.file].path
            host = np.empty(e.nbytes, np.uint8)
            try:
                with open(path, "rb") as f:
                    f.seek(e.offset)
                    got = f.readinto(host.data)
            except OSError as err:
                raise TensorIOError(f"restore of shard {e.shard}: {path}: "
                                    f"{err.strerror}") from None
            if got != e.nbytes:
                raise TensorIOError(f"restore of shard {e.shard}: {path} at byte {e.offset}: "
                                    f"{got} of {e.nbytes} bytes")
            shard[:] = host if self._xp is np else self._xp.asarray(host)
            first = first or time.perf_counter_ns()
        return first

    def close(self) -> None:
        """The files belong to the job, which closes them."""
