"""The binding table of gpufio's CUDA kernels: each entry point the host launches, named once
(``Kernel``), with the source file in gpufio/kernels it is compiled from and the descriptors
(C structs) it takes. Code fetches a kernel as ``function(Kernel.X)``, never by a string, so
a renamed entry point or source is one edit here, and tests/io/test_kernel_bindings.py
checks each entry against its source (and the cubin nvcc builds of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpufio.io import cuda


@dataclass(frozen=True)
class Binding:
    """A kernel: its source ``kernels/<module>.cu``, its ``extern "C"`` entry point and the
    C structs it takes by pointer (what the host lays out for it)."""

    module: str
    entry: str
    takes: tuple[str, ...] = ()


class Kernel(Enum):
    """Every kernel the host fetches."""

    # io/gio/backends/uring.py: a warp per io_uring, serving the request queue
    GIO_AGENT = Binding("gio_agent", "gio_agent", ("GioQueue", "UringRing"))
    # loops/block_device.py: the block workload's requests from GPU threads
    GIO_BENCH = Binding("gio_bench", "gio_bench", ("GioQueue", "GioBench"))
    # loops/rows_device.py: the GNN feature gather through the cache
    GIO_GATHER = Binding("gnn_gather", "gio_gather", ("GioQueue", "GioCache"))
    # io/gio/backends/nvme.py: a warp per NVMe queue pair, serving the request queue
    NVME_AGENT = Binding("nvme_agent", "nvme_agent", ("GioQueue", "NvmeRing"))
    # io/gio/backends/nvme.py (its flush), bench/: requests of given offsets and lengths
    NVME_REQUESTS = Binding("nvme_io", "nvme_requests", ("GioQueue",))
    # io/verify.py: the pattern checked where the data landed, and filled there for writes
    MARK_MISMATCHES = Binding("verify", "mark_mismatches")
    FILL_PATTERN = Binding("verify", "fill_pattern")


def function(kernel: Kernel) -> Any:
    """``kernel`` loaded from its module (compiled on the module's first use): a
    cupy.RawKernel. Load every kernel before agents spin (io/gio/queue.py says why)."""
    return cuda.module(kernel.value.module).get_function(kernel.value.entry)
