"""The software NVMe controller (io/nvme_model.py) as a process of its own, started as every
helper process of gpufio is (run/launch.py): spawned, so it holds no CUDA state of the
parent's, dying with the parent, deaf to the Ctrl-C and SIGTERM meant for the runner.

A controller in another process is what makes the model honest: a GPU kernel, the doorbell
relay and the CPU driver only share memory with it, as they would with a drive's DMA.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from gpufio.core.signals import ignore_stop_signals
from gpufio.io import nvme_model
from gpufio.run.launch import die_with_parent

STOP_S = 5.0


def _main(path: str, backing: str, lba_shift: int, faults: list[nvme_model.Fault]) -> None:
    die_with_parent()
    ignore_stop_signals()
    nvme_model.serve(path, backing, lba_shift, faults)


class ModelProcess:
    """A controller serving ``backing`` (``lba_shift``: its LBA size) through a shared file in
    ``directory`` with ``dma_bytes`` of host memory; ``mem`` is this process's mapping of it.
    A context manager: leaving it stops the controller (SIGKILL if it does not stop)."""

    def __init__(self, directory: str | Path, backing: str | Path, lba_shift: int = 9,
                 dma_bytes: int = 64 << 20, faults: list[nvme_model.Fault] = ()) -> None:
        self.path = str(Path(directory) / "nvme-model.shm")
        self.mem = nvme_model.Memory(self.path, dma_bytes, create=True)
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_main, daemon=True, name="nvme-model",
                                 args=(self.path, str(backing), lba_shift, list(faults)))
        self._proc.start()

    def host(self, admin_entries: int = 32) -> nvme_model.Host:
        """The CPU driver, once the controller is up (it waits for it), enabled."""
        if not self._proc.is_alive():
            raise RuntimeError(f"NVMe model: the controller process died (exit code "
                               f"{self._proc.exitcode})")
        return nvme_model.Host(self.mem, admin_entries)

    def stop(self) -> None:
        if self._proc.pid is not None and self._proc.is_alive():
            self.mem.set_reg(nvme_model.M_STOP, 1)
            self._proc.join(STOP_S)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()

    def __enter__(self) -> "ModelProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
