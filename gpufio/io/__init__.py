"""Plumbing under the engines and workloads, naming neither: memory, io_uring, CUDA,
GPU verification, staging buffers, and the GPU-initiated request queue (gio/)."""
