"""engine = "bam"'s CPU stand-in on the controllers a job starts itself: the Python model,
the compiled controller and QEMU's hw/nvme over qtest (no guest). The same block jobs a
drive gets, the bytes that land and the bytes written checked at their offsets."""

from __future__ import annotations

import pytest

from gpufio.core import pattern
from gpufio.io.nvme import compiled, qemu
from gpufio.profile import from_dict
from gpufio.workloads.block import runner

CONTROLLERS = [
    {"controller": "model"},
    pytest.param({"controller": "compiled", "controller_threads": 2},
                 marks=pytest.mark.skipif(not compiled.available(), reason="no C compiler")),
    pytest.param({"controller": "compiled", "controller_backend": "file"},
                 marks=pytest.mark.skipif(not compiled.available(), reason="no C compiler")),
    pytest.param({"controller": "qemu"}, marks=[
        pytest.mark.qemu,
        pytest.mark.skipif(qemu.binary() is None, reason="no qemu-system-x86_64 here")]),
]
IDS = ["model", "compiled-ram", "compiled-file", "qemu"]


def run(path, **opts):
    prof = from_dict({"global": {"engine": "bam", "submitter": "cpu", "targets": [str(path)],
                                 **opts}}, "t.toml", {})
    return runner.run_profile(prof, quiet=True).results


@pytest.mark.parametrize("ctl", CONTROLLERS, ids=IDS)
def test_the_stand_in_writes_the_pattern_and_reads_it_back_verified(ctl, tmp_path):
    target = tmp_path / "ns.img"
    target.write_bytes(bytes(512 << 10))
    (w,) = run(target, **ctl, rw="write", bs="8k", iodepth=8, numjobs=2, overwrite=True,
               verify=True, end_fsync=True)
    assert w.ok, (w.failure, w.errors)
    assert w.write.ios == 2 * 64 and w.verify_failures == 0 and w.syncs == 2  # each worker
    assert target.read_bytes() == pattern.fill(0x89, 0, 512 << 10)
    assert w.engine_facts["controller"] == ctl["controller"]
    (r,) = run(target, **ctl, rw="randread", bs="64k", iodepth=4, verify=True)  # PRP lists
    assert r.ok and r.read.ios == 8 and r.verify_failures == 0


@pytest.mark.parametrize("ctl", [CONTROLLERS[1], CONTROLLERS[3]], ids=["compiled", "qemu"])
def test_4k_blocks_refuse_what_is_not_whole_blocks(ctl, pattern_file):
    (r,) = run(pattern_file, **ctl, model_lba=4096, rw="randread", bs="4k", io_size="256k",
               verify=True)
    assert r.ok and r.read.ios == 64 and r.verify_failures == 0


@pytest.mark.parametrize("ctl", CONTROLLERS[:2], ids=IDS[:2])
def test_a_software_controller_serves_each_target_as_a_modelled_namespace(ctl, tmp_path):
    """Two targets: namespaces 1 and 2 of the one controller, each behind a drive model of
    its own; each file gets its own pattern, read back verified; results say emulated."""
    targets = [tmp_path / "ssd0.img", tmp_path / "ssd1.img"]
    for t in targets:
        t.write_bytes(bytes(256 << 10))

    def both(**opts):
        prof = from_dict({"global": {"engine": "bam", "submitter": "cpu", **ctl,
                                     "targets": [str(t) for t in targets],
                                     "drive_model": "micron-9550", **opts}}, "t.toml", {})
        return runner.run_profile(prof, quiet=True).results

    (w,) = both(rw="write", bs="8k", iodepth=8, overwrite=True, verify=True, end_fsync=True)
    assert w.ok, (w.failure, w.errors)
    assert w.write.ios == 64 and w.verify_failures == 0
    assert "emulated: micron-9550" in w.engine_facts["mode"]
    for t in targets:
        assert t.read_bytes() == pattern.fill(0x89, 0, 256 << 10)
    (r,) = both(rw="randread", bs="64k", iodepth=4, verify=True)
    assert r.ok and r.read.ios == 8 and r.verify_failures == 0


@pytest.mark.parametrize("ctl", CONTROLLERS[:2], ids=IDS[:2])
def test_the_row_fetch_controller_serves_every_pair_it_creates(ctl, tmp_path):
    """The GPU row fetch's software controller (bam._row_controller) over a table striped
    on two files, with row_pairs = 3: three pairs of depth + 1 entries, each completing
    reads of both namespaces from the CPU driver byte for byte, into landing slots and PRP
    list pages for every pair's depth (what NvmeQueues takes) within the memory it was
    sized for."""
    import numpy as np

    from gpufio.core import targets
    from gpufio.engines.bam import Bam, _row_controller, row_pairs
    from gpufio.io.nvme import spec as nq

    files = [tmp_path / "ssd0.dat", tmp_path / "ssd1.dat"]
    for k, f in enumerate(files):
        targets.create_file(str(f), 1 << 20, 20 + k)
    job = from_dict({"global": {"engine": "bam", **ctl, "row_pairs": 3, "size": "1m"}},
                    "t.toml", {}).jobs[0]
    o = Bam.settings(job)
    n, depth, row = row_pairs(o, len(files)), 64, nq.PAGE
    served, pairs = _row_controller(o, [str(f) for f in files], n, depth, row)
    try:
        assert [p.qid for p in pairs] == [1, 2, 3]
        assert all(p.entries == depth + 1 for p in pairs)
        slots, iova = served.mem.alloc(n * depth * (row + nq.PAGE))
        nsids = np.tile([1, 2], depth // 2)
        for r, pair in enumerate(pairs):
            s = r * depth + np.arange(depth)
            offs = (s * row).astype(np.uint64)
            e = nq.io_commands(write=False, nsid=nsids, lba_shift=9, off=offs,
                               length=np.full(depth, row), cid=np.arange(depth),
                               prp1=(iova + s * row).astype(np.uint64),
                               prp2=np.zeros(depth, np.uint64))
            cqes = pair.run(e, 10**10)
            assert nq.result(cqes["status"], row).tolist() == [row] * depth
            for k in range(depth):
                got = slots[s[k] * row:(s[k] + 1) * row].tobytes()
                assert got == pattern.fill(19 + int(nsids[k]), int(offs[k]), row)
    finally:
        served.close()
