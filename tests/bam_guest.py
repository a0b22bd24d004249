"""Runs in the NVMe rig's guest (tests/engines/test_bam_rig.py): the bam host side end to end in
one interpreter, TCG being slow. Prints one JSON object of what it saw.

``python3 tests/bam_guest.py SERIAL WORKDIR``: takes the controller with that serial from
the nvme driver, brings it up over vfio-pci, identifies it, creates queue pairs, reads
through a PRP list, writes, shuts it down, gives it back and reads the namespace again
through the kernel.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from gpufio.core.errors import BadInput
from gpufio.io.nvme import pcie_vfio, vfio
from gpufio.io.nvme import spec as nq


def by_serial(serial: str) -> tuple[str, str] | None:
    """(PCI address, first namespace block device) of the nvme controller with ``serial``."""
    for ctrl in sorted(Path("/sys/class/nvme").glob("nvme*")):
        if (ctrl / "serial").read_text().strip() == serial:
            addr = (ctrl / "address").read_text().strip()
            ns = pcie_vfio.namespaces_of(addr)
            return addr, ns[0] if ns else ""
    return None


def wait_for(serial: str) -> tuple[str, str]:
    """The controller's namespace once the nvme driver has it again (it probes async)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = by_serial(serial)
        if found and found[1] and os.path.exists(found[1]):
            return found
        time.sleep(0.05)
    raise RuntimeError(f"{serial}: no namespace after rebinding")


def io(pair: pcie_vfio.QueuePair, entry: np.ndarray) -> int:
    pair.submit(entry)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cids, status = pair.reap()
        if len(cids):
            return int(nq.status_of(status[0]))
    raise RuntimeError("no completion")


def pattern(n: int, seed: int) -> bytes:
    return ((np.arange(n, dtype=np.uint32) * 7 + seed) % 251).astype(np.uint8).tobytes()


def main(serial: str) -> dict:
    out: dict = {}
    bdf, ns = by_serial(serial)
    out["bdf"], out["namespace"] = bdf, ns
    lba = int(Path(f"/sys/block/{os.path.basename(ns)}/queue/logical_block_size").read_text())
    # lay out bytes through the kernel first, at byte 64 KiB
    want = pattern(5 * nq.PAGE, 3)
    fd = os.open(ns, os.O_RDWR)
    os.pwrite(fd, want, 65536)
    os.fsync(fd)
    os.close(fd)
    s = pcie_vfio.Session(bdf, writes=True)
    try:
        out["driver_during"] = vfio.driver_of(bdf)
        out["block_device_during"] = os.path.exists(ns)
        info = s.info
        out["serial"], out["model"] = info["serial"], info["model"]
        out["ns"] = {str(k): v for k, v in info["ns"].items()}
        out["cap"] = s.controller.cap
        depth = min(64, s.controller.cap["max_depth"])
        pairs = s.controller.create_pairs(2, depth)
        out["pairs"] = [(p.qid, p.depth, p.sq_db, p.cq_db) for p in pairs]
        data = s.device.memory(8 * nq.PAGE)
        plist = s.device.memory(nq.PAGE)
        # a read of 4 pages + 512 bytes starting 512 bytes into a page: a PRP list of 4
        start = 512
        length = 4 * nq.PAGE + 512 if lba == 512 else 4 * nq.PAGE
        if lba != 512:
            start = 0
        prp1, prp2, entries = nq.prp_pointers(data.iova + start, length, plist.iova)
        np.frombuffer(plist.map, "<u8", len(entries))[:] = entries
        out["prp_entries"] = len(entries)
        e = nq.io_commands(write=False, nsid=1, lba_shift=lba.bit_length() - 1,
                           off=np.array([65536]), length=length, cid=np.array([7]),
                           prp1=np.array([prp1]), prp2=np.array([prp2]))
        out["read_status"] = io(pairs[0], e)
        out["read_ok"] = bytes(data.map[start:start + length]) == want[:length]
        # a write of 2 pages (PRP2 the second page) at byte 1 MiB, on the second pair
        data.map[0:2 * nq.PAGE] = pattern(2 * nq.PAGE, 9)
        prp1, prp2, entries = nq.prp_pointers(data.iova, 2 * nq.PAGE, plist.iova)
        e = nq.io_commands(write=True, nsid=1, lba_shift=lba.bit_length() - 1,
                           off=np.array([1 << 20]), length=2 * nq.PAGE, cid=np.array([8]),
                           prp1=np.array([prp1]), prp2=np.array([prp2]))
        out["write_status"] = io(pairs[1], e)
        # a read past the namespace's end: the controller's error comes back as a status
        blocks = info["ns"][1]["blocks"]
        e = nq.io_commands(write=False, nsid=1, lba_shift=lba.bit_length() - 1,
                           off=np.array([blocks * lba]), length=lba, cid=np.array([9]),
                           prp1=np.array([data.iova]), prp2=np.array([0]))
        out["past_end_status"] = io(pairs[0], e)
    finally:
        s.close()
    out["driver_after"] = vfio.driver_of(bdf)
    _, ns2 = wait_for(serial)
    out["namespace_after"] = ns2
    fd = os.open(ns2, os.O_RDONLY | os.O_DIRECT)
    import mmap
    buf = mmap.mmap(-1, 2 * nq.PAGE)
    os.preadv(fd, [buf], 1 << 20)
    os.close(fd)
    out["write_read_back"] = bytes(buf) == pattern(2 * nq.PAGE, 9)
    try:
        pcie_vfio.take("0000:ff:1f.7", writes=False)
    except BadInput as e:
        out["refuse_missing"] = str(e)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
