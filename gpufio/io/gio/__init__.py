"""GPU-initiated I/O: GPU threads post their own requests, whatever carries them.

The request API, what a GPU-initiated engine's kernels and the loops over them
(gpufio/loops: block_device, rows_device) use on any transport: contract (the constants
and descriptor structs shared with the kernels), queue (the request queue's host half,
``RequestQueue``: slots, control words, start, wait, abort), bench (what the requester
threads occupy and refuse) and cache (the software cache in GPU memory). On the GPU the
API is one header, kernels/gio_queue.cuh.

The backends, under backends/, each a ``RequestQueue`` with the agent warps that carry its
requests: uring (io_uring SQPOLL rings in CUDA-registered host memory, with rings.py) and
nvme (NVMe queue pairs, BaM's mechanism). The API modules never import a backend.
"""
