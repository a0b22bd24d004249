"""The compiled NVMe controller's own pieces beyond the conformance suite: its compiled CPU
driver (the bench's CPU-driven ceiling) and its configuration."""

from __future__ import annotations

import numpy as np
import pytest

from gpufio.io.nvme import model
from gpufio.io.nvme import compiled

pytestmark = pytest.mark.skipif(not compiled.available(), reason="no C compiler: the "
                                "compiled controller is not built")


@pytest.mark.parametrize("backend, bs", [("ram", 4096), ("ram", 512), ("none", 4096)])
def test_the_compiled_driver_completes_every_read_on_every_pair(tmp_path, backend, bs):
    backing = tmp_path / "ns.dat"
    backing.write_bytes(b"\xa5" * (1 << 20))
    with model.ModelProcess(tmp_path, backing, server=compiled.server(2, backend)) as p:
        host = p.host()
        pairs = [host.create_pair(1 + i, 17) for i in range(3)]
        before = p.mem.reg64(model.M_COMPLETED)
        good, seconds = compiled.cpu_reads(p.mem, pairs, 2000, 16, bs, 9, (1 << 20) >> 9, 2)
        assert good == 3 * 2000 and seconds > 0
        assert p.mem.reg64(model.M_COMPLETED) - before == 3 * 2000
        # the driver's slots come right after the queues: what landed is the namespace's
        slots = p.mem.dma[pairs[-1].cq_iova - model.IOVA_BASE + 17 * 16:]
        landed = np.count_nonzero(slots[:3 * 16 * bs + 4 * 4096] == 0xA5)
        assert landed == (3 * 16 * bs if backend == "ram" else 0)


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'disk' is not one of none, ram, file"):
        compiled.server(1, "disk")
