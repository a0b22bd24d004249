"""cuFile's own batch and stream APIs, through ``cuda.bindings.cufile`` (cuda-python).

KvikIO (the cufile engine's default api) offers no batch API to Python (kvikio #204) and fio's
libcufile is synchronous (fio #1915), so these queues call cuFile directly:

- ``BatchQueue``: ``cuFileBatchIOSetUp`` handles of ``batch_size`` entries each, enough of
  them to keep ``depth`` requests in flight; ``cuFileBatchIOSubmit`` per batch and
  ``cuFileBatchIOGetStatus`` polled without waiting. A handle takes a new batch once every
  entry of its last one has completed (cuFile's rule).
- ``StreamQueue``: ``cuFileReadAsync`` / ``cuFileWriteAsync`` on ``streams`` CUDA streams
  (registered with ``cuFileStreamRegister`` where sizes and offsets are 4 KiB-aligned and
  known at submission), an event recorded after each I/O to tell when it is done.

The C structs are filled as NumPy records laid out as cufile.h lays them out (checked against
the binding's own dtypes where it has them), so a batch of any size is one vectorised fill.
``binding()`` is the one place the module is imported: tests hand the queues a stand-in.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.native import cuda as native_cuda

# cufile.h: CUfileDescr_t, CUfileIOParams_t, CUfileIOEvents_t on LP64
DESCR = np.dtype({"names": ["type", "fd"], "formats": [np.int32, np.int32],
                  "offsets": [0, 8], "itemsize": 24})
PARAMS = np.dtype({"names": ["mode", "base", "file_offset", "buf_offset", "size", "fh",
                             "opcode", "cookie"],
                   "formats": [np.int32, np.int64, np.int64, np.int64, np.uint64, np.int64,
                               np.int32, np.int64],
                   "offsets": [0, 8, 16, 24, 32, 40, 48, 56], "itemsize": 64})
EVENTS = np.dtype({"names": ["cookie", "status", "ret"], "formats": [np.int64, np.int32, np.int64],
                   "offsets": [0, 8, 16], "itemsize": 24})
HANDLE_TYPE_FD = 1
BATCH_MODE = 1  # CUFILE_BATCH
OP_READ, OP_WRITE = 0, 1
COMPLETE, FAILED, CANCELED, TIMEOUT = 0x10, 0x40, 0x08, 0x20
STREAM_FIXED_ALIGNED = 0xF  # buffer offset, file offset and size known at submit, 4 KiB-aligned
DEFAULT_MAX_BATCH = 128  # cuFile's default properties.io_batchsize
# classes of cuFile's POSIX bounce-buffer pool (properties.posix_pool_slab_size_kb / _count)
POOL_CLASSES = 3
DEFAULT_POOL = ([4, 1024, 16384], [128, 64, 64])  # cuFile's documented KiB and counts

_open: dict[str, Any] = {}
# cuFile registers a descriptor once per process: workers that share a target's descriptor
# (threads) share its handle, counted
_handles: dict[int, list[int]] = {}
_handles_lock = threading.Lock()


def configured_pool() -> tuple[list[int], list[int]]:
    """The POSIX pool's classes as cufile.json sets them (properties.posix_pool_slab_size_kb
    and _count), else cuFile's documented defaults."""
    from gpufio.facts.system import Host, cufile_setting

    settings = Host().cufile_json()[1]
    kb = cufile_setting(settings, "properties.posix_pool_slab_size_kb") or DEFAULT_POOL[0]
    count = cufile_setting(settings, "properties.posix_pool_slab_count") or DEFAULT_POOL[1]
    return [int(k) for k in kb], [int(c) for c in count]


def read_pool(cf: Any) -> tuple[list[int], list[int]] | None:
    """The pool's classes (KiB, count) as libcufile holds them; None where it will not say
    (libcufile 1.15 answers only once its driver is open)."""
    sizes, counts = np.zeros(POOL_CLASSES, np.uint64), np.zeros(POOL_CLASSES, np.uint64)
    try:
        cf.get_parameter_posix_pool_slab_array(sizes.ctypes.data, counts.ctypes.data,
                                               POOL_CLASSES)
    except Exception:  # not yet open, an older libcufile, or another number of classes
        return None
    return [int(k) for k in sizes], [int(c) for c in counts]


def size_pool(cf: Any, io_bytes: int, inflight: int) -> dict[str, Any]:
    """Give cuFile's POSIX pool a bounce buffer for each of ``inflight`` I/Os of
    ``io_bytes``, before the driver opens; what was asked, for the result (``pool_opened``
    adds what the pool then holds).

    In compat mode every batch (and stream) I/O in flight holds one buffer of the smallest
    slab class that fits it, and with none free ``cuFileBatchIOSubmit`` waits for ever
    (nixl #2070; seen on the GPU machine with more 1 MiB writes in flight than the 1 MiB
    class's 64 default buffers). So that class's count is raised to
    the I/Os in flight. Before the driver opens libcufile may not report the pool: then
    cufile.json's classes are the ones raised."""
    pool = read_pool(cf)
    facts: dict[str, Any] = {"asked_from": "libcufile" if pool else "cufile.json"}
    sizes, counts = pool or configured_pool()
    if len(sizes) != POOL_CLASSES or len(counts) != POOL_CLASSES:
        return {**facts, "sized": False,
                "why": f"cuFile's pool has {len(sizes)} classes, not {POOL_CLASSES}"}
    fits = sorted((kb, k) for k, kb in enumerate(sizes) if kb << 10 >= io_bytes)
    if not fits:
        return {**facts, "sized": False, "why": f"no slab class holds an I/O of {io_bytes} bytes"}
    k = fits[0][1]
    if counts[k] < inflight:
        counts = [*counts[:k], inflight, *counts[k + 1:]]
        # the arrays are named so they outlive the call that reads them by address
        kb_arr, count_arr = np.array(sizes, np.uint64), np.array(counts, np.uint64)
        try:
            cf.set_parameter_posix_pool_slab_array(kb_arr.ctypes.data, count_arr.ctypes.data,
                                                   POOL_CLASSES)
        except Exception as e:
            return {**facts, "slab_kb": sizes, "count": counts, "sized": False,
                    "why": f"cuFile refused {inflight} buffers of {sizes[k]} KiB ({e})"}
    return {**facts, "slab_kb": sizes, "count": counts, "sized": True}


def pool_opened(cf: Any, asked: dict[str, Any]) -> dict[str, Any]:
    """``asked`` (size_pool's facts) with what the open driver's pool holds: where the two
    differ, cuFile did not take the counts, and the pool is not sized."""
    held = read_pool(cf)
    if held is None or "count" not in asked:
        return asked
    out = {**asked, "slab_kb": held[0], "count": held[1]}
    if asked.get("sized") and held != (asked["slab_kb"], asked["count"]):
        out.update(sized=False, why=f"cuFile kept {held[1]} buffers of {held[0]} KiB, not the "
                                    f"{asked['count']} asked for before its driver opened")
    return out


def pool_shortfall(io_bytes: int, inflight: int) -> str | None:
    """Why the open driver's pool lacks a buffer for each of ``inflight`` I/Os of
    ``io_bytes`` (cuFile's submit would then wait for ever), or None: it has them, or it
    could not be read (nothing is known to be short)."""
    pool = _open.get("pool", {})
    fits = sorted((kb, n) for kb, n in zip(pool.get("slab_kb", []), pool.get("count", []))
                  if kb << 10 >= io_bytes)
    if not fits or fits[0][1] >= inflight:
        return None
    kb, n = fits[0]
    why = (pool["why"] if not pool.get("sized") and "why" in pool
           else "its driver was opened for an earlier job of this run")
    return (f"{inflight} I/Os of {io_bytes} bytes in flight need as many of cuFile's "
            f"{kb} KiB bounce buffers and it has {n} ({why}); cuFile's submit would wait for "
            f"ever: keep at most {n} in flight, or raise properties.posix_pool_slab_count in "
            "cufile.json")


def pool_facts() -> dict[str, Any]:
    """The bounce-buffer pool the open driver was given (size_pool's facts)."""
    return dict(_open.get("pool", {}))


def binding(threads: int = 0, io_bytes: int = 0, inflight: int = 0) -> Any:
    """``cuda.bindings.cufile``, with its driver opened once per process; ``threads``: the
    I/O threads cuFile runs compat-mode and batch I/Os on (execution.max_io_threads, which
    cufile.json sets to 4 by default), set before the driver opens (0: cufile.json's);
    ``inflight`` I/Os of ``io_bytes``: what its bounce-buffer pool is sized for
    (size_pool)."""
    if "cf" not in _open:
        try:
            cf = native_cuda.cufile()
        except ImportError:
            raise BadInput("engine 'cufile': api 'batch' and 'async' need cuda-python's cuFile "
                           "bindings (pip install 'gpufio[gds]')") from None
        for name, ours in (("io_params_dtype", PARAMS), ("io_events_dtype", EVENTS),
                           ("descr_dtype", DESCR)):
            theirs = getattr(cf, name, None)
            if theirs is not None and theirs.itemsize != ours.itemsize:
                raise BadInput(f"engine 'cufile': cuda.bindings.cufile's {name} is "
                               f"{theirs.itemsize} bytes, not cufile.h's {ours.itemsize}")
        if threads:
            param = cf.SizeTConfigParameter.EXECUTION_MAX_IO_THREADS
            try:
                low, high = cf.get_parameter_min_max_value(param)
            except Exception:  # older libcufile: no range to ask for; cuFile checks itself
                low, high = 0, threads
            if not low <= threads <= high:  # cuFile would print a notice and carry on
                raise BadInput(f"engine 'cufile': threads {threads} is outside cuFile's "
                               f"execution.max_io_threads range here ({low} to {high})")
            try:
                cf.set_parameter_size_t(param, threads)
            except Exception as e:
                raise BadInput(f"engine 'cufile': cuFile refused execution.max_io_threads = "
                               f"{threads} ({e}); it is set before cuFile's driver opens, once "
                               f"a process: run jobs with other threads in another gpufio "
                               f"run") from None
        pool = size_pool(cf, io_bytes, inflight) if inflight else {}
        try:
            cf.driver_open()
        except Exception as e:
            raise BadInput(f"engine 'cufile': cuFileDriverOpen failed: {e}") from None
        _open["cf"], _open["pool"] = cf, pool_opened(cf, pool) if pool else pool
    return _open["cf"]


def max_batch(cf: Any) -> int:
    """The driver's largest batch (properties.io_batchsize in cufile.json)."""
    try:
        return int(cf.get_parameter_size_t(cf.SizeTConfigParameter.PROPERTIES_IO_BATCHSIZE))
    except Exception:  # older libcufile: no parameter API, the documented default holds
        return DEFAULT_MAX_BATCH


def register_handle(cf: Any, fd: int, path: str) -> int:
    """A cuFile handle for the open ``fd`` of ``path`` (the one already made for it, if any;
    release it with ``deregister_handle``); a refusal is one line naming the target."""
    with _handles_lock:
        if fd in _handles:
            _handles[fd][1] += 1
            return _handles[fd][0]
        descr = np.zeros(1, DESCR)
        descr["type"], descr["fd"] = HANDLE_TYPE_FD, fd
        try:
            handle = int(cf.handle_register(descr.ctypes.data))
        except Exception as e:
            raise BadInput(f"target {path}: cuFileHandleRegister refused it ({e}); in compat "
                           f"mode cuFile needs properties.allow_compat_mode in cufile.json and "
                           f"udev's record of the filesystem's device ('gpufio doctor' checks "
                           f"both)") from None
        _handles[fd] = [handle, 1]
        return handle


def deregister_handle(cf: Any, fd: int) -> None:
    """Release a ``register_handle`` handle; the last user deregisters it from cuFile."""
    with _handles_lock:
        entry = _handles.get(fd)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _handles[fd]
            cf.handle_deregister(entry[0])


def _result(status: np.ndarray, ret: np.ndarray) -> np.ndarray:
    """Bytes moved, or -errno, per completed entry."""
    out = ret.astype(np.int64)
    failed = status == FAILED
    out[failed] = np.where(out[failed] < 0, out[failed], -errno.EIO)
    out[status == CANCELED] = -errno.ECANCELED
    out[status == TIMEOUT] = -errno.ETIMEDOUT
    return out


def flags(write: np.ndarray | bool, n: int) -> list[bool]:
    """A batch's write flags, one per request, from a Channel's ``write`` (one for all, or
    one each)."""
    return np.asarray(write, bool)[:n].tolist() if isinstance(write, np.ndarray) else [bool(write)] * n


class BatchQueue:
    """``depth`` requests in flight through cuFile batch handles of ``batch_size`` entries.

    Each request is (handle index, file offset, length, device address, write, tag), as a
    core/requests Channel takes them; ``base``: the start of the buffer region every
    address lies in (registered with cuFileBufRegister, where it is, as devPtr_base), or 0:
    each address is its own base."""

    def __init__(self, cf: Any, handles: list[int], base: int, depth: int,
                 batch_size: int) -> None:
        self._cf, self._fh, self._base = cf, np.array(handles, np.int64), base
        self._size = batch_size
        n = -(-depth // batch_size)
        self._batches = [cf.batch_io_set_up(batch_size) for _ in range(n)]
        self._params = np.zeros((n, batch_size), PARAMS)
        self._events = np.zeros((n, batch_size), EVENTS)
        self._left = np.zeros(n, np.int64)  # entries of each handle's batch not yet reaped
        self._nr = np.zeros(1, np.uint32)
        self._zero = np.zeros(2, np.int64)  # timespec {0, 0}: report what is done, never wait

    def room(self) -> int:
        """How many requests the idle handles take now."""
        return int((self._left == 0).sum()) * self._size

    def busy(self) -> int:
        return int(self._left.sum())

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        """Queue requests from the first on, as many as room() takes; how many."""
        k = min(self.room(), len(off))
        w = np.asarray(write, bool)
        idle = np.flatnonzero(self._left == 0)
        for b, lo in zip(idle.tolist(), range(0, k, self._size)):
            hi = min(lo + self._size, k)
            p = self._params[b, :hi - lo]
            p["mode"], p["size"] = BATCH_MODE, length[lo:hi]
            a = np.asarray(addr[lo:hi], np.uint64)
            if self._base:
                p["base"], p["buf_offset"] = self._base, a - np.uint64(self._base)
            else:
                p["base"], p["buf_offset"] = a, 0
            p["file_offset"], p["fh"] = off[lo:hi], self._fh[np.asarray(tgt[lo:hi])]
            p["opcode"] = np.where(w[lo:hi], OP_WRITE, OP_READ) if w.ndim else \
                (OP_WRITE if w else OP_READ)
            p["cookie"] = tag[lo:hi]
            self._cf.batch_io_submit(self._batches[b], hi - lo, p.ctypes.data, 0)
            self._left[b] = hi - lo
        return k

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        """(tags, results) of the requests that completed since the last poll."""
        tags, results = [], []
        for b in np.flatnonzero(self._left).tolist():
            ev = self._events[b]
            self._nr[0] = self._left[b]
            self._cf.batch_io_get_status(self._batches[b], 0, self._nr.ctypes.data,
                                         ev.ctypes.data, self._zero.ctypes.data)
            got = int(self._nr[0])
            if got:
                tags.append(ev["cookie"][:got].copy())
                results.append(_result(ev["status"][:got], ev["ret"][:got]))
                self._left[b] -= got
        if not tags:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(tags), np.concatenate(results)

    def close(self) -> None:
        for b, h in enumerate(self._batches):
            if self._left[b]:
                self._cf.batch_io_cancel(h)
            self._cf.batch_io_destroy(h)
        self._batches = []


class StreamQueue:
    """Requests through cuFileReadAsync / cuFileWriteAsync, ``depth`` at most, entry i on
    stream i % streams; a request is done when the event recorded after it on its stream
    is. Requests as BatchQueue takes them."""

    def __init__(self, cf: Any, cp: Any, handles: list[int], depth: int, streams: int,
                 registered: bool) -> None:
        self._cf, self._fh = cf, handles
        self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(streams)]
        self.registered = registered
        if registered:
            for s in self._streams:
                cf.stream_register(s.ptr, STREAM_FIXED_ALIGNED)
        # size, file offset, buffer offset, bytes moved: cuFile reads them when the stream
        # reaches the I/O and writes the last when it is done, so each entry keeps its own
        self._args = np.zeros((depth, 4), np.int64)
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(depth)]
        self._busy = np.zeros(depth, dtype=bool)
        self._tags = np.zeros(depth, np.int64)
        self._free = list(range(depth))

    def room(self) -> int:
        return len(self._free)

    def busy(self) -> int:
        return len(self._busy) - len(self._free)

    def submit(self, tgt: np.ndarray, off: np.ndarray, length: np.ndarray, addr: np.ndarray,
               write: np.ndarray | bool, tag: np.ndarray) -> int:
        k = min(len(self._free), len(off))
        entries = np.array([self._free.pop() for _ in range(k)], np.int64)
        a = self._args
        a[entries, 0], a[entries, 1], a[entries, 2], a[entries, 3] = length[:k], off[:k], 0, 0
        self._tags[entries] = tag[:k]
        args = a.ctypes.data
        for e, t, dev, w in zip(entries.tolist(), tgt[:k].tolist(), addr[:k].tolist(),
                                flags(write, k)):
            stream = self._streams[e % len(self._streams)]
            p = args + 32 * e
            # the request's own address as the base, at offset 0: cuFile's compat mode lands
            # a read given as base + buffer offset in the wrong place (seen on the H200 machine)
            (self._cf.write_async if w else self._cf.read_async)(
                self._fh[t], dev, p, p + 8, p + 16, p + 24, stream.ptr)
            self._events[e].record(stream)
            self._busy[e] = True
        return k

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        done = [e for e in np.flatnonzero(self._busy).tolist() if self._events[e].done]
        entries = np.array(done, np.int64)
        self._busy[entries] = False
        self._free.extend(done)
        res = self._args[entries, 3].copy()
        res[res == 0] = -errno.EIO  # cuFile reports a failed I/O as no bytes moved
        return self._tags[entries], res

    def close(self) -> None:
        for s in self._streams:
            s.synchronize()
            if self.registered:
                self._cf.stream_deregister(s.ptr)
        self._streams = []


def aligned(*sizes: int) -> bool:
    """Whether every I/O's size and offsets are multiples of 4 KiB (registered streams)."""
    return all(v % 4096 == 0 for v in sizes)
