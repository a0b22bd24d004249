"""The GPU request API for kernel authors: what a CUDA kernel of one's own needs to read and
write storage from GPU threads (docs/design/GPU-REQUEST-API.md walks through it).

The device side is a header, ``HEADER`` (``gio_queue.cuh``: ``gio_try_post``, ``gio_done``,
``gio_read`` ...; ``CACHE_HEADER`` for the software cache), under ``KERNELS``, the include
directory. ``compile_kernel`` builds a kernel's source with that directory on the include
path and the contract's constants as macros (a header compiled without them stops with
``#error``).
The host side is a ``RequestQueue`` of one transport: ``UringQueue`` (io_uring SQPOLL rings,
sized with ``ring_sizes``) or ``NvmeQueues`` (NVMe queue pairs the GPU drives itself); the
kernel does not change with the transport. ``wait`` raises ``QueueStalled`` when requests
stop completing. ``contract`` is the one statement of the constants and descriptor structs
both sides share; ``GpuCache`` allocates the cache of ``CACHE_HEADER``.

This module is public, as gpufio.api is: it sits in the api band and only re-exports, so
a kernel author never imports gpufio.io; the names below are kept stable.
"""

from __future__ import annotations

from gpufio.io.cuda import KERNELS
from gpufio.io.cuda import raw_module as compile_kernel
from gpufio.io.gio import contract
from gpufio.io.gio.backends.nvme import NvmeQueues
from gpufio.io.gio.backends.rings import ring_sizes
from gpufio.io.gio.backends.uring import UringQueue
from gpufio.io.gio.cache import GpuCache
from gpufio.io.gio.queue import QueueStalled, RequestQueue

HEADER = KERNELS / "gio_queue.cuh"
CACHE_HEADER = KERNELS / "gio_cache.cuh"

__all__ = ["CACHE_HEADER", "HEADER", "KERNELS", "GpuCache", "NvmeQueues", "QueueStalled",
           "RequestQueue", "UringQueue", "compile_kernel", "contract", "ring_sizes"]
