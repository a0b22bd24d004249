"""One conformance suite for every NVMe controller gpufio drives without a drive: the Python
model (io/nvme/model.py), the compiled controller (io/nvme/controller.c, each backend) and
QEMU's hw/nvme over qtest (io/nvme/qemu.py), all brought up and driven by the same host
driver a drive gets (io/nvme/pcie_vfio.Controller). Data is checked byte for byte against the
namespace's backing file at its offset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from gpufio.io.nvme import pcie_vfio, model
from gpufio.io.nvme import spec as nq
from gpufio.io.nvme import compiled, qemu, shared
from gpufio.io.nvme.spec import NVME_READ, NVME_WRITE
from gpufio.io.watchdog import Stalled

NS_BYTES = 4 << 20
WAIT_S = 10.0
NO_QEMU = "no qemu-system-x86_64 here (apt-get install qemu-system-x86)"
NO_CC = "no C compiler: the compiled controller is not built"

QEMU = pytest.param("qemu", marks=[pytest.mark.qemu,
                                   pytest.mark.skipif(qemu.binary() is None, reason=NO_QEMU)])


def _compiled(backend: str) -> object:
    return pytest.param(f"compiled-{backend}",
                        marks=pytest.mark.skipif(not compiled.available(), reason=NO_CC))


SOFTWARE = ["model", _compiled("ram"), _compiled("file"), _compiled("none")]
EVERY = [*SOFTWARE, QEMU]


class Under:
    """A controller under test: its host driver (``ctl``), its DMA memory (``device``),
    its namespace's backing file and whether reads move data (not the none backend)."""

    def __init__(self, kind: str, tmp: Path, lba_bytes: int, faults: tuple = ()) -> None:
        self.kind, self.lba_bytes = kind, lba_bytes
        self.backing = tmp / "ns.dat"
        self.data = np.random.default_rng(5).integers(0, 256, NS_BYTES, dtype=np.uint8)
        self.data.tofile(self.backing)
        self.moves_data = kind != "compiled-none"
        self._stop = []
        if kind == "qemu":
            q = qemu.QemuNvme(str(self.backing), lba_bytes, ram_bytes=64 << 20)
            self._stop.append(q.close)
            self.device = q.device
        else:
            server = None if kind == "model" else compiled.server(2, kind.split("-")[1])
            p = model.ModelProcess(tmp, self.backing, lba_bytes.bit_length() - 1,
                                        16 << 20, list(faults), server=server)
            self._stop.append(p.stop)
            self.process = p
            self.device = shared.SharedDevice(p.mem, kind)
        self.ctl = pcie_vfio.Controller(self.device)

    def on_disk(self, off: int, n: int) -> bytes:
        with open(self.backing, "rb") as f:
            return os.pread(f.fileno(), n, off)

    def close(self) -> None:
        for stop in self._stop:
            stop()


@pytest.fixture
def under(request, tmp_path):
    """The controller named by the test's ``kind`` parameter, 512-byte blocks unless the
    test's ``lba`` parameter says otherwise; stopped afterwards."""
    lba = getattr(request, "param", None) or request.node.callspec.params.get("lba", 512)
    u = Under(request.node.callspec.params["kind"], tmp_path, lba)
    yield u
    u.close()


def run(pair: pcie_vfio.QueuePair, entries: np.ndarray) -> np.ndarray:
    """Submit ``entries`` (at most the queue's room at once) and wait for every completion:
    their statuses (SCT << 8 | SC) in the entries' order."""
    done: dict[int, int] = {}
    sent = 0
    deadline = time.monotonic() + WAIT_S
    while len(done) < len(entries):
        room = pair.space()
        if room and sent < len(entries):
            pair.submit(entries[sent:sent + room])
            sent += min(room, len(entries) - sent)
        cids, status = pair.reap()
        done.update(zip(cids.tolist(), nq.status_of(status).tolist()))
        assert time.monotonic() < deadline, f"no completion of cids {set(entries['cid'].tolist()) - set(done)}"
    return np.array([done[int(c)] for c in entries["cid"]])


def io(u: Under, write: bool, off: int, length: int, buf_off: int = 0,
       cid: int = 1) -> tuple[np.ndarray, object]:
    """One read (or write) command of ``length`` bytes at byte ``off``, its data ``buf_off``
    bytes into a fresh buffer (a PRP list built where it spans more than two pages): the
    entry and the buffer."""
    buf = u.device.memory(buf_off + length)
    lst = u.device.memory(nq.PAGE)
    prp1, prp2, rest = nq.prp_pointers(buf.iova + buf_off, length, lst.iova)
    lst.map[:rest.nbytes] = rest.view(np.uint8)
    shift = u.lba_bytes.bit_length() - 1
    e = nq.io_commands(write=write, nsid=1, lba_shift=shift, off=np.array([off]),
                       length=length, cid=np.array([cid]), prp1=np.array([prp1]),
                       prp2=np.array([prp2]))
    return e, buf


@pytest.mark.parametrize("kind", EVERY)
@pytest.mark.parametrize("lba", [512, 4096])
def test_bring_up_identifies_the_namespace(under, kind, lba):
    info = under.ctl.identify()
    assert info["ns"][1] == {"blocks": NS_BYTES // lba, "lba_bytes": lba}
    assert info["namespaces"] >= 1
    cap = under.ctl.cap
    assert cap["max_depth"] >= 64 and cap["cqr"] == 1 and cap["mpsmin"] == nq.PAGE
    under.ctl.shutdown()
    assert under.device.bar0.r32(nq.REG_CSTS) & nq.CSTS_RDY == 0


@pytest.mark.parametrize("kind", EVERY)
def test_an_orderly_shutdown_completes(under, kind):
    bar = under.device.bar0
    bar.w32(nq.REG_CC, bar.r32(nq.REG_CC) | nq.CC_SHN_NORMAL)
    deadline = time.monotonic() + WAIT_S
    while bar.r32(nq.REG_CSTS) & nq.CSTS_SHST_MASK != nq.CSTS_SHST_DONE:
        assert time.monotonic() < deadline, "CSTS.SHST never said complete"
        time.sleep(0.001)


# (byte offset, length, offset into the buffer): PRP1 alone, PRP1 + PRP2 (the first page
# entered past its start, on a 512-byte or only a dword boundary), a PRP list
TRANSFERS = [(0, 4096, 0), (8192, 4096, 512), (12288, 8192, 0), (20480, 4096, 4),
             (65536, 65536, 0), (1 << 20, 131072, 512)]


@pytest.mark.parametrize("kind", EVERY)
@pytest.mark.parametrize("lba", [512, 4096])
def test_reads_land_the_bytes_at_their_offsets_on_several_pairs(under, kind, lba):
    pairs = under.ctl.create_pairs(3, 32)
    for i, (off, length, buf_off) in enumerate(TRANSFERS):
        if lba == 4096 and (off % lba or length % lba):
            continue
        e, buf = io(under, False, off, length, buf_off, cid=i + 1)
        assert run(pairs[i % 3], e).tolist() == [0]
        got = buf.map[buf_off:buf_off + length]
        if under.moves_data:
            assert bytes(got) == bytes(under.data[off:off + length]), (off, length, buf_off)
        else:
            assert not got.any()  # none: nothing moved


@pytest.mark.parametrize("kind", EVERY)
@pytest.mark.parametrize("lba", [512, 4096])
def test_writes_reach_the_backing_file_and_read_back(under, kind, lba):
    a, b = under.ctl.create_pairs(2, 16)
    rng = np.random.default_rng(lba)
    for i, (off, length, buf_off) in enumerate(TRANSFERS):
        e, buf = io(under, True, off, length, buf_off, cid=i + 1)
        new = rng.integers(0, 256, length, dtype=np.uint8)
        buf.map[buf_off:buf_off + length] = new
        assert run(a, e).tolist() == [0]
        e2, back = io(under, False, off, length, cid=100 + i)
        assert run(b, e2).tolist() == [0]
        if under.moves_data:
            assert bytes(back.map[:length]) == new.tobytes()
            assert under.on_disk(off, length) == new.tobytes()
        else:
            assert under.on_disk(off, length) == bytes(under.data[off:off + length])
    assert run(a, nq.flush_command(1, 77)).tolist() == [0]


@pytest.mark.parametrize("kind", EVERY)
def test_phase_tags_wrap_on_a_small_queue(under, kind):
    (pair,) = under.ctl.create_pairs(1, 4)
    bufs = under.device.memory(40 * 512)
    offs = np.arange(40) * 4096
    e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=offs, length=512,
                       cid=np.arange(40), prp1=bufs.iova + np.arange(40) * 512,
                       prp2=np.zeros(40, np.uint64))
    assert run(pair, e).tolist() == [0] * 40
    assert pair.phase == 40 // 4 % 2 ^ 1  # ten passes over 4 entries: phase back to 1
    if under.moves_data:
        got = bufs.map.reshape(40, 512)
        want = under.data.reshape(-1, 4096)[:40, :512]
        assert (got == want).all()


@pytest.mark.parametrize("kind", EVERY)
def test_bad_commands_get_their_status_codes(under, kind):
    (pair,) = under.ctl.create_pairs(1, 16)
    blocks = NS_BYTES // 512
    past, _ = io(under, False, (blocks - 4) * 512, 4096, cid=1)  # 4 blocks past the end
    bad_list, _ = io(under, False, 0, 16384, cid=2)
    lst = under.device.memory(nq.PAGE)
    lst.map.view("<u8")[:3] = [(1 << 36) + 100] * 3 if kind != "qemu" else [0x300100] * 3
    bad_list["prp2"] = lst.iova  # a PRP list whose entries are not page aligned
    two, _ = io(under, False, 0, 8192, cid=3)
    two["prp2"] += 8  # PRP2 of a two-page transfer not page aligned
    opcode, _ = io(under, False, 0, 512, cid=4)
    opcode["opcode"] = 0x7F
    nsid, _ = io(under, False, 0, 512, cid=5)
    nsid["nsid"] = 1000  # past NN everywhere (QEMU's 256: 9 is a valid, inactive one)
    got = run(pair, np.concatenate([past, bad_list, two, opcode, nsid]))
    assert got.tolist() == [nq.SC_LBA_RANGE, nq.SC_PRP_OFFSET, nq.SC_PRP_OFFSET,
                            nq.SC_INVALID_OPCODE, 0x0B]
    with pytest.raises(pcie_vfio.ControllerError, match="status 0x101"):
        under.ctl.command(nq.create_cq, 0, 16, under.device.memory(4096).iova)


@pytest.mark.parametrize("kind", SOFTWARE)
def test_injected_faults_fail_or_hold_their_commands(tmp_path, kind):
    faults = (model.Fault(slba=8, status=0x281), model.Fault(slba=16, drop=True))
    u = Under(kind, tmp_path, 512, faults)
    try:
        (pair,) = u.ctl.create_pairs(1, 16)
        e = np.concatenate([io(u, False, 8 * 512, 512, cid=1)[0],
                            io(u, False, 24 * 512, 512, cid=3)[0],
                            io(u, False, 8 * 512, 512, cid=4)[0]])
        assert run(pair, e).tolist() == [0x281, 0, 0]  # once, then the command succeeds
        pair.submit(io(u, False, 16 * 512, 512, cid=2)[0])
        mem = u.process.mem
        deadline = time.monotonic() + WAIT_S
        while mem.reg64(model.M_FETCHED) < mem.reg64(model.M_COMPLETED) + 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert len(pair.reap()[0]) == 0  # consumed, never completed
    finally:
        u.close()


@pytest.mark.parametrize("kind", SOFTWARE[:2])
def test_a_killed_controller_is_named_by_the_driver_that_waits(tmp_path, kind):
    backing = tmp_path / "ns.dat"
    backing.write_bytes(bytes(1 << 20))
    server = None if kind == "model" else compiled.server(2, "ram")
    with model.ModelProcess(tmp_path, backing, server=server) as p:
        pair = p.host().create_pair(1, 8)
        os.kill(p.mem.server.pid, signal.SIGKILL)
        p.mem.server.join()
        buf, iova = p.mem.alloc(512)
        e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=np.array([0]), length=512,
                           cid=np.array([1]), prp1=np.array([iova]), prp2=np.array([0]))
        with pytest.raises(Stalled, match="killed by signal 9"):
            pair.run(e, 200_000_000)


CHILD = """
import sys, time
from gpufio.io.nvme import model
from gpufio.io.nvme import compiled, qemu
if __name__ == "__main__":
    if sys.argv[1] == "qemu":
        q = qemu.QemuNvme(sys.argv[2])
        print(q.proc.pid, flush=True)
    else:
        p = model.ModelProcess(sys.argv[3], sys.argv[2], server=compiled.server(2, "ram"))
        p.host()
        print(p.mem.server.pid, flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] == "Z"  # a zombie: dead, not yet reaped
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("kind", [_compiled("ram"), QEMU])
def test_a_killed_gpufio_leaves_no_controller_behind(tmp_path, kind):
    backing = tmp_path / "ns.dat"
    backing.write_bytes(bytes(1 << 20))
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    child = subprocess.Popen([sys.executable, str(script), kind, str(backing), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    try:
        pid = int(child.stdout.readline())
        assert not _gone(pid)
        child.kill()
        child.wait()
        deadline = time.monotonic() + WAIT_S
        while not _gone(pid):
            assert time.monotonic() < deadline, f"controller process {pid} outlived gpufio"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    if kind == "qemu":
        after = set(os.listdir("/dev/shm"))
        assert not [n for n in after - before if n.startswith("gpufio-qemu-")]


@pytest.mark.qemu
@pytest.mark.skipif(qemu.binary() is None, reason=NO_QEMU)
def test_qemu_shadow_doorbells_need_only_a_periodic_kick(tmp_path):
    """With Doorbell Buffer Config on, the host writes SQ tails and CQ heads into the shadow
    page only; QEMU reads them there once some MMIO doorbell write makes it look, which
    the Kicker does every period: every command completes, more than a queue's worth."""
    u = Under("qemu", tmp_path, 512)
    try:
        (pair,) = u.ctl.create_pairs(1, 8)
        kick = qemu.Kicker(u.device, u.ctl, [pair])
        try:
            bufs = u.device.memory(64 * 512)
            offs = np.arange(64) * 4096
            e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=offs, length=512,
                               cid=np.arange(64), prp1=bufs.iova + np.arange(64) * 512,
                               prp2=np.zeros(64, np.uint64))
            done, sent = 0, 0
            deadline = time.monotonic() + WAIT_S
            while done < 64:
                while sent < 64 and pair.space():
                    pair.sq[pair.tail] = e[sent]
                    pair.tail = (pair.tail + 1) % pair.depth
                    pair.inflight += 1
                    sent += 1
                kick.shadow[2 * pair.qid] = pair.tail  # no MMIO: the shadow alone
                while int(pair.cq[pair.head]["status"]) & 1 == pair.phase:
                    assert nq.status_of(pair.cq[pair.head]["status"]) == 0
                    pair.head = (pair.head + 1) % pair.depth
                    pair.phase ^= pair.head == 0
                    pair.inflight -= 1
                    done += 1
                kick.shadow[2 * pair.qid + 1] = pair.head
                assert time.monotonic() < deadline, f"{done} of 64 completed"
            assert kick.kicks > 0
            assert (bufs.map.reshape(64, 512) == u.data.reshape(-1, 4096)[:64, :512]).all()
        finally:
            kick.close()
    finally:
        u.close()


def test_an_unpacked_qemu_is_given_its_own_firmware(tmp_path):
    prefix = tmp_path / "usr"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "share" / "seabios").mkdir(parents=True)
    assert qemu.firmware_dirs(str(prefix / "bin" / "qemu-system-x86_64")) == [
        "-L", str(prefix / "share" / "seabios")]
    assert qemu.firmware_dirs("/usr/bin/qemu-system-x86_64") == []
