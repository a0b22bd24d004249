"""The guardian of a controller gpufio took over vfio-pci: a separate process that gives it
back to its driver when the runner dies, however it dies (kill -9 included).

It is started with the controller's PCI address before the job takes the controller, and
reads its standard input until end of file: the runner closes it when the job is over, and
the kernel closes it when the runner dies. If the controller is then still on vfio-pci but
was on another driver when the guardian started, the guardian disables it (CC.EN = 0, bus
mastering off, through its own vfio descriptors, free once the runner's are closed) and
binds it to that driver again. After a clean job it finds the controller given back and
does nothing.
"""

from __future__ import annotations

import signal
import sys
import time

from gpufio.io import nvme_queue as nq
from gpufio.io import vfio

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


def main(argv: list[str]) -> int:
    """``python -m gpufio.io.nvme_guardian BDF``: guard ``BDF`` until stdin closes."""
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
