"""The private native layer: the one place gpufio talks to C. It loads libraries (libc,
libblkid, libcuda, the helpers gpufio builds), declares their functions' signatures and the
C structs they take, views raw memory, and makes the calls that go through ctypes, NVRTC
(CuPy's RawModule) and cuda.bindings. Every other module asks it, so the ABI details
(argument widths, errno, struct layouts, pointer lifetimes) sit in one band, below facts,
that imports nothing else of gpufio; tests/test_architecture.py names the modules that may
import ctypes.

build (C sources compiled once per machine and loaded), libc (system calls and libc
functions), memory (views of raw addresses), blkid (libblkid's low-level probe), uring
(io_uring's structs and its three system calls), loops (io/loops.c's structs and entry
points), nvme (io/nvme's compiled controller, CPU driver and drive rate model), cuda (NVRTC through CuPy, libcuda's presence, cuFile's bindings).
"""
