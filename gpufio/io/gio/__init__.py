"""GPU-initiated I/O: rings the GPU drives, the request queue in front of them, and the
software cache in GPU memory."""
