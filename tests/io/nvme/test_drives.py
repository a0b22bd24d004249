"""Drive models (io/nvme/drives.py, drive_rate.c): every figure has a source, and the rate
model never completes faster than its IOPS or link, nor sooner than its latency. Driven by
a fake clock: the stamps are the model's, no wall clock is read."""

import random
import time

import pytest

from gpufio.core.errors import BadInput
from gpufio.io.nvme import drives

pytestmark = pytest.mark.skipif(not drives.available(),
                                reason="the drive rate model needs a C compiler (cc)")


def _drive(iops=None, read_bw=None, link_bw=0.0, latency_ns=None) -> drives.DriveModel:
    return drives.DriveModel("test", "test drive", "none", link_bw, iops, read_bw,
                             latency_ns, {})


def _most_in_window(stamps: list[int], window: int) -> int:
    """The most completion stamps in any half-open window of ``window`` ns."""
    stamps = sorted(stamps)
    best, lo = 0, 0
    for hi, t in enumerate(stamps):
        while stamps[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_every_model_names_a_source_for_each_figure_and_says_what_it_lacks():
    assert {"dapustor-r5101", "dapustor-h5100", "samsung-pm9a3", "micron-9550"} <= \
        set(drives.names())
    for key in drives.names():
        m = drives.model(key)
        assert m.link in ("gen4x4", "gen5x4") and m.link_bw > 0
        assert m.sources["link"].startswith("https://")
        for figure, value in (("iops", m.iops), ("read_bw", m.read_bw),
                              ("latency", m.latency_ns)):
            assert (value is None) == (figure not in m.sources), (key, figure)
            assert value is not None or m.unpublished, (key, figure)  # a gap is said
        assert drives.label(m) == f"emulated: {key}, rates from {m.source}"
    gen4, gen5 = drives.model("dapustor-r5101"), drives.model("dapustor-h5100")
    assert gen5.link_bw == pytest.approx(2 * gen4.link_bw, rel=1e-6)


def test_an_unknown_model_is_refused_naming_the_known_ones():
    with pytest.raises(BadInput, match="drive_model 'nope'.*micron-9550"):
        drives.model("nope")


@pytest.mark.parametrize("iops", [1_000_000, 3_300_000, 900_000])
def test_a_model_rated_n_iops_never_completes_more_than_n_in_a_window(iops):
    rate = drives.DriveRate(_drive(iops=iops))
    rng = random.Random(7)
    now, stamps = 0, []
    for _ in range(20):  # bursts of many commands fetched at once, and idle gaps
        for _ in range(rng.randrange(1, 3000)):
            due = rate.admit(now, 4096)
            assert due >= now
            stamps.append(due)
            now += rng.choice((0, 0, 0, 50))
        now += rng.randrange(0, 2_000_000)
    assert rate.admitted == len(stamps)
    for window in (1_000, 100_000, 1_000_000):
        assert _most_in_window(stamps, window) <= window * iops / 1e9 + 1
    # saturated, it runs at the rating: 10^4 commands at once end 10^4 / iops later
    busy = drives.DriveRate(_drive(iops=iops))
    last = max(busy.admit(0, 4096) for _ in range(10_000))
    assert last == pytest.approx(10_000 / iops * 1e9, rel=1e-3)


def test_the_link_caps_bytes_whatever_the_iops():
    link = 7_876_923_077
    rate = drives.DriveRate(_drive(iops=100e6, link_bw=link))
    stamps = [(rate.admit(0, 128 << 10), 128 << 10) for _ in range(2000)]
    for window in (1_000_000, 10_000_000):
        by_time = sorted(stamps)
        lo, worst, total = 0, 0, 0
        for t, b in by_time:
            total += b
            while by_time[lo][0] <= t - window:
                total -= by_time[lo][1]
                lo += 1
            worst = max(worst, total)
        assert worst <= window * link / 1e9 + (128 << 10)
    assert max(t for t, _ in stamps) == pytest.approx(2000 * (128 << 10) / link * 1e9,
                                                     rel=1e-3)


def test_the_sequential_read_rating_caps_bytes_below_the_link():
    rate = drives.DriveRate(_drive(read_bw=6.5e9, link_bw=7.9e9))
    last = max(rate.admit(0, 1 << 20) for _ in range(100))
    assert last == pytest.approx(100 * (1 << 20) / 6.5e9 * 1e9, rel=1e-3)


def test_no_completion_comes_before_the_latency_floor():
    rate = drives.DriveRate(_drive(iops=3_300_000, latency_ns=60_000))
    now = 5_000_000
    assert rate.admit(now, 4096) == now + 60_000  # an idle drive at depth one: the floor
    for k in range(1, 5000):  # at depth, the floor and then the rate
        due = rate.admit(now + k, 4096)
        assert due >= now + k + 60_000
    assert due >= now + 4999 / 3.3e6 * 1e9  # the last waited for the 4999 before it


def test_a_pollers_completion_times_never_go_back():
    """A poller with a monotonic clock may hold its modelled completions in a FIFO."""
    rate = drives.DriveRate(drives.model("micron-9550"))
    rng = random.Random(3)
    now, last = 0, 0
    for _ in range(20_000):
        now += rng.choice((0, 10, 1000, 100_000))
        due = rate.admit(now, rng.choice((512, 4096, 131072)))
        assert due >= last
        last = due


def _server(kind: str, drive, namespaces=()):
    """The loop of the software controller ``kind`` ("model", "compiled") at ``drive``'s
    rates, serving ``namespaces`` as namespaces 2, 3 ..."""
    import functools

    from gpufio.io.nvme import model
    from gpufio.io.nvme import compiled

    if kind == "model":
        return functools.partial(model.serve, drive=drive, namespaces=tuple(namespaces))
    if not compiled.available():
        pytest.skip("no C compiler: the compiled controller is not built")
    return compiled.server(2, "ram", drive=drive, namespaces=namespaces)


def test_an_unmodelled_drive_completes_at_once():
    rate = drives.DriveRate(_drive())
    assert [rate.admit(42, 4096) for _ in range(3)] == [42, 42, 42]


@pytest.mark.parametrize("kind", ["model", "compiled"])
def test_the_controller_holds_each_completion_to_its_drives_latency(tmp_path, kind):
    """A software controller with a drive model: bytes still exact, a full CQ still holds
    the SQ back while completions wait, and no read completes sooner than the drive's
    latency (at depth one, n reads take n latencies at least: a bound load cannot break)."""
    import time

    import numpy as np

    from gpufio.core import pattern, targets
    from gpufio.io.nvme import model
    from gpufio.io.nvme import spec as nq

    backing = tmp_path / "ns.dat"
    targets.create_file(str(backing), 1 << 20, 99)
    drive = drives.model("micron-9550")
    m = model.ModelProcess(tmp_path, backing, 9, 16 << 20,
                                server=_server(kind, drive.key))
    try:
        pair = m.host().create_pair(1, 4)  # 3 slots: completions held fill its CQ
        offs = [4096 * k for k in range(40)]
        views = [m.mem.alloc(4096) for _ in offs]
        e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=np.array(offs, np.uint64),
                           length=np.full(len(offs), 4096), cid=np.arange(len(offs)),
                           prp1=np.array([iova for _, iova in views], np.uint64),
                           prp2=np.zeros(len(offs), np.uint64))
        cqes = pair.run(e, 10**10)
        assert list(nq.result(cqes["status"], np.full(len(offs), 4096))) == [4096] * len(offs)
        for off, (view, _) in zip(offs, views):
            assert view.tobytes() == pattern.fill(99, off, 4096)
        t0 = time.monotonic_ns()
        pair.run(e, 10**10, depth=1)
        assert time.monotonic_ns() - t0 >= len(e) * drive.latency_ns
    finally:
        m.stop()


@pytest.mark.parametrize("kind", ["model", "compiled"])
def test_the_controller_serves_a_namespace_per_striped_file(tmp_path, kind):
    """Several drives behind one software controller: file i is namespace i + 1, each read
    byte-exact from its own file; a namespace past them fails with Invalid Namespace."""
    import numpy as np

    from gpufio.core import pattern, targets
    from gpufio.io.nvme import model
    from gpufio.io.nvme import spec as nq

    files = [tmp_path / "ssd0.dat", tmp_path / "ssd1.dat"]
    for k, f in enumerate(files):
        targets.create_file(str(f), (1 + k) << 20, 10 + k)
    m = model.ModelProcess(tmp_path, files[0], 9, 16 << 20,
                                server=_server(kind, "micron-9550", (str(files[1]),)))
    try:
        host = m.host()

        def identify(cns, nsid):
            view, iova = host.mem.alloc(4096)
            assert host.admin(nq.ADMIN_IDENTIFY, nsid=nsid, prp1=iova, cdw10=cns)[0] == 0
            return view

        assert identify(1, 0)[516:520].view("<u4")[0] == 2  # NN: two namespaces
        assert identify(nq.CNS_ACTIVE_NSIDS, 0)[:12].view("<u4").tolist() == [1, 2, 0]
        assert identify(0, 2)[:8].view("<u8")[0] == (2 << 20) >> 9  # its own size
        pair = host.create_pair(1, 8)
        nsids = np.array([1, 2, 1, 2, 3])
        offs = np.array([0, 0, 8192, 65536, 0], np.uint64)
        views = [m.mem.alloc(4096) for _ in nsids]
        e = nq.io_commands(write=False, nsid=nsids, lba_shift=9, off=offs,
                           length=np.full(len(nsids), 4096), cid=np.arange(len(nsids)),
                           prp1=np.array([iova for _, iova in views], np.uint64),
                           prp2=np.zeros(len(nsids), np.uint64))
        cqes = pair.run(e, 10**10)
        status = nq.result(cqes["status"], np.full(len(nsids), 4096))
        by_cid = dict(zip(cqes["cid"].tolist(), status.tolist()))
        assert [by_cid[c] for c in range(4)] == [4096] * 4 and by_cid[4] < 0
        for (view, _), ns, off in list(zip(views, nsids, offs))[:4]:
            assert view.tobytes() == pattern.fill(10 + int(ns) - 1, int(off), 4096)
    finally:
        m.stop()


def _compiled_or_skip():
    from gpufio.io.nvme import compiled

    if not compiled.available():
        pytest.skip("no C compiler: the compiled controller is not built")
    return compiled


# The compiled controller at a drive model's rates, driven by its compiled CPU driver
# (driver.c). Each bound below is a floor that follows from the model, for any load: the
# k-th command a model of N IOPS admits completes no sooner than k / N after the first
# one's fetch, which comes after the driver starts its clock. Never an upper bound.
SLACK_S = 1e-3  # the clocks' granularity, on the safe side


def test_the_compiled_controller_never_completes_faster_than_its_drives_iops(tmp_path):
    from gpufio.io.nvme import model

    compiled = _compiled_or_skip()
    iops, n = 20_000.0, 1000
    backing = tmp_path / "ns.dat"
    backing.write_bytes(b"\x5a" * (1 << 20))
    with model.ModelProcess(tmp_path, backing,
                                 server=compiled.server(2, "ram", drive=_drive(iops))) as p:
        host = p.host()
        pairs = [host.create_pair(1 + i, 17) for i in range(2)]
        good, seconds = compiled.cpu_reads(p.mem, pairs, n, 16, 4096, 9, (1 << 20) >> 9, 2)
        assert good == 2 * n
        assert compiled.admitted(p.mem, 1) == [2 * n]  # each read went through the model
        assert seconds >= 2 * n / iops - SLACK_S


def test_each_namespace_has_a_rate_model_of_its_own(tmp_path):
    """Two namespaces behind models of N IOPS each: each model admits exactly its own
    namespace's reads (neither is charged the other's), and each namespace's n reads take
    n / N at least; the bytes landed are each namespace's own."""
    import numpy as np

    from gpufio.io.nvme import model

    compiled = _compiled_or_skip()
    iops, n = 20_000.0, 1000
    files = [tmp_path / "ssd0.dat", tmp_path / "ssd1.dat"]
    for k, f in enumerate(files):
        f.write_bytes(bytes([0x10 + k]) * (1 << 20))
    with model.ModelProcess(tmp_path, files[0], server=compiled.server(
            2, "ram", drive=_drive(iops), namespaces=[str(files[1])])) as p:
        host = p.host()
        pairs = [host.create_pair(1 + i, 17) for i in range(2)]
        good, seconds = compiled.cpu_reads(p.mem, pairs, n, 16, 4096, 9, (1 << 20) >> 9, 2,
                                           nsids=[1, 2])
        assert good == 2 * n
        assert compiled.admitted(p.mem, 2) == [n, n]
        assert seconds >= n / iops - SLACK_S
        # the driver's slots follow the queues, pair by pair: pair i's hold namespace i + 1's
        end = pairs[-1].cq_iova - model.IOVA_BASE + 17 * 16
        first = -(-end // 4096) * 4096
        for i in range(2):
            slots = p.mem.dma[first + i * 16 * 4096:first + (i + 1) * 16 * 4096]
            assert np.count_nonzero(slots == 0x10 + i) > 0
            assert np.count_nonzero(slots == 0x11 - i) == 0


def test_the_link_caps_the_compiled_controllers_large_transfers(tmp_path):
    """64 KiB reads (PRP lists) behind a model of no IOPS rating and a slow link: every
    byte lands where it should, and the reads take their bytes over the link at least."""
    import numpy as np

    from gpufio.core import pattern, targets
    from gpufio.io.nvme import model
    from gpufio.io.nvme import spec as nq

    compiled = _compiled_or_skip()
    size, count, link = 64 << 10, 24, float(8 << 20)  # 8 MiB/s: 24 reads take 0.19 s at least
    backing = tmp_path / "ns.dat"
    targets.create_file(str(backing), 4 << 20, 7)
    with model.ModelProcess(tmp_path, backing, 9, 16 << 20, server=compiled.server(
            1, "ram", drive=_drive(link_bw=link))) as p:
        pair = p.host().create_pair(1, 9)
        offs = [size * (3 * k % 64) for k in range(count)]
        bufs = [p.mem.alloc(size) for _ in offs]
        lists = [p.mem.alloc(nq.PAGE) for _ in offs]
        prp1, prp2 = [], []
        for (_, iova), (lst, lst_iova) in zip(bufs, lists):
            a, b, rest = nq.prp_pointers(iova, size, lst_iova)
            lst[:rest.nbytes] = rest.view(np.uint8)
            prp1.append(a)
            prp2.append(b)
        e = nq.io_commands(write=False, nsid=1, lba_shift=9, off=np.array(offs, np.uint64),
                           length=np.full(count, size), cid=np.arange(count),
                           prp1=np.array(prp1, np.uint64), prp2=np.array(prp2, np.uint64))
        t0 = time.monotonic_ns()
        cqes = pair.run(e, 10**10)
        elapsed = (time.monotonic_ns() - t0) / 1e9
        assert list(nq.result(cqes["status"], np.full(count, size))) == [size] * count
        for off, (view, _) in zip(offs, bufs):
            assert view.tobytes() == pattern.fill(7, off, size)
        assert elapsed >= count * size / link - SLACK_S
