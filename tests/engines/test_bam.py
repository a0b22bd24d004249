"""The bam engine's host side without a controller: PRP lists, admin command bytes from
io/nvme/spec.py, the refusals over a fake sysfs tree, the engine's job checks."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from gpufio.core.errors import BadInput
from gpufio.io.nvme import pcie_vfio, vfio
from gpufio.io.nvme import spec as nq


def test_prp_one_page_two_pages_and_a_list() -> None:
    assert nq.prp_pointers(0x10000, 4096, 0x90000)[:2] == (0x10000, 0)
    p1, p2, rest = nq.prp_pointers(0x10200, 4096, 0x90000)  # crosses into a second page
    assert (p1, p2, len(rest)) == (0x10200, 0x11000, 0)
    p1, p2, rest = nq.prp_pointers(0x10000, 5 * 4096, 0x90000)
    assert (p1, p2) == (0x10000, 0x90000)
    assert rest.tolist() == [0x11000, 0x12000, 0x13000, 0x14000]
    p1, p2, rest = nq.prp_pointers(0x10200, 4 * 4096 + 512, 0x90000)
    assert rest.tolist() == [0x11000, 0x12000, 0x13000, 0x14000]
    with pytest.raises(ValueError, match="chained"):
        nq.prp_pointers(0, (nq.PRP_PER_PAGE + 2) * 4096, 0x90000)


def _words(entry: np.ndarray) -> tuple[int, ...]:
    return struct.unpack("<16I", entry.tobytes())


def test_admin_commands_bytes() -> None:
    w = _words(nq.identify(5, nq.CNS_CONTROLLER, 0x1_0000_2000))
    assert w[0] == 0x06 | 5 << 16 and w[6:8] == (0x2000, 1) and w[10] == 1
    w = _words(nq.identify(6, nq.CNS_NAMESPACE, 0x3000, nsid=2))
    assert w[1] == 2 and w[10] == 0
    w = _words(nq.set_queue_count(7, 4))
    assert w[0] & 0xFF == 0x09 and w[10] == 0x07 and w[11] == 3 << 16 | 3
    w = _words(nq.create_cq(8, 3, 64, 0x5000))
    assert w[0] & 0xFF == 0x05 and w[6] == 0x5000 and w[10] == 63 << 16 | 3 and w[11] == 1
    w = _words(nq.create_sq(9, 3, 64, 0x6000, 3))
    assert w[0] & 0xFF == 0x01 and w[10] == 63 << 16 | 3 and w[11] == 3 << 16 | 1
    assert _words(nq.delete_queue(1, 3, True))[0] & 0xFF == 0x04
    assert _words(nq.delete_queue(1, 3, False))[0] & 0xFF == 0x00


def test_io_command_bytes_with_a_prp_list() -> None:
    e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=np.array([65536]), length=16384,
                       cid=np.array([7]), prp1=np.array([0x10000]), prp2=np.array([0x90000]))
    w = _words(e)
    assert w[0] == 0x02 | 7 << 16 and w[1] == 1 and w[6] == 0x10000 and w[8] == 0x90000
    assert (w[10], w[11], w[12]) == (128, 0, 31)


def test_identify_parsing() -> None:
    page = bytearray(4096)
    page[4:24] = b"rig-gen4".ljust(20)
    page[24:64] = b"QEMU NVMe Ctrl".ljust(40)
    page[77] = 7
    page[516:520] = (256).to_bytes(4, "little")
    assert nq.parse_controller(bytes(page)) == {"serial": "rig-gen4", "model": "QEMU NVMe Ctrl",
                                                "firmware": "", "mdts": 7, "namespaces": 256}
    ns = bytearray(4096)
    ns[0:8] = (1 << 21).to_bytes(8, "little")
    ns[26] = 1
    ns[128 + 4 + 2] = 12
    assert nq.parse_namespace(bytes(ns)) == {"blocks": 1 << 21, "lba_bytes": 4096}
    assert nq.cap_fields(0x0020_0000_0F01_07FF)["max_depth"] == 2048


def _fake_pci(root: Path, group_of: dict[str, tuple[str, str | None]]) -> Path:
    """A sysfs /sys/bus/pci tree: each function's IOMMU group and driver."""
    pci = root / "sys/bus/pci"
    for bdf, (group, driver) in group_of.items():
        dev = pci / "devices" / bdf
        dev.mkdir(parents=True)
        g = root / "sys/kernel/iommu_groups" / group
        (g / "devices").mkdir(parents=True, exist_ok=True)
        os.symlink(dev, g / "devices" / bdf)
        os.symlink(g, dev / "iommu_group")
        if driver:
            d = pci / "drivers" / driver
            d.mkdir(parents=True, exist_ok=True)
            os.symlink(d, dev / "driver")
    return pci


def test_refuses_a_group_shared_with_a_device_in_use(tmp_path: Path) -> None:
    pci = _fake_pci(tmp_path, {"0000:01:00.0": ("7", "nvme"), "0000:01:00.1": ("7", "e1000e")})
    with pytest.raises(BadInput, match=r"^controller 0000:01:00.0: its IOMMU group 7 also "
                                       r"holds 0000:01:00.1 \(e1000e\), in use"):
        pcie_vfio.take("0000:01:00.0", writes=False, sys_pci=pci)


def test_refuses_without_an_iommu_and_a_missing_device(tmp_path: Path) -> None:
    pci = tmp_path / "sys/bus/pci"
    (pci / "devices/0000:02:00.0").mkdir(parents=True)
    with pytest.raises(BadInput, match="has no IOMMU group"):
        pcie_vfio.take("0000:02:00.0", writes=False, sys_pci=pci)
    with pytest.raises(BadInput, match="^controller 0000:09:00.0: no such PCI device$"):
        pcie_vfio.take("0000:09:00.0", writes=False, sys_pci=pci)


def test_one_already_on_vfio_is_used_as_it_is(tmp_path: Path) -> None:
    pci = _fake_pci(tmp_path, {"0000:03:00.0": ("9", "vfio-pci")})
    taken = pcie_vfio.take("0000:03:00.0", writes=False, sys_pci=pci)
    assert taken.driver == "vfio-pci"
    assert vfio.group_members("0000:03:00.0", pci) == ["0000:03:00.0"]



def _bam_job(**opts):
    from gpufio.profile import from_dict

    return from_dict({"global": {"engine": "bam", "size": "1m", **opts}}, "p.toml", {}).jobs[0]


@pytest.mark.parametrize("opts, message", [
    ({"bs": "6k"}, "bs to divide or be a multiple of 4096"),
    ({"bs": "4m"}, "needs a chained PRP list"),
    ({"controller": "qemu", "submitter": "gpu", "doorbells": "direct"},
     "through the relay only"),
    ({"controller": "qemu", "submitter": "cpu", "targets": ["a", "b"]}, "one file as its"),
    ({"controller": "model", "model_lba": 4096, "bs": "2k"}, "not a multiple of the software"),
    ({"controller": "model", "model_lba": 1000}, "not a power of two"),
    ({"controller": "model", "rw": "randrw"}, "either read or write"),
    ({"controller": "model", "rw": "write", "fsync": 4}, "use end_fsync"),
    ({"controller": "compiled", "controller_backend": "disk"}, "controller_backend"),
    ({"controller": "vfio", "drive_model": "micron-9550"}, "emulates a drive"),
    ({"doorbells": "relay"}, "the CPU stand-in rings them itself"),
])
def test_bam_job_refusals(opts: dict, message: str) -> None:
    from gpufio.engines import all_engines

    with pytest.raises(BadInput, match=message):
        all_engines()["bam"].check_job(_bam_job(**opts))


def test_bam_results_name_the_cpu_stand_in() -> None:
    from gpufio.engines import all_engines
    from gpufio.engines.base import label

    facts = all_engines()["bam"].describe(_bam_job())
    assert facts["submitter"] == "cpu-stand-in" and facts["controller"] == "real"
    assert label("bam", facts) == "bam (cpu-stand-in)"


@pytest.mark.parametrize("opts, mode", [
    ({"controller": "model"}, "gpu, direct doorbells, model controller"),
    ({"controller": "model", "doorbells": "relay"}, "gpu, relay doorbells, model controller"),
    ({"controller": "compiled", "controller_threads": 4},
     "gpu, direct doorbells, compiled controller"),
    ({"controller": "qemu", "submitter": "gpu"}, "gpu, relay doorbells, qemu controller"),
    ({"submitter": "gpu"}, "gpu, relay doorbells, real controller"),
    ({"submitter": "gpu", "doorbells": "direct"}, "gpu, direct doorbells, real controller"),
])
def test_bam_results_name_the_doorbells_and_the_controller(opts: dict, mode: str) -> None:
    from gpufio.engines import all_engines
    from gpufio.engines.base import label

    engine = all_engines()["bam"]
    job = _bam_job(**opts)
    engine.check_job(job)
    facts = engine.describe(job)
    assert label("bam", facts) == f"bam ({mode})"
    assert facts["submitter"] == "gpu" and facts["doorbells"] in mode
    assert engine.generic_targets(job) is (opts.get("controller") is None)


def test_a_cpu_stand_in_write_job_with_fsync_and_end_fsync_is_accepted() -> None:
    from gpufio.engines import all_engines

    engine = all_engines()["bam"]
    engine.check_job(_bam_job(rw="randwrite", fsync=4, end_fsync=True))
    assert engine.flushes_itself


def test_guardian_leaves_a_controller_that_is_not_on_vfio(tmp_path: Path) -> None:
    from gpufio.io.nvme import guardian

    # started on vfio-pci (the user's own binding) or with no driver: nothing to give back
    assert guardian.restore("0000:ff:00.0", "vfio-pci") is False
    assert guardian.restore("0000:ff:00.0", None) is False


def test_a_session_starts_a_guardian_and_releases_it() -> None:
    import sys

    from gpufio.io.nvme.guardian import Guard

    g = Guard("0000:01:00.0", [sys.executable, "-c", "import sys; print('guarding', "
                               "flush=True); sys.stdin.read(); sys.exit(3)"])
    g.release()
    assert g.proc.returncode == 3
    with pytest.raises(BadInput, match="^controller 0000:01:00.0: its guardian did not start"):
        Guard("0000:01:00.0", [sys.executable, "-c", "pass"])


def test_the_cpu_stand_in_asks_the_context_for_no_ios() -> None:
    """The CPU stand-in is a channel: the block loop, the GNN gather and the other loops
    over channels drive it; the GPU threads' path is the engine's queue, whose loops run on
    the device. The engine itself asks for no I/O."""
    import ast

    import gpufio.engines.bam as bam

    tree = ast.parse(Path(bam.__file__).read_text())
    asks = [n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("next_batch", "last_writes", "due")]
    assert asks == []
    cls = bam.Bam
    assert cls.capability is not None and cls.row_support() is not None
    assert not cls.row_support().gpu_only and cls.tensor_support() is None
    assert "rows" in cls.host_memory()


def _config(*caps: tuple[int, bytes]) -> bytes:
    """4 KiB of config space with extended capabilities ``(id, body)`` chained from 0x100."""
    import struct

    cfg = bytearray(4096)
    at = 0x100
    for i, (cap, body) in enumerate(caps):
        nxt = at + 0x40 if i + 1 < len(caps) else 0
        struct.pack_into("<I", cfg, at, cap | 1 << 16 | nxt << 20)
        cfg[at + 4:at + 4 + len(body)] = body
        at = nxt
    return bytes(cfg)


def test_acs_control_bits_are_read_from_the_extended_capabilities() -> None:
    import struct

    acs = struct.pack("<HH", 0x1F, 0x1D)  # capability, control: SV RR CR UF on
    assert vfio.acs_control(_config((0x0001, b""), (0x000D, acs))) == "SV RR CR UF"
    assert vfio.acs_control(_config((0x000D, struct.pack("<HH", 0x1F, 0)))) == "none"
    assert vfio.acs_control(_config((0x0001, b""))) is None
    with pytest.raises(ValueError):
        vfio.acs_control(bytes(256))  # what a non-root reader gets


def test_doctor_names_acs_on_the_path_to_the_root_complex(tmp_path: Path) -> None:
    import struct

    pci = tmp_path / "sys/bus/pci"
    real = tmp_path / "sys/devices/pci0000:00/0000:00:1c.0/0000:02:00.0"
    real.mkdir(parents=True)
    (real.parent / "config").write_bytes(_config((0x000D, struct.pack("<HH", 0x1F, 0x05))))
    (real / "config").write_bytes(bytes(256))
    (pci / "devices").mkdir(parents=True)
    os.symlink(real, pci / "devices/0000:02:00.0")
    os.symlink(real.parent, pci / "devices/0000:00:1c.0")
    assert vfio.upstream_bridges("0000:02:00.0", pci) == ["0000:00:1c.0"]
    assert vfio.acs_path("0000:02:00.0", pci) == "0000:00:1c.0: ACS SV RR"
    (real.parent / "config").write_bytes(bytes(64))
    assert vfio.acs_path("0000:02:00.0", pci) == "0000:00:1c.0: unreadable (needs root)"


def test_doctor_prices_the_relay_and_says_why_the_registration_was_not_probed() -> None:
    from gpufio.io.gio.backends import nvme

    out = nvme.gpu_doctor_checks("bam", [("a", 2), ("b", 8)], 4, "no NVIDIA GPU")
    assert [(c.name, c.status) for c in out] == [
        ("BAR as CUDA I/O memory", "warn"), ("doorbell relay of job 'a'", "ok"),
        ("doorbell relay of job 'b'", "warn")]
    assert "not probed: no NVIDIA GPU" in out[0].found


@pytest.mark.parametrize("opts, layout, message", [
    ({"submitter": "gpu"}, (1, 512, 0), "from a software controller only"),
    ({"controller": "model", "model_lba": 4096}, (1, 512, 0), "not whole 4096-byte blocks"),
    ({"controller": "compiled", "row_pairs": 65}, (1, 512, 0),
     "row_pairs 65: the software controller offers at most 64 I/O queue pairs"),
])
def test_bam_row_fetch_refusals(opts: dict, layout: tuple, message: str) -> None:
    from gpufio.core.rows import Layout, RowRequest, RowTable
    from gpufio.engines import all_engines

    table = RowTable(("a.dat",), Layout(*layout), 1000)
    from gpufio.core.requests import QueueSpec

    with pytest.raises(BadInput, match=message):
        all_engines()["bam"].queue(_bam_job(**opts), [], QueueSpec(
            0, 512, table=table, rows=RowRequest(dim=128, max_rows=10, direct=True)))


@pytest.mark.parametrize("opts, namespaces, pairs", [
    ({"controller": "compiled"}, 1, 1),
    ({"controller": "compiled", "controller_threads": 4}, 1, 4),
    ({"controller": "compiled", "controller_threads": 4}, 2, 4),
    ({"controller": "compiled"}, 2, 2),  # a pair per namespace, one poller serving both
    ({"controller": "model"}, 2, 1),  # one loop serves every pair
    ({"controller": "model", "row_pairs": 3}, 1, 3),
    ({"controller": "compiled", "controller_threads": 4, "row_pairs": 2}, 2, 2),
    ({"controller": "compiled", "controller_threads": 100}, 1, 64),  # the controller's most
])
def test_the_row_fetch_drives_row_pairs_else_a_pair_per_poller_and_namespace(
        opts: dict, namespaces: int, pairs: int) -> None:
    from gpufio.engines.bam import Bam, row_pairs

    assert row_pairs(Bam.settings(_bam_job(**opts)), namespaces) == pairs


@pytest.mark.parametrize("value", [0, -2, "two"])
def test_row_pairs_below_one_is_refused_naming_the_key(value) -> None:
    with pytest.raises(BadInput, match="key 'row_pairs': (must be greater than 0|expected a "
                                       "whole number)"):
        _bam_job(controller="compiled", row_pairs=value)


def test_the_cpu_stand_in_s_rows_go_through_the_gather_without_a_gpu_cache() -> None:
    import numpy as np

    from gpufio.core.rows import Layout, RowRequest, RowTable
    from gpufio.engines import all_engines

    from gpufio.core.requests import CHANNEL
    from gpufio.loops.rows import fetcher

    bam, table = all_engines()["bam"], RowTable(("/dev/nvme0n1",), Layout(1, 512, 0), 1000)
    request = RowRequest(dim=128, max_rows=10, direct=True)
    assert bam.primitive(_bam_job()) == CHANNEL  # the gather through the stand-in's channel
    with pytest.raises(BadInput, match="cache_size needs its GPU submitter"):
        fetcher(bam, _bam_job(), table, np, RowRequest(dim=128, max_rows=10, direct=True,
                                                       cache_bytes=1 << 20))
    with pytest.raises(BadInput, match="land rows in GPU memory"):
        fetcher(bam, _bam_job(controller="model"), table, np, request)


def test_a_bam_job_lays_nothing_out_where_a_namespace_belongs(tmp_path: Path) -> None:
    """A job sending NVMe commands names namespaces: a missing path, or no targets at all,
    is refused before anything is created (its size lays out no file), and a plain file is
    refused by the namespace check without being rewritten."""
    from gpufio.run import opening

    missing = tmp_path / "ns.dat"
    with pytest.raises(BadInput, match=rf"^target {missing}: does not exist; engine 'bam' "
                       "sends NVMe commands"):
        opening.job_targets(_bam_job(targets=[str(missing)]), quiet=True)
    with pytest.raises(BadInput, match="^job '[^']+': engine 'bam' sends NVMe commands: name"):
        opening.job_targets(_bam_job(directory=str(tmp_path)), quiet=True)
    assert list(tmp_path.iterdir()) == []
    plain = tmp_path / "plain.dat"
    plain.write_bytes(b"x" * 8192)
    assert opening.job_targets(_bam_job(targets=[str(plain)]), quiet=True) == [str(plain)]
    with pytest.raises(BadInput, match="is not an NVMe namespace"):
        from gpufio.core import targets as tg
        tg.open_target(str(plain), True, None, generic=True)
    assert plain.read_bytes() == b"x" * 8192


@pytest.mark.parametrize("opts, pairs, threads", [
    ({"controller": "compiled", "controller_threads": 2}, 2, 2),
    ({"controller": "compiled", "controller_threads": 4, "row_pairs": 2}, 2, 2),  # 2 idle
    ({"controller": "model"}, 1, None),  # no measure of itself
])
def test_a_row_fetch_notes_its_compiled_pollers_busy_ns_and_those_serving_a_pair(
        tmp_path: Path, opts: dict, pairs: int, threads: int | None) -> None:
    from gpufio.engines import bam
    from gpufio.io.nvme import compiled

    if opts["controller"] == "compiled" and not compiled.available():
        pytest.skip("no C compiler: the compiled controller is not built")
    table = tmp_path / "features.f32"
    table.write_bytes(b"\0" * (1 << 16))
    o = bam.Bam.settings(_bam_job(**opts))
    served, made = bam._row_controller(o, [str(table)], bam.row_pairs(o, 1), 4, 4096)
    try:
        notes = bam._pollers_busy(o, served, len(made))
        assert len(made) == pairs
        if threads is None:
            assert notes is None
            return
        assert notes()["controller_threads"] == threads
        slots, iova = served.mem.alloc(8 * nq.PAGE)
        e = nq.io_commands(write=False, nsid=np.ones(8, np.uint32), lba_shift=9,
                           off=np.arange(8, dtype=np.uint64) * nq.PAGE,
                           length=np.full(8, nq.PAGE), cid=np.arange(8),
                           prp1=(iova + np.arange(8) * nq.PAGE).astype(np.uint64),
                           prp2=np.zeros(8, np.uint64))
        assert nq.result(made[0].run(e, 10**10)["status"], nq.PAGE).tolist() == [nq.PAGE] * 8
        assert notes()["controller_busy_ns"] > 0  # the reads were the pollers' work
    finally:
        served.close()
