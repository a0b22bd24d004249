"""The compiled NVMe controller's own pieces beyond the conformance suite: its compiled CPU
driver (the bench's CPU-driven ceiling) and its configuration."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpufio.io.nvme import model
from gpufio.io.nvme import compiled

pytestmark = pytest.mark.skipif(not compiled.available(), reason="no C compiler: the "
                                "compiled controller is not built")


def settled(mem: model.Memory, limit_s: float = 10.0) -> int:
    """M_COMPLETED once it has caught up with M_FETCHED: a poller adds a pass's counts after
    the pass has posted its completions, so a host that saw a CQE may read the count first."""
    deadline = time.monotonic() + limit_s
    while (done := mem.reg64(model.M_COMPLETED)) != mem.reg64(model.M_FETCHED) \
            and time.monotonic() < deadline:
        time.sleep(0.001)
    return done


@pytest.mark.parametrize("backend, bs", [("ram", 4096), ("ram", 512), ("none", 4096)])
def test_the_compiled_driver_completes_every_read_on_every_pair(tmp_path, backend, bs):
    backing = tmp_path / "ns.dat"
    backing.write_bytes(b"\xa5" * (1 << 20))
    with model.ModelProcess(tmp_path, backing, server=compiled.server(2, backend)) as p:
        host = p.host()
        pairs = [host.create_pair(1 + i, 17) for i in range(3)]
        before = settled(p.mem)
        good, seconds = compiled.cpu_reads(p.mem, pairs, 2000, 16, bs, 9, (1 << 20) >> 9, 2)
        assert good == 3 * 2000 and seconds > 0
        assert settled(p.mem) - before == 3 * 2000
        # the driver's slots come right after the queues: what landed is the namespace's
        slots = p.mem.dma[pairs[-1].cq_iova - model.IOVA_BASE + 17 * 16:]
        landed = np.count_nonzero(slots[:3 * 16 * bs + 4 * 4096] == 0xA5)
        assert landed == (3 * 16 * bs if backend == "ram" else 0)


def test_the_pollers_count_the_ns_of_their_busy_passes_within_their_wall_time(tmp_path):
    """M_BUSY_NS: nothing before any command; after the reads, more than nothing and never
    more than every poller busy all along (CLOCK_MONOTONIC, the controller's clock)."""
    backing = tmp_path / "ns.dat"
    backing.write_bytes(b"\xa5" * (1 << 20))
    threads = 2
    with model.ModelProcess(tmp_path, backing, server=compiled.server(threads, "ram")) as p:
        model._wait("the controller process", lambda: p.mem.reg(model.M_ALIVE) == 1)
        start = time.monotonic_ns()
        assert compiled.busy_ns(p.mem) == 0  # not enabled: no pass did work
        host = p.host()
        pairs = [host.create_pair(1 + i, 17) for i in range(3)]
        good, _ = compiled.cpu_reads(p.mem, pairs, 500, 16, 4096, 9, (1 << 20) >> 9, 2)
        busy = compiled.busy_ns(p.mem)
        elapsed = time.monotonic_ns() - start
        assert good == 3 * 500
        assert 0 < busy <= threads * elapsed


def test_the_python_model_leaves_the_busy_word_at_zero(tmp_path):
    backing = tmp_path / "ns.dat"
    backing.write_bytes(b"\xa5" * (1 << 16))
    with model.ModelProcess(tmp_path, backing) as p:
        p.host().create_pair(1, 9)  # admin commands it served
        assert p.mem.reg64(model.M_COMPLETED) > 0 and compiled.busy_ns(p.mem) == 0


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'disk' is not one of none, ram, file"):
        compiled.server(1, "disk")
