"""The transports of GPU-initiated I/O, each a request queue (io/gio/queue.RequestQueue)
whose agent warps carry the posted requests: uring (io_uring SQPOLL rings; rings.py their
host side) and nvme (NVMe queue pairs driven from the GPU). A backend imports the request
API, never another backend."""
