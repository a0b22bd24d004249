"""The guardian of a controller gpufio took over vfio-pci: a separate process that gives it
back to its driver when the process that took it dies, however it dies (kill -9 included).

``Guard`` starts it with the controller's PCI address before the controller is taken
(io/nvme/pcie_vfio.Session, so every path that takes one, a block job, a GNN row gather or a
GPU submitter's, is guarded alike). It reads its standard input until end of file: the
session closes it once the controller is given back, and the kernel closes it when the
process dies. If the controller is then still on vfio-pci but
was on another driver when the guardian started, the guardian disables it (CC.EN = 0, bus
mastering off, through its own vfio descriptors, free once the runner's are closed) and
binds it to that driver again. After a clean job it finds the controller given back and
does nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from gpufio.core.errors import BadInput
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme import vfio

# how long the runner's vfio descriptors may take to close after its death
RELEASE_WAIT_S = 30.0


def restore(bdf: str, driver: str | None) -> bool:
    """Reset ``bdf`` and bind it to ``driver`` if it is still on vfio-pci; True if it had
    to."""
    if driver in (None, "vfio-pci") or vfio.driver_of(bdf) != "vfio-pci":
        return False
    deadline = time.monotonic() + RELEASE_WAIT_S
    while True:
        try:
            device = vfio.Device(bdf)
            break
        except Exception:  # the group is busy until the dead runner's files are closed
            if time.monotonic() > deadline:
                device = None
                break
            time.sleep(0.05)
    if device is not None:
        try:
            assert device.bar0 is not None
            device.bar0.w32(nq.REG_CC, 0)
            while device.bar0.r32(nq.REG_CSTS) & nq.CSTS_RDY and time.monotonic() < deadline:
                time.sleep(0.001)
            device.bus_master(False)
        finally:
            device.close()
    vfio.bind(bdf, driver)
    return True


class Guard:
    """The guardian of controller ``bdf`` (``argv``: another command, for tests), started
    in a session of its own, so Ctrl-C and SIGTERM sent to the runner's group do not reach
    it; ready once it has read the driver it must give the controller back to."""

    def __init__(self, bdf: str, argv: list[str] | None = None) -> None:
        argv = argv or [sys.executable, "-m", "gpufio.io.nvme.guardian", bdf]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            self.proc.wait()
            raise BadInput(f"controller {bdf}: its guardian did not start "
                           f"(exit {self.proc.returncode})")

    def release(self) -> None:
        """The controller is given back: let the guardian check it and end; wait for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main(argv: list[str]) -> int:
    """``python -m gpufio.io.nvme.guardian BDF``: guard ``BDF`` until stdin closes."""
    # the runner's Ctrl-C and SIGTERM reach its process group; the guardian outlives both
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    bdf = argv[0]
    driver = vfio.driver_of(bdf)
    sys.stdout.write("guarding\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):
        pass
    restore(bdf, driver)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
