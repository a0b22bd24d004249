"""The GNN feature table striped over several drives in 4 KiB pages, as BaM stripes it
(page i on drive i % n): each drive's share of the pages, the rows gathered from a striped
table byte-identical to an unstriped one's, and the rows asked of each drive in the result.
CPU path (device = "cpu"), as profiles/gnn-cpu-check.toml runs."""

import numpy as np
import pytest

from gpufio.core.rows import Layout, RowFetchError
from gpufio.profile import from_dict
from gpufio.workloads.gnn import dataset, features
from gpufio.workloads.gnn.run import _fetcher, run_job


@pytest.mark.parametrize("ntargets", [1, 2, 3, 4])
@pytest.mark.parametrize("row_bytes,nodes", [(128, 10_001), (4096, 999), (512, 64)])
def test_each_drive_holds_every_nth_page_whole_and_in_order(ntargets, row_bytes, nodes):
    k = features.stripe_rows(row_bytes, "page")
    assert k * row_bytes == 4096
    layout = Layout(ntargets, row_bytes, 0, k)
    pages = -(-nodes // k)
    seen = []
    for t in range(ntargets):
        rows = layout.rows_of(t, nodes)
        assert len(rows) == layout.rows_on(t, nodes)
        assert layout.bytes_needed(t, nodes) == len(rows) * row_bytes
        mine = sorted(set((rows * row_bytes // 4096).tolist()))
        assert mine == list(range(t, pages, ntargets))  # page i on drive i % n
        tgt, off = layout.locate(rows)
        assert (tgt == t).all()
        assert off.tolist() == list(range(0, len(rows) * row_bytes, row_bytes))  # packed
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(nodes))
    shares = [len(range(t, pages, ntargets)) for t in range(ntargets)]
    assert max(shares) - min(shares) <= 1


def test_rows_of_a_page_or_more_and_the_row_stripe_go_a_row_at_a_time():
    assert features.stripe_rows(4096, "page") == features.stripe_rows(6144, "page") == 1
    assert features.stripe_rows(128, "row") == 1 and features.stripe_rows(96, "page") == 1
    tgt, off = Layout(2, 4096, 0, 1).locate(np.array([0, 1, 2, 3]))
    assert tgt.tolist() == [0, 1, 0, 1] and off.tolist() == [0, 0, 4096, 4096]


def _job(tmp_path, targets, engine, **extra):
    g = {"workload": "gnn", "engine": engine, "device": "cpu", "nodes": 5003,
         "feature_dim": 32, "hidden": 16, "batch_size": 64, "fanout": [4, 3],
         "iterations": 6, "warmup": 2, "directory": str(tmp_path), **extra}
    if targets:
        g["targets"] = [str(t) for t in targets]
    return from_dict({"global": g}, "g.toml", {}).jobs[0]


@pytest.mark.parametrize("engine", ["mmap", "cpu-gpu"])
def test_rows_from_a_striped_table_are_the_unstriped_tables_bytes(tmp_path, engine):
    drives = [tmp_path / f"ssd{i}" for i in range(3)]
    for d in drives:
        d.mkdir()
    fetched = []
    nodes = np.random.default_rng(5).integers(0, 5003, 2000)
    for targets in ([], drives):
        job = _job(tmp_path, targets, engine)
        ds = dataset.prepare(job)
        assert ds.layout.ntargets == max(1, len(targets)) and ds.layout.stripe_rows == 32
        fetcher = _fetcher(job, ds, np)
        try:
            fetched.append(np.ascontiguousarray(fetcher.fetch(nodes)).tobytes())
        finally:
            fetcher.close()
    assert fetched[0] == fetched[1]
    assert fetched[0] == features.values(137, nodes, 32).tobytes()


def test_the_result_counts_the_rows_asked_of_each_drive(tmp_path):
    drives = [tmp_path / "ssd0", tmp_path / "ssd1"]
    for d in drives:
        d.mkdir()
    r = run_job(_job(tmp_path, drives, "mmap"))
    a = r["aggregation"]
    assert r["error"] == 0 and r["stripe"] == {"rows": 32, "bytes": 4096}
    assert [p["target"] for p in a["per_target"]] == r["targets"]
    assert sum(p["rows"] for p in a["per_target"]) == a["rows"]
    assert all(p["rows"] > 0 for p in a["per_target"])
    assert sum(p["iops"] for p in a["per_target"]) == pytest.approx(a["iops"])


class _CountingDrives:
    """A fetcher whose drives count their own reads (as bam's compiled controller's drive
    models do): here the odd-numbered nodes only, as if a cache served the even ones; the
    counts vanish with the controller, at close."""

    def __init__(self, inner, layout):
        self._inner, self._layout = inner, layout
        self._reads = np.zeros(layout.ntargets, np.int64)
        self.calls_after_close = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def fetch(self, nodes):
        self._reads += features.target_counts(self._layout, nodes[nodes % 2 == 1])
        return self._inner.fetch(nodes)

    def drive_reads(self):
        if self._reads is None:
            self.calls_after_close += 1
            raise RuntimeError("the controller has stopped")
        return self._reads.tolist()

    def close(self):
        self._reads = None
        self._inner.close()


def test_each_drive_s_iops_are_its_own_reads_over_the_timed_iterations(tmp_path,
                                                                       monkeypatch):
    """Where the drives count the reads that reached them, each target's entry carries them
    (the timed iterations' only, read before the fetcher closed) and its IOPS come from
    them, not from the rows asked."""
    from gpufio.workloads.gnn import run as gnn_run

    drives = [tmp_path / "ssd0", tmp_path / "ssd1"]
    for d in drives:
        d.mkdir()
    made, timed = [], np.zeros(2, np.int64)
    real_fetcher, sample = gnn_run._fetcher, gnn_run.sample

    def counting(job, ds, xp):
        made.append(_CountingDrives(real_fetcher(job, ds, xp), ds.layout))
        return made[-1]

    def sampled(*args):  # each iteration's mini-batch, to count the timed ones' reads
        mb = sample(*args)
        sampled.batches.append(np.asarray(mb.input_nodes))
        return mb

    sampled.batches = []
    monkeypatch.setattr(gnn_run, "_fetcher", counting)
    monkeypatch.setattr(gnn_run, "sample", sampled)
    job = _job(tmp_path, drives, "mmap")
    r = run_job(job)
    assert r["error"] == 0 and made[0].calls_after_close == 0
    for nodes in sampled.batches[job.workload_settings.warmup:]:
        timed += features.target_counts(made[0]._layout, nodes[nodes % 2 == 1])
    per, agg = r["aggregation"]["per_target"], r["aggregation"]
    assert [p["reads"] for p in per] == timed.tolist() and 0 < timed.sum() < agg["rows"]
    assert sum(p["rows"] for p in per) == agg["rows"]
    agg_s = r["stages"]["aggregation_ms"] * r["stages"]["timed_iterations"] / 1e3
    assert [p["iops"] for p in per] == pytest.approx([p["reads"] / agg_s for p in per])


@pytest.mark.parametrize("controller", ["model", "compiled"])
def test_bam_serves_a_striped_table_as_a_modelled_namespace_per_drive(tmp_path, controller):
    """engine 'bam' (the CPU stand-in) on a software controller with a drive model: the
    table's two stripe files are namespaces 1 and 2, each behind its own rate model, and
    the rows that land are the unstriped table's bytes; the result says it is emulated."""
    from gpufio.io.nvme import compiled

    if controller == "compiled" and not compiled.available():
        pytest.skip("no C compiler: the compiled controller is not built")
    job = _job(tmp_path, [], "bam", stripes=2, submitter="cpu", controller=controller,
               drive_model="micron-9550", feature_dim=128)  # rows of whole 512 B blocks
    ds = dataset.prepare(job)
    assert ds.layout.ntargets == 2
    nodes = np.random.default_rng(9).integers(0, 5003, 500)
    fetcher = _fetcher(job, ds, np)
    try:
        got = np.ascontiguousarray(fetcher.fetch(nodes)).tobytes()
    finally:
        fetcher.close()
    assert got == features.values(137, nodes, 128).tobytes()
    r = run_job(job)
    assert r["error"] == 0 and "emulated: micron-9550" in r["engine_mode"]
    assert all(p["rows"] > 0 for p in r["aggregation"]["per_target"])


class _FailingDrives(_CountingDrives):
    """_CountingDrives whose 5th fetch (iteration 4, a timed one) reads half its rows and
    fails, as a row that cannot be read does."""

    fetches = 0

    def fetch(self, nodes):
        self.fetches += 1
        self.asked = [*getattr(self, "asked", []), np.asarray(nodes)]
        if self.fetches == 5:
            self._reads += features.target_counts(self._layout, nodes[:len(nodes) // 2])
            raise RowFetchError("feature row of node 7: EIO")
        return super().fetch(nodes)


def test_a_failed_iteration_s_reads_stay_out_of_each_drive_s_count(tmp_path, monkeypatch):
    """The result's rows and time are the completed timed iterations': so are the reads
    each drive counted (none of the failed iteration's half-fetch)."""
    from gpufio.workloads.gnn import run as gnn_run

    drives = [tmp_path / "ssd0", tmp_path / "ssd1"]
    for d in drives:
        d.mkdir()
    made, real = [], gnn_run._fetcher

    def failing(job, ds, xp):
        made.append(_FailingDrives(real(job, ds, xp), ds.layout))
        return made[-1]

    monkeypatch.setattr(gnn_run, "_fetcher", failing)
    r = run_job(_job(tmp_path, drives, "mmap"))
    assert r["error"] == 1 and r["failure"].startswith("iteration 4: ")
    assert r["iterations_done"] == 4 and made[0].calls_after_close == 0
    per = r["aggregation"]["per_target"]
    # iterations 2 and 3 timed and done (fetches 3 and 4): their odd-numbered rows, as
    # _CountingDrives counts them; nothing of the 5th fetch's half
    want = sum(features.target_counts(made[0]._layout, n[n % 2 == 1])
               for n in made[0].asked[2:4])
    assert [p["reads"] for p in per] == want.tolist()
    assert sum(p["rows"] for p in per) == r["aggregation"]["rows"]
