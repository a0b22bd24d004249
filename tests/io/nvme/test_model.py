"""The software NVMe controller (io/nvme/model.py, in its own process: ModelProcess)
against a CPU writer of the same entries (io/nvme/spec.py): reads byte-exact against the
pattern through PRP1, PRP2 and PRP lists, writes, Flush, queues that wrap their phase, odd
depths and 4096-byte LBAs, injected statuses (one failed I/O, named by
io/nvme/spec.error_name), a dropped completion caught by the watchdog, and a reset."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpufio.core import pattern, targets
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme.model import Fault, ModelProcess
from gpufio.io.watchdog import Stalled

SEED = 1234
SIZE = 4 << 20


@pytest.fixture
def model(tmp_path):
    """A factory: model(lba_shift=9, faults=[]) -> (ModelProcess, Host); stopped after."""
    started = []
    backing = tmp_path / "ns.dat"
    targets.create_file(str(backing), SIZE, SEED)

    def make(lba_shift: int = 9, faults: list[Fault] = ()):
        m = ModelProcess(tmp_path, backing, lba_shift, 16 << 20, list(faults))
        started.append(m)
        return m, m.host()

    yield make
    for m in started:
        m.stop()


def reads(mem, offs, lens, shift, skew=0):
    """Read commands, each into a buffer of its own that starts ``skew`` bytes into a page."""
    bufs, prp1, prp2 = [], [], []
    for n in lens:
        view, iova = mem.alloc(n + skew + nq.PAGE)
        pages = nq.prp_pages(iova + skew, n)
        bufs.append(view[skew:skew + n])
        prp1.append(pages[0])
        if len(pages) == 2:
            prp2.append(pages[1])
        elif len(pages) > 2:
            lst, liova = mem.alloc(8 * len(pages))
            lst.view("<u8")[:len(pages) - 1] = pages[1:]
            prp2.append(liova)
        else:
            prp2.append(0)
    e = nq.io_commands(write=False, nsid=1, lba_shift=shift, off=np.array(offs, np.uint64),
                       length=np.array(lens), cid=np.arange(len(offs)),
                       prp1=np.array(prp1, np.uint64), prp2=np.array(prp2, np.uint64))
    return e, bufs


@pytest.mark.parametrize("skew", [0, 512])
def test_reads_are_byte_exact_through_prp_lists_and_a_wrapping_odd_queue(model, skew):
    m, host = model()
    pair = host.create_pair(1, 7)  # not a power of two; 40 commands wrap it five times
    rng = np.random.default_rng(1)
    lens = [512, 4096, 8192, 12288, 65536, 5120, 4096 * 20, 1024] * 5
    offs = [int(rng.integers(0, (SIZE - n) // 512)) * 512 for n in lens]
    e, bufs = reads(m.mem, offs, lens, 9, skew)
    cqes = pair.run(e, 10**10)
    assert list(nq.result(cqes["status"], np.array(lens))) == lens
    for off, n, buf in zip(offs, lens, bufs):
        assert buf.tobytes() == pattern.fill(SEED, off, n)
    assert set(cqes["sq_id"]) == {1}


def test_writes_flush_and_read_back_with_4096_byte_lbas(model):
    m, host = model(lba_shift=12)
    pair = host.create_pair(1, 5)
    data = np.frombuffer(pattern.fill(99, 0, 3 * 4096), np.uint8)
    src, iova = m.mem.alloc(len(data))
    src[:] = data
    lst, liova = m.mem.alloc(16)
    lst.view("<u8")[:2] = [iova + 4096, iova + 8192]
    w = nq.io_commands(write=True, nsid=1, lba_shift=12, off=np.array([8192], np.uint64),
                       length=len(data), cid=np.array([1]), prp1=np.array([iova], np.uint64),
                       prp2=np.array([liova], np.uint64))
    assert list(nq.status_of(pair.run(w, 10**10)["status"])) == [0]
    assert list(nq.status_of(pair.run(nq.flush_command(1, 2), 10**10)["status"])) == [0]
    e, bufs = reads(m.mem, [8192], [len(data)], 12)
    pair.run(e, 10**10)
    assert bufs[0].tobytes() == data.tobytes()
    status, _ = host.admin(nq.ADMIN_IDENTIFY, nsid=1, prp1=host.mem.alloc(4096)[1], cdw10=0)
    assert status == 0


def test_an_injected_status_fails_one_io_and_is_named(model):
    m, host = model(faults=[Fault(slba=32, status=0x281)])
    pair = host.create_pair(1, 8)
    e, _ = reads(m.mem, [0, 8192, 16384], [4096] * 3, 9)
    res = nq.result(pair.run(e, 10**10)["status"], 4096)
    assert list(res[:2]) == [4096, 4096]
    assert nq.error_name(-int(res[2])) == \
        "NVMe status 0x281: media and data integrity, unrecovered read error"


def test_bad_commands_get_the_specifications_status(model):
    m, host = model()
    pair = host.create_pair(1, 4)
    e, _ = reads(m.mem, [SIZE, 0], [4096, 4096], 9)
    e["prp1"][1] += 2  # not dword aligned
    st = nq.status_of(pair.run(e, 10**10)["status"])
    assert list(st) == [nq.SC_LBA_RANGE, nq.SC_PRP_OFFSET]
    assert host.admin(nq.ADMIN_CREATE_SQ, prp1=pair.sq_iova, cdw10=3 << 16 | 2,
                      cdw11=9 << 16)[0] == nq.SC_INVALID_QID


def test_a_dropped_completion_is_caught_by_the_watchdog_and_a_reset_recovers(model):
    m, host = model(faults=[Fault(slba=8, drop=True)])
    pair = host.create_pair(1, 4)
    e, _ = reads(m.mem, [0, 4096, 8192], [4096] * 3, 9)
    with pytest.raises(Stalled, match=r"1 commands outstanding \(cids \[1\]\).*held by the "
                                      "controller"):
        pair.run(e, 200_000_000)
    host.reset()
    host.enable()
    pair = host.create_pair(1, 4)
    e, bufs = reads(m.mem, [4096], [4096], 9)
    assert list(nq.result(pair.run(e, 10**10)["status"], 4096)) == [4096]
    assert bufs[0].tobytes() == pattern.fill(SEED, 4096, 4096)


def test_a_served_file_reads_through_its_own_controller_and_leaves_nothing(tmp_path):
    from gpufio.io.nvme.model import ServedFile

    backing = tmp_path / "ns.dat"
    targets.create_file(str(backing), SIZE, SEED)
    served = ServedFile(str(backing), 12, 1 << 20)
    try:
        assert served.where.startswith("/dev/shm/") or not os.path.isdir("/dev/shm")
        pair = served.host.create_pair(1, 5)
        e, (buf,) = reads(served.mem, [8192], [8192], 12)
        assert nq.status_of(pair.run(e, 10**10)["status"]).tolist() == [0]
        assert buf.tobytes() == pattern.fill(SEED, 8192, 8192)
        assert (pair.sq_db, pair.cq_db) == (nq.doorbell(1, False), nq.doorbell(1, True))
    finally:
        served.close()
    assert not os.path.exists(served.where)


def test_a_controller_started_by_a_thread_outlives_that_thread(model):
    """A job's first worker thread starts the controller that every worker shares; the
    thread's end (its job done first) must not end the controller (PR_SET_PDEATHSIG follows
    the starting thread, not the process)."""
    import threading

    made = []
    starter = threading.Thread(target=lambda: made.append(model()))
    starter.start()
    starter.join()
    m, host = made[0]
    pair = host.create_pair(1, 5)
    for off in (0, 4096, 8192):  # several round trips: the thread's exit has come by now
        e, (buf,) = reads(m.mem, [off], [4096], 9)
        assert nq.status_of(pair.run(e, 5 * 10**9)["status"]).tolist() == [0]
        assert buf.tobytes() == pattern.fill(SEED, off, 4096)
    assert m._proc.exitcode is None


def test_a_stall_names_a_controller_whose_process_has_ended(model):
    m, host = model()
    pair = host.create_pair(1, 5)
    m._proc.kill()
    m._proc.join()
    e, _ = reads(m.mem, [0], [4096], 9)
    with pytest.raises(Stalled, match=r"the software controller's process has ended "
                                      r"\(killed by signal 9\)"):
        pair.run(e, 3 * 10**8)
