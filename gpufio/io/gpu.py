"""GPU discovery through CuPy, imported only when a GPU question is asked.

Every CPU-only command must work on a host without CUDA, so nothing at module level here
touches CuPy; ``probe`` turns every way of having no usable GPU into a one-line reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from gpufio.facts.device import pci_link
from gpufio.facts.system import pci_place_facts
from gpufio.native import cuda as native_cuda

NO_GPU = "no NVIDIA GPU or driver found"
NO_DEVICE = "no NVIDIA GPU found (the driver sees none)"


def driver_present() -> bool:
    """Whether an NVIDIA driver is there at all: its /proc entry or its user-space library.
    Without one, CUDA's own error ('driver version is insufficient') would mislead."""
    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    return native_cuda.libcuda_present()


def _runtime_reason(e: Exception) -> str:
    """A reader's account of a CUDA runtime error from the device count query."""
    text = str(e).splitlines()[0]
    if "InsufficientDriver" in text:
        return f"the NVIDIA driver is older than CuPy's CUDA runtime ({text})"
    if "NoDevice" in text:
        return NO_DEVICE
    return f"no usable GPU ({text})"


@lru_cache(maxsize=1)
def probe() -> tuple[int, str | None]:
    """(number of GPUs, None) or (0, why there is no usable GPU)."""
    # Kernels that spin waiting for other kernels (gpu-uring's agents) can deadlock with CUDA's
    # lazy loading, which may wait for the device while loading a kernel at its first launch.
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    if not driver_present():
        return 0, NO_GPU
    try:
        import cupy
    except ImportError:
        return 0, "CuPy is not installed (pip install cupy-cuda13x)"
    except Exception as e:  # a broken CUDA install surfaces as many exception types
        return 0, f"CuPy cannot load: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver, among others
        return 0, _runtime_reason(e)
    if count == 0:
        return 0, NO_DEVICE
    return count, None


# GPUs on which a kernel of this process never stopped: index -> why
_WEDGED: dict[int, str] = {}


class GpuWedged(RuntimeError):
    """A GPU this process can no longer use: a kernel on it never stopped."""


def mark_wedged(index: int, why: str) -> None:
    """Refuse every later job on GPU ``index`` in this process (see use)."""
    _WEDGED.setdefault(index, why)


def use(index: int) -> Any:
    """Make GPU ``index`` current in this thread and return CuPy; BadInput if it is not there,
    GpuWedged if a kernel of an earlier job on it never stopped (a device-wide call would
    then wait forever, and its memory may still be written)."""
    from gpufio.core.errors import BadInput

    count, why = probe()
    if why:
        raise BadInput(f"gpu {index}: {why}")
    if index >= count:
        raise BadInput(f"key 'gpu'/'gpus': GPU {index} is out of range, "
                       f"this host has {count} GPU(s)")
    if index in _WEDGED:
        raise GpuWedged(f"gpu {index}: {_WEDGED[index]}; this process cannot use it again "
                        "(start a new gpufio)")
    import cupy

    cupy.cuda.Device(index).use()
    return cupy


def array_module(device: str, index: int) -> Any:
    """A workload's array module: NumPy for ``device = "cpu"``, else CuPy on GPU ``index``."""
    return np if device == "cpu" else use(index)


def sm_count(index: int) -> int:
    """Streaming multiprocessors of GPU ``index``."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(index)["multiProcessorCount"])


# injection libraries of tools that run kernels one at a time (Nsight Compute, the compute
# sanitizer); Nsight Systems injects too, but lets kernels overlap
_SERIALISING_TOOLS = (("sanitizer", "compute-sanitizer"), ("TreeLauncher", "Nsight Compute"),
                      ("nsight-compute", "Nsight Compute"))


def serialising_reason(env: dict[str, str] | None = None) -> str | None:
    """Why kernels would run one at a time here, or None. GPU-initiated I/O needs its agent
    and requester kernels to run together: serialised, the agents' launch never returns."""
    env = os.environ if env is None else env
    if env.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
        return "CUDA_LAUNCH_BLOCKING=1 runs kernels one at a time (unset it)"
    injection = env.get("CUDA_INJECTION64_PATH", "")
    for needle, tool in _SERIALISING_TOOLS:
        if needle in injection:
            return f"{tool} runs kernels one at a time (profile another engine, or nsys)"
    return None


def module_loading_warning(env: dict[str, str] | None = None) -> str | None:
    """A warning when CUDA may load modules lazily: a kernel loaded for the first time while
    gpu-uring's agents spin can wait for them, which wait for it (probe asks for EAGER, but
    only a process that has not initialised CUDA yet takes it)."""
    env = os.environ if env is None else env
    mode = env.get("CUDA_MODULE_LOADING", "")
    if mode and mode != "EAGER":
        return (f"CUDA_MODULE_LOADING={mode}: load every kernel (get_function) before "
                "starting a request queue, or set CUDA_MODULE_LOADING=EAGER")
    return None


def mps_active() -> bool:
    """Whether a CUDA MPS control daemon is there for this process's CUDA clients (its pipe
    directory, as CUDA_MPS_PIPE_DIRECTORY or the default, holds the control pipe): without
    it the GPU time-slices separate processes' contexts instead of running them together."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipes, "control"))


def register_host(addr: int, size: int, mapped: bool = False) -> None:
    """Page-lock host memory gpufio allocated itself (page-aligned, so O_DIRECT can use it too)
    and make it usable for asynchronous copies; ``mapped`` also maps it into every GPU's
    address space (with unified addressing at the same address), so kernels can read it."""
    import cupy

    cupy.cuda.runtime.hostRegister(addr, size, 3 if mapped else 0)  # PORTABLE | MAPPED
    if mapped and not _host_pointer_is_device_pointer(cupy.cuda.Device().id):
        cupy.cuda.runtime.hostUnregister(addr)
        raise RuntimeError("this GPU cannot use registered host pointers as device pointers "
                           "(cudaDevAttrCanUseHostPointerForRegisteredMem = 0); gpufio's "
                           "GPU-initiated path needs it")


_CAN_USE_HOST_POINTER = 91  # cudaDevAttrCanUseHostPointerForRegisteredMem


@lru_cache(maxsize=None)
def _host_pointer_is_device_pointer(device: int) -> bool:
    """cudaDevAttrCanUseHostPointerForRegisteredMem of GPU ``device``: kernels may use a
    registered host address as it is (gpufio passes ring words, landing slots and marks so).
    Cached per GPU, so the caller names the current one."""
    import cupy

    return bool(cupy.cuda.runtime.deviceGetAttribute(_CAN_USE_HOST_POINTER, device))


def unregister_host(addr: int) -> None:
    """Undo register_host."""
    import cupy

    cupy.cuda.runtime.hostUnregister(addr)


def host_rows(xp: Any, rows: int, cols: int) -> np.ndarray:
    """float32 host rows to gather into: page-locked when ``xp`` is CuPy (they go on to a
    GPU in one asynchronous copy), plain NumPy otherwise."""
    if xp is np:
        return np.empty((rows, cols), np.float32)
    import cupyx

    return cupyx.empty_pinned((rows, cols), np.float32)


@contextmanager
def undone_on_failure(undo: Callable[[], None], out_of_memory: str) -> Iterator[None]:
    """Run ``undo`` (release what was built so far) if the block fails; running out of GPU
    memory becomes the one-line BadInput ``out_of_memory``, anything else propagates."""
    import cupy

    from gpufio.core.errors import BadInput

    try:
        yield
    except cupy.cuda.memory.OutOfMemoryError:
        undo()
        raise BadInput(out_of_memory) from None
    except BaseException:
        undo()
        raise


class PinnedBuffer:
    """``nbytes`` of page-aligned host memory gpufio owns, page-locked (register_host) from
    construction to ``close``: landing slots, marks, request slots. One place that pairs
    the registration with its undoing, so no failure path leaves memory registered (CUDA
    refuses a later buffer that reuses the address: HostMemoryAlreadyRegistered)."""

    def __init__(self, nbytes: int, mapped: bool = False) -> None:
        from gpufio.core.targets import aligned_buffer

        self._mem = aligned_buffer(nbytes)
        self.array: np.ndarray | None = np.frombuffer(self._mem, dtype=np.uint8)
        self.addr = self.array.ctypes.data
        try:
            register_host(self.addr, len(self._mem), mapped)
        except BaseException:
            self.array = None
            self._mem.close()
            raise

    def close(self) -> None:
        """Unregister and free; views of ``array`` the caller made must be dropped first."""
        if self.array is None:
            return
        unregister_host(self.addr)
        self.array = None
        try:
            self._mem.close()
        except BufferError:
            # a view is still held elsewhere (CuPy keeps the source of an asynchronous copy
            # from page-locked memory until it completes): the mapping goes with that view
            pass


def gpu_facts() -> list[dict[str, Any]]:
    """Name, memory, PCIe link, NUMA node, local CPUs and BAR1 of each GPU; empty without a
    usable GPU."""
    count, why = probe()
    if why:
        return []
    import cupy

    out = []
    for i in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        bus = cupy.cuda.runtime.deviceGetPCIBusId(i)
        device = Path("/sys/bus/pci/devices") / bus.lower()
        out.append({"index": i, "name": props["name"].decode(errors="replace"),
                    "memory_bytes": int(props["totalGlobalMem"]), "pci_bus_id": bus,
                    "compute_capability": f"{props['major']}.{props['minor']}",
                    **pci_link(device), **pci_place_facts(device)})
    nvml = nvml_facts([g["pci_bus_id"] for g in out])
    for g, facts in zip(out, nvml):
        if facts:
            g["nvml"] = facts
    return out


# NVML's topology levels (nvmlGpuTopologyLevel_t), as the result names them
_NVML_LEVELS = {0: "same board", 10: "same PCIe switch", 20: "PCIe switches under one host "
                "bridge", 30: "same host bridge", 40: "same NUMA node", 50: "across sockets"}


def nvml_facts(bus_ids: list[str]) -> list[dict[str, Any]]:
    """What NVML (nvidia-ml-py) says of each GPU, by PCI bus id: its PCIe link now and at
    most, its CPU affinity, and how it meets each other GPU; [{}...] without NVML."""
    try:
        import pynvml
    except ImportError:
        return [{} for _ in bus_ids]
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver NVML can talk to: sysfs facts only
        return [{} for _ in bus_ids]
    try:
        handles = [pynvml.nvmlDeviceGetHandleByPciBusId(b) for b in bus_ids]
        out = []
        for i, h in enumerate(handles):
            facts: dict[str, Any] = {}
            for key, call in (("link_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                              ("link_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                              ("max_link_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                              ("max_link_width", "nvmlDeviceGetMaxPcieLinkWidth")):
                try:
                    facts[key] = int(getattr(pynvml, call)(h))
                except Exception:  # a query this GPU or driver does not answer
                    pass
            try:
                words = pynvml.nvmlDeviceGetCpuAffinity(h, -(-(os.cpu_count() or 1) // 64))
                facts["cpu_affinity"] = [64 * w + c for w, word in enumerate(words)
                                         for c in range(64) if word >> c & 1]
            except Exception:
                pass
            peers = {}
            for j, other in enumerate(handles):
                if j != i:
                    try:
                        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(h, other)
                        peers[str(j)] = _NVML_LEVELS.get(int(level), str(level))
                    except Exception:
                        pass
            if peers:
                facts["to_gpus"] = peers
            out.append(facts)
        return out
    finally:
        pynvml.nvmlShutdown()
