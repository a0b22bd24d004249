"""The GNN workload on the CPU (device = "cpu", NumPy): generator, features, sampler, model,
stage timing, bad inputs, and whole runs through the CLI."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import iolog
from gpufio.core.errors import BadInput
from gpufio.engines import all_engines
from gpufio.profile import from_dict
from gpufio.workloads.gnn import features, graph, timing
from gpufio.workloads.gnn.model import GraphSage
from gpufio.workloads.gnn.run import run_job
from gpufio.workloads.gnn.sampler import sample

from checkout import PROFILES, REPO

cli = CliRunner()


def needs_channel(engine):
    """For the tests of an engine's own rows whose channel may not be in the tree."""
    return pytest.mark.skipif(all_engines()[engine].capability is None,
                              reason=f"engine '{engine}' opens no channel here yet")


@pytest.fixture(scope="module")
def g():
    return graph.generate(20_000, 10, 7)


def test_graph_is_deterministic_valid_csr_and_symmetric(g):
    again = graph.generate(20_000, 10, 7)
    assert np.array_equal(g.indptr, again.indptr) and np.array_equal(g.indices, again.indices)
    assert not np.array_equal(graph.generate(20_000, 10, 8).indices[:1000], g.indices[:1000])
    assert g.indptr[0] == 0 and g.indptr[-1] == len(g.indices) and np.all(np.diff(g.indptr) >= 0)
    assert g.indices.min() >= 0 and g.indices.max() < g.nodes
    rows = np.repeat(np.arange(g.nodes), g.degrees)
    assert not np.any(rows == g.indices)  # no self loops
    for r in range(0, g.nodes, 997):
        nb = g.indices[g.indptr[r]:g.indptr[r + 1]]
        assert np.all(np.diff(nb) > 0)  # sorted, no duplicates
    key = rows * g.nodes + g.indices  # sorted: rows ascend, neighbours ascend within a row
    mirrored = g.indices * g.nodes + rows
    pos = np.minimum(np.searchsorted(key, mirrored), len(key) - 1)
    assert np.array_equal(key[pos], mirrored)  # every edge is there both ways


def test_degrees_have_a_citation_graph_tail(g):
    deg = g.degrees
    assert 8.5 < deg.mean() < 10.5
    assert deg.max() > 25 * deg.mean()
    assert np.percentile(deg, 99) > 5 * np.median(deg)


def test_graph_cache_returns_the_same_graph(tmp_path):
    a = graph.cached(3000, 6, 1, tmp_path)
    assert len(list(tmp_path.glob("gnn-graph-3000-6-1.npz"))) == 1
    b = graph.cached(3000, 6, 1, tmp_path)
    assert np.array_equal(a.indices, b.indices)


def test_feature_values_are_a_function_of_seed_node_column():
    v = features.values(5, np.array([0, 1, 123456]), 64)
    assert v.dtype == np.float32 and v.shape == (3, 64)
    assert np.all(v >= -1) and np.all(v < 1) and abs(float(v.mean())) < 0.2
    assert np.array_equal(v[2], features.values(5, np.array([123456]), 64)[0])
    assert not np.array_equal(v, features.values(6, np.array([0, 1, 123456]), 64))


def test_striped_files_hold_each_row_where_the_layout_says(tmp_path):
    layout = features.Layout(2, 16 * 4)
    paths = [str(tmp_path / "a.f32"), str(tmp_path / "b.f32")]
    for t, p in enumerate(paths):
        features.write_share(p, t, layout, 101, 16, 3)
    assert [layout.bytes_needed(t, 101) for t in (0, 1)] == [51 * 64, 50 * 64]
    tgt, off = layout.locate(np.array([0, 1, 2, 99, 100]))
    assert tgt.tolist() == [0, 1, 0, 1, 0] and off.tolist() == [0, 0, 64, 49 * 64, 50 * 64]
    for node in (0, 1, 2, 99, 100):
        with open(paths[node % 2], "rb") as f:
            f.seek((node // 2) * 64)
            row = np.frombuffer(f.read(64), np.float32)
        assert np.array_equal(row, features.values(3, np.array([node]), 16)[0])
    assert features.holds_generated(paths[1], 1, layout, 16, 3)
    assert not features.holds_generated(paths[1], 1, layout, 16, 4)


def test_npy_header_and_a_file_too_small(tmp_path):
    arr = np.zeros((10, 8), np.float32)
    np.save(tmp_path / "f.npy", arr)
    header, shape, dtype = features.npy_header(str(tmp_path / "f.npy"))
    assert shape == (10, 8) and dtype == np.float32
    assert header + arr.nbytes == (tmp_path / "f.npy").stat().st_size
    with pytest.raises(BadInput, match=r"f.npy: \d+ bytes, too small for 11 nodes"):
        features.check_file(str(tmp_path / "f.npy"), features.Layout(1, 32, header), 0, 11)


def test_every_sampled_neighbour_is_real_and_fanout_is_respected(g):
    rng = np.random.default_rng(0)
    seeds = rng.choice(g.nodes, 300, replace=False)
    mb = sample(np, g.indptr, g.indices, seeds, [10, 5, 3], rng)
    assert np.array_equal(mb.layers[0].dst_nodes, seeds)
    for layer, fanout in zip(mb.layers, [10, 5, 3]):
        nd = len(layer.dst_nodes)
        assert np.array_equal(layer.src_nodes[:nd], layer.dst_nodes)  # dst is a prefix
        assert len(np.unique(layer.src_nodes)) == len(layer.src_nodes)
        assert layer.nbr.shape == (nd, fanout)
        deg = g.degrees[layer.dst_nodes]
        assert np.array_equal(layer.count, np.minimum(deg, fanout))
        for r in range(0, nd, max(1, nd // 200)):
            got = layer.src_nodes[layer.nbr[r][layer.nbr[r] >= 0]]
            real = g.indices[g.indptr[layer.dst_nodes[r]]:g.indptr[layer.dst_nodes[r] + 1]]
            assert len(got) == min(len(real), fanout) and np.all(np.isin(got, real))
            if len(real) <= fanout:
                assert sorted(got.tolist()) == sorted(real.tolist())  # all of them
    assert np.array_equal(mb.input_nodes, mb.layers[-1].src_nodes)


def test_graphsage_gradients_match_finite_differences():
    gr = graph.generate(2000, 6, 2)
    rng = np.random.default_rng(0)
    seeds = rng.choice(gr.nodes, 16, replace=False)
    mb = sample(np, gr.indptr, gr.indices, seeds, [3, 2], rng)
    x = features.values(1, mb.input_nodes, 8).astype(np.float64)
    labels = seeds % 4
    model = GraphSage(np, 8, 6, 4, 2, 0, dtype=np.float64)
    _, grads = model.loss_and_grads(mb, x, labels)
    for li in range(2):
        for pi in range(3):
            flat = model.params[li][pi].reshape(-1)
            for j in range(0, flat.size, max(1, flat.size // 4)):
                old = flat[j]
                flat[j] = old + 1e-6
                up, _ = model.loss_and_grads(mb, x, labels)
                flat[j] = old - 1e-6
                down, _ = model.loss_and_grads(mb, x, labels)
                flat[j] = old
                assert abs((up - down) / 2e-6 - grads[li][pi].reshape(-1)[j]) < 1e-6
    first, _ = model.loss_and_grads(mb, x, labels)
    for _ in range(30):
        _, grads = model.loss_and_grads(mb, x, labels)
        model.step(grads, 0.5)
    assert model.loss_and_grads(mb, x, labels)[0] < first


def test_stage_timing_arithmetic():
    ns = np.array([[9e9, 9e9, 9e9]] + [[1e6, 6e6, 3e6], [3e6, 10e6, 7e6]], dtype=np.int64)
    s = timing.summarize(ns, warmup=1)
    assert s == {"sampling_ms": 2.0, "aggregation_ms": 8.0, "training_ms": 5.0,
                 "total_ms": 15.0, "aggregation_share": 8 / 15,
                 "accelerator_utilisation": 5 / 15, "timed_iterations": 2}
    base = {"sampling_ms": 2.0, "aggregation_ms": 200.0, "training_ms": 5.0, "total_ms": 207.0}
    sp = timing.speedups(s, base)
    assert sp["aggregation"] == 25.0 and sp["total"] == pytest.approx(207 / 15)


def _gnn(tmp_path, **extra):
    return {"global": {"workload": "gnn", "engine": "mmap", "device": "cpu", "nodes": 5000,
                       "feature_dim": 32, "hidden": 16, "batch_size": 64, "fanout": [4, 3],
                       "iterations": 6, "warmup": 2, "directory": str(tmp_path), **extra}}


@pytest.mark.parametrize("extra,message", [
    ({"fanout": []}, "key 'fanout': needs at least one layer"),
    ({"warmup": 6}, "key 'warmup': 6 leaves no timed iteration of 6"),
    ({"batch_size": 6000}, "key 'batch_size': 6000 is more than the 5000 nodes"),
    ({"engine": "uring-cmd"}, "engine 'uring-cmd' does not aggregate GNN features yet"),
    ({"learning_rate": "fast"}, "key 'learning_rate': expected a positive number"),
    ({"engine": "uring", "mmap_advice": "random"},
     "key 'mmap_advice': only engine 'mmap' maps the features, not 'uring'"),
    ({"cache_size": "1m"}, "key 'cache_size': the GPU cache sits in front of engines "
                           "'bam', 'gpu-uring', not 'mmap'"),
])
def test_bad_gnn_profiles(extra, message, tmp_path):
    with pytest.raises(BadInput, match=message):
        from_dict(_gnn(tmp_path, **extra), "g.toml", {})


def test_max_input_nodes_bounds_every_sampled_batch():
    from gpufio.workloads.gnn.sampler import max_input_nodes

    assert max_input_nodes(1024, [10, 5, 5], 10**9) == 1024 * 11 * 6 * 6
    assert max_input_nodes(1024, [10, 5, 5], 50_000) == 50_000
    g = graph.generate(5000, 8, 1)
    rng = np.random.default_rng(2)
    for _ in range(5):
        mb = sample(np, g.indptr, g.indices, rng.integers(0, 5000, 64), [4, 3], rng)
        assert len(mb.input_nodes) <= max_input_nodes(64, [4, 3], 5000)


def test_gpu_cache_needs_more_rows_than_requester_threads():
    from gpufio.io.gio.cache import cache_rows

    assert cache_rows(1 << 20, 4096, 128) == 256
    with pytest.raises(BadInput, match=r"key 'cache_size': 524288 bytes hold 128 rows of 4096 "
                                       r"bytes; the cache needs more rows than the 128 GPU"):
        cache_rows(512 << 10, 4096, 128)


def test_gnn_keys_need_the_gnn_workload():
    with pytest.raises(BadInput, match="key 'fanout' needs workload = \"gnn\""):
        from_dict({"global": {"size": "1m", "fanout": [2]}}, "g.toml", {})


def test_a_feature_file_too_small_for_nodes_is_exit_2(tmp_path, write_profile):
    small = tmp_path / "small.f32"
    small.write_bytes(b"\0" * (32 * 4 * 100))
    path = write_profile(f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\n'
                         f'nodes = 5000\nfeature_dim = 32\nfeature_file = ["{small}"]\n'
                         f'directory = "{tmp_path}"\n')
    res = cli.invoke(app, ["run", str(path)])
    assert res.exit_code == 2
    assert "small.f32: 12800 bytes, too small for 5000 nodes" in res.stderr


def test_a_whole_run_verifies_rows_and_reports_stages(tmp_path):
    prof = from_dict(_gnn(tmp_path), "g.toml", {})
    each: list[int] = []  # every iteration's aggregation ns, warmup's too
    r = run_job(prof.jobs[0], progress=lambda job, done, ns: each.append(int(ns[1])))
    assert r["iterations_done"] == 6 and r["stages"]["timed_iterations"] == 4
    assert len(each) == 6 and r["aggregation_all_ms"] == pytest.approx(sum(each) / 1e6)
    assert r["verify"] == {"rows_checked": 6 * 64, "mismatches": 0} and r["error"] == 0
    s = r["stages"]
    assert s["total_ms"] == pytest.approx(s["sampling_ms"] + s["aggregation_ms"] + s["training_ms"])
    assert r["aggregation"]["bytes"] == r["aggregation"]["rows"] * 32 * 4
    assert r["aggregation"]["rows"] >= 4 * 64 and r["page_cache"] is True
    assert r["memory_limit"] is None
    assert 8 < r["degree"]["mean"] < 11 and r["degree"]["max"] > 3 * r["degree"]["mean"]


def test_two_targets_are_striped_and_a_foreign_file_is_refused(tmp_path):
    a, b = tmp_path / "ssd0", tmp_path / "ssd1"
    a.mkdir()
    b.mkdir()
    prof = from_dict(_gnn(tmp_path, targets=[str(a), str(b)]), "g.toml", {})
    r = run_job(prof.jobs[0])
    assert r["error"] == 0 and len(r["targets"]) == 2
    sizes = [(a / p).stat().st_size for p in [x.name for x in a.iterdir()]]
    assert sizes == [2504 * 128]  # 4 KiB pages of 32 rows: 79 of the 157, the last 8 rows
    foreign = tmp_path / "foreign.f32"
    foreign.write_bytes(b"\1" * (5000 * 128))
    prof = from_dict(_gnn(tmp_path, targets=[str(foreign)]), "g.toml", {})
    with pytest.raises(BadInput, match="exists and does not hold gpufio's generated features"):
        run_job(prof.jobs[0])


def test_a_tuned_madvise_is_no_baseline(tmp_path, write_profile):
    """Speedups are against the loader as DGL runs it: a MADV_RANDOM job alone gives none."""
    text = (f'[global]\nworkload = "gnn"\ndevice = "cpu"\nnodes = 5000\nfeature_dim = 32\n'
            f'hidden = 16\nbatch_size = 64\nfanout = [4, 3]\niterations = 3\nwarmup = 1\n'
            f'directory = "{tmp_path}"\n[[job]]\nengine = "mmap"\nmmap_advice = "random"\n'
            f'[[job]]\nengine = "uring"\n')
    res = cli.invoke(app, ["run", str(write_profile(text)), "-f", "json"])
    assert res.exit_code == 0, res.output
    jobs = json.loads(res.stdout)["jobs"]
    assert [j["baseline"] for j in jobs] == [False, False]
    assert not any("speedup_vs_mmap" in j for j in jobs)


def test_cli_json_table_speedup_and_early_stop(tmp_path, write_profile):
    text = (f'[global]\nworkload = "gnn"\ndevice = "cpu"\nnodes = 5000\nfeature_dim = 32\n'
            f'hidden = 16\nbatch_size = 64\nfanout = [4, 3]\niterations = 5\nwarmup = 1\n'
            f'directory = "{tmp_path}"\n[[job]]\nengine = "mmap"\n'
            f'[[job]]\nname = "cold"\nengine = "mmap"\ndrop_cache = true\n'
            f'mmap_advice = "random"\n')
    res = cli.invoke(app, ["run", str(write_profile(text)), "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["workload"] == "gnn" and len(doc["jobs"]) == 2
    assert doc["jobs"][1]["drop_cache"] is True and doc["jobs"][1]["mmap_advice"] == "random"
    assert doc["jobs"][0]["mmap_advice"] == "normal"
    assert doc["jobs"][1]["verify"]["mismatches"] == 0
    assert doc["jobs"][0]["speedup_vs_mmap"]["total"] == 1.0
    assert doc["jobs"][0]["baseline"] and not doc["jobs"][1]["baseline"]
    assert "speedup_vs_mmap" in doc["jobs"][1]
    table = cli.invoke(app, ["run", str(write_profile(text)), "-f", "markdown"])
    assert "| job" in table.stdout and "aggregation_ms" in table.stdout
    prof = from_dict(_gnn(tmp_path, iterations=50, warmup=1), "g.toml", {})
    calls = []
    r = run_job(prof.jobs[0], stop=lambda: calls.append(1) or len(calls) > 3)
    assert r["iterations_done"] == 3 and r["interrupted"] is True


@needs_channel("cpu-gpu")
@pytest.mark.parametrize("sqe_async", [False, True])
def test_cpu_gpu_aggregation_reads_every_row_through_io_uring(tmp_path, sqe_async):
    a, b = tmp_path / "ssd0", tmp_path / "ssd1"
    a.mkdir()
    b.mkdir()
    prof = from_dict(_gnn(tmp_path, engine="cpu-gpu", iodepth=16, targets=[str(a), str(b)],
                          verify_rows=100_000, sqe_async=sqe_async), "g.toml", {})
    r = run_job(prof.jobs[0])
    # 128-byte rows cannot be read with O_DIRECT: the page cache serves them, and says so
    assert r["error"] == 0 and r["page_cache"] is True and r["iodepth"] == 16
    assert r["fetch"]["sqe_async"] is sqe_async
    assert r["verify"]["mismatches"] == 0 and r["verify"]["rows_checked"] >= 6 * 64


def test_a_feature_file_that_shrinks_mid_run_fails_the_job(tmp_path):
    prof = from_dict(_gnn(tmp_path, engine="uring", iterations=10), "g.toml", {})
    calls = []

    def shrink_before_the_third_iteration() -> bool:
        calls.append(1)
        if len(calls) == 3:
            for f in tmp_path.glob("gnn-features-*.f32"):
                os.truncate(f, 100 * 128)  # rows of nodes >= 100 are gone
        return False

    r = run_job(prof.jobs[0], stop=shrink_before_the_third_iteration)
    assert r["error"] == 1 and r["iterations_done"] == 2
    assert re.match(r"iteration 2: feature row of node \d+ \(short read of 0 bytes\)", r["failure"])


def test_a_generated_file_that_changed_is_refused_not_rewritten(tmp_path, write_profile):
    text = (f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\nnodes = 5000\n'
            f'feature_dim = 32\nhidden = 16\nbatch_size = 64\nfanout = [4, 3]\n'
            f'iterations = 3\nwarmup = 1\ndirectory = "{tmp_path}"\n')
    path = write_profile(text)
    assert cli.invoke(app, ["run", str(path)]).exit_code == 0
    (feature_file,) = tmp_path.glob("gnn-features-*.f32")
    os.truncate(feature_file, 100 * 128)
    res = cli.invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and "does not hold gpufio's generated features" in res.stderr
    assert feature_file.stat().st_size == 100 * 128


@pytest.mark.parametrize("extra,message", [
    ({"engine": "gpu-uring"}, "engine 'gpu-uring': reads into GPU memory, so it needs "
                              "device = \"gpu\""),
    pytest.param({"engine": "cufile"}, "engine 'cufile': reads into GPU memory, so it needs "
                 "device", marks=needs_channel("cufile")),
    ({"engine": "gpu-uring", "device": "gpu", "feature_dim": 30},
     "key 'feature_dim': gpu-uring copies rows in 16-byte words"),
])
def test_gpu_uring_aggregation_checks(extra, message, tmp_path):
    with pytest.raises(BadInput, match=message):
        from_dict(_gnn(tmp_path, **extra), "g.toml", {})


def test_a_sweep_over_one_and_two_targets_keeps_whole_and_striped_files_apart(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    data = _gnn(tmp_path)
    data["sweep"] = {"targets": [[str(a)], [str(a), str(b)]]}
    prof = from_dict(data, "g.toml", {})
    results = [run_job(job) for job in prof.jobs]
    assert [len(r["targets"]) for r in results] == [1, 2]
    from gpufio.workloads.gnn.report import document

    doc = document(results, "g.toml", False)
    ratio = doc["jobs"][1]["aggregation_vs_one_target"]
    assert ratio == doc["jobs"][1]["stages"]["aggregation_ms"] / results[0]["stages"]["aggregation_ms"]
    assert "aggregation_vs_one_target" not in doc["jobs"][0]
    assert all(r["error"] == 0 and r["verify"]["mismatches"] == 0 for r in results)
    assert sorted(p.name for p in a.iterdir()) == [
        "gnn-features-5000x32-seed137-part0of2-stripe32.f32", "gnn-features-5000x32-seed137.f32"]
    assert [p.name for p in b.iterdir()] == ["gnn-features-5000x32-seed137-part1of2-stripe32.f32"]


def _can_make_memory_cgroups() -> bool:
    from gpufio.workloads.gnn import memlimit

    try:
        parent, home, _ = memlimit._parent()
        probe = parent / f"gpufio-probe-{os.getpid()}"
        probe.mkdir()
        try:
            (probe / "cgroup.procs").write_text(str(os.getpid()))
            (home / "cgroup.procs").write_text(str(os.getpid()))
        finally:
            probe.rmdir()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_make_memory_cgroups(), reason="cannot create memory cgroups here")
def test_memory_limit_runs_the_iterations_in_a_capped_cgroup_and_comes_back(tmp_path):
    before = open("/proc/self/cgroup").read()
    prof = from_dict(_gnn(tmp_path, memory_limit="512m"), "g.toml", {})
    r = run_job(prof.jobs[0])
    facts = r["memory_limit"]
    assert r["error"] == 0 and facts["limit_bytes"] == 512 << 20
    assert facts["cgroup_version"] in (1, 2) and f"gpufio-{os.getpid()}" in facts["cgroup"]
    top = (512 << 20) + facts["anon_peak_bytes"]  # the page cache's limit, plus the process's own
    assert facts["peak_bytes"] is None or 0 < facts["peak_bytes"] <= top
    for key in ("usage_at_entry_bytes", "usage_at_exit_bytes"):  # what the group held
        assert facts[key] is None or 0 <= facts[key] <= top
    assert open("/proc/self/cgroup").read() == before
    assert not os.path.exists(facts["cgroup"])


@pytest.mark.skipif(not _can_make_memory_cgroups(), reason="cannot create memory cgroups here")
def test_a_killed_runs_empty_cgroup_is_removed_by_the_next_run(dead_pid):
    from gpufio.workloads.gnn import memlimit

    parent, _, _ = memlimit._parent()
    stale, live = parent / f"gpufio-{dead_pid}", parent / f"gpufio-{os.getpid()}-other"
    stale.mkdir()
    live.mkdir()
    try:
        with memlimit.limited(64 << 20):
            assert not stale.exists() and live.exists()
    finally:
        for g in (stale, live):
            if g.exists():
                g.rmdir()


def test_a_limited_job_rehearses_a_step_outside_the_group_first(tmp_path, monkeypatch):
    """Everything the iterations would set up lazily is set up before the move (GPU
    libraries and kernels there): the rehearsal's step runs before memlimit.limited, and the
    job's own rows and mini-batches are as without it."""
    from gpufio.workloads.gnn import memlimit, run

    order = []
    real_limited, real_rehearse = memlimit.limited, run._rehearse
    monkeypatch.setattr(run, "_rehearse", lambda *a: (order.append("rehearse"),
                                                      real_rehearse(*a))[1])

    def limited(limit):
        order.append("limit")
        return real_limited(limit)

    monkeypatch.setattr(memlimit, "limited", limited)
    limited_run = run_job(from_dict(_gnn(tmp_path, memory_limit="512m"), "g.toml", {}).jobs[0])
    plain = run_job(from_dict(_gnn(tmp_path), "g.toml", {}).jobs[0])
    assert order == ["rehearse", "limit"]
    assert limited_run["aggregation"]["rows"] == plain["aggregation"]["rows"]
    assert limited_run["loss_first"] == plain["loss_first"]


def test_the_watcher_keeps_the_limit_at_the_page_cache_limit_plus_anonymous_memory(tmp_path):
    """memory_limit bounds the page cache: the group's limit follows limit + its anonymous
    memory (up at once, down by a MiB or more), until the watcher's input closes; it reports
    the largest anonymous size, and stops by itself when the group goes."""
    import threading

    from gpufio.core import cgroups

    stat, high = tmp_path / "memory.stat", tmp_path / "memory.high"
    mib = 1 << 20

    def anon(n):  # replaced whole, as the kernel's file reads: never seen half-written
        tmp = tmp_path / "stat.new"
        tmp.write_text(f"file 7\nanon {n}\nshmem 0\n")
        os.replace(tmp, stat)

    def limit_becomes(n):
        for _ in range(500):
            if high.exists() and high.read_text() == str(n):
                return True
            threading.Event().wait(0.01)
        return False

    anon(3 * mib)
    r, w = os.pipe()
    out = {}
    with open(r, "rb") as done:
        t = threading.Thread(target=lambda: out.update(
            cgroups.follow_anonymous(high, stat, "anon", 100 * mib, done)))
        t.start()
        assert limit_becomes(103 * mib)
        anon(40 * mib)
        assert limit_becomes(140 * mib)
        anon(40 * mib - 4096)  # a page less: not worth a reclaim
        threading.Event().wait(0.1)
        assert high.read_text() == str(140 * mib)
        anon(10 * mib)
        assert limit_becomes(110 * mib)
        os.close(w)
        t.join(5)
    assert not t.is_alive() and out == {"anon_peak_bytes": 40 * mib}
    stat.unlink()  # the group is gone: the watcher ends
    r, w = os.pipe()
    with open(r, "rb") as never:  # its writer stays open: only the missing group ends it
        assert cgroups.follow_anonymous(high, stat, "anon", 1, never) == {"anon_peak_bytes": 0}
    os.close(w)


def test_the_watcher_process_follows_the_group_and_ends_with_its_input(tmp_path):
    """The watcher runs as a process of its own (outside the group it watches); Ctrl-C and
    SIGTERM sent to gpufio's process group leave it running; closing its input, as gpufio does
    and the kernel does when gpufio is killed, ends it with what it saw."""
    import signal
    import time

    from gpufio.workloads.gnn import memlimit

    (tmp_path / "memory.stat").write_text("anon 5242880\nfile 0\n")
    w = memlimit._watcher(tmp_path, memlimit.V2, 1 << 20)
    try:
        deadline = time.monotonic() + 10
        while (not (tmp_path / "memory.high").exists()
               or (tmp_path / "memory.high").read_text() != str(6 << 20)):
            assert time.monotonic() < deadline, "the watcher never set the limit"
            time.sleep(0.01)
        w.send_signal(signal.SIGINT)
        w.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert w.poll() is None
    finally:
        seen = memlimit._stop(w)
    assert w.returncode == 0 and seen == {"anon_peak_bytes": 5 << 20}


def test_memory_limit_where_no_cgroup_can_be_made_is_exit_2(tmp_path, monkeypatch):
    from gpufio.workloads.gnn import memlimit

    def refuse():
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(memlimit, "_parent", refuse)
    prof = from_dict(_gnn(tmp_path, memory_limit="1g"), "g.toml", {})
    with pytest.raises(BadInput, match="key 'memory_limit': cannot run under a memory cgroup "
                                       "here: Permission denied"):
        run_job(prof.jobs[0])


def test_a_v1_limit_too_small_to_hold_the_job_is_refused_not_killed(tmp_path, monkeypatch):
    # 25% of a small table on cgroup v1 (a hard limit) had the kernel kill gpufio, exit 137
    from gpufio.workloads.gnn import memlimit

    monkeypatch.setattr(memlimit, "_parent", lambda: (tmp_path, tmp_path, memlimit.V1))
    prof = from_dict(_gnn(tmp_path, memory_limit="25%"), "g.toml", {})
    with pytest.raises(BadInput, match=r"key 'memory_limit': \d+\.\d MiB is below 64 MiB"):
        run_job(prof.jobs[0])
    assert not list(tmp_path.glob("gpufio-*"))  # no group made


def test_io_commands_refuse_a_gnn_result_in_one_line(tmp_path, write_profile):
    text = (f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\nnodes = 5000\n'
            f'feature_dim = 32\nhidden = 16\nbatch_size = 64\nfanout = [4, 3]\n'
            f'iterations = 3\nwarmup = 1\ndirectory = "{tmp_path}"\n')
    out = tmp_path / "gnn.json"
    assert cli.invoke(app, ["run", str(write_profile(text)), "-f", "json", "-o", str(out)]).exit_code == 0
    for args in (["compare", str(out), str(out)], ["check", str(out), "-b", str(out)]):
        res = cli.invoke(app, args)
        assert res.exit_code == 2
        assert res.stderr.strip() == (f"gpufio: error: {out}: a GNN workload result; compare, "
                                      "check and plot read results that carry metrics (a GNN result carries "
                                      "its own stage table)")
    res = cli.invoke(app, ["run", str(write_profile(text)), "-f", "fio-json"])
    assert res.exit_code == 2 and "for workload 'gnn'" in res.stderr


@pytest.mark.parametrize("since_boot_s", [1, 10 ** 6])
def test_progress_lines_say_where_a_long_run_is(capsys, monkeypatch, since_boot_s):
    """The first line comes whatever the monotonic clock reads: on a host up one second
    (a fresh CI machine) as on one up for days."""
    import time
    from types import SimpleNamespace

    from gpufio.workloads.gnn.driver import ProgressLines

    monkeypatch.setattr(time, "monotonic_ns", lambda: since_boot_s * 10 ** 9)

    job = SimpleNamespace(name="j",
                          workload_settings=SimpleNamespace(iterations=1100, warmup=1000))
    lines = ProgressLines(every_s=3600)
    lines(job, 1, [2e6, 30e6, 5e6])
    lines(job, 2, [2e6, 30e6, 5e6])  # within the interval: quiet
    lines(job, 1100, [1e6, 20e6, 4e6])  # the last iteration always reports
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpufio: j: iteration 1/1100 (warm-up): sampling 2.0 ms, aggregation 30.0 ms, "
                   "training 5.0 ms",
                   "gpufio: j: iteration 1100/1100: sampling 1.0 ms, aggregation 20.0 ms, "
                   "training 4.0 ms"]


def test_live_stages_table_shows_each_jobs_iteration_and_phase():
    import io
    from types import SimpleNamespace

    from gpufio.workloads.gnn.driver import LiveStages

    out = io.StringIO()
    runs = SimpleNamespace(iterations=10, warmup=5)
    a = SimpleNamespace(name="mmap", engine="mmap", workload_settings=runs)
    b = SimpleNamespace(name="uring", engine="cpu-gpu", workload_settings=runs)
    with LiveStages(out) as live:
        live(a, 3, [2e6, 30e6, 5e6])
        live(a, 10, [1e6, 20e6, 4e6])
        live(b, 7, [1e6, 12.5e6, 4e6])
    text = out.getvalue()
    rows = [line for line in text.splitlines() if "mmap" in line or "uring" in line]
    assert any("10/10" in r and "timed" in r and "20.0" in r for r in rows)
    assert any("7/10" in r and "cpu-gpu" in r and "12.5" in r for r in rows)
    assert not any("3/10" in r for r in rows[-2:])  # the final table shows the latest only


@needs_channel("cpu-gpu")
def test_the_readme_cpu_check_profile_runs_and_verifies(tmp_path):
    assert "gpufio run profiles/gnn-cpu-check.toml" in (REPO / "README.md").read_text()
    res = cli.invoke(app, ["run", str(PROFILES / "gnn-cpu-check.toml"), "-f", "json",
                           "--set", "nodes=4000", "--set", "feature_dim=64", "--set",
                           "iterations=4", "--set", "warmup=1", "--set", f"directory={tmp_path}"])
    assert res.exit_code == 0, res.output
    jobs = json.loads(res.stdout)["jobs"]
    assert [j["engine"] for j in jobs] == ["mmap", "cpu-gpu"]
    assert all(j["verify"]["mismatches"] == 0 and j["verify"]["rows_checked"] > 0 for j in jobs)


def test_a_full_target_while_writing_features_is_one_line_and_leaves_no_table(tmp_path,
                                                                              monkeypatch):
    import errno as errno_mod

    from gpufio.workloads.gnn import dataset

    def full(path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
        raise OSError(errno_mod.ENOSPC, "No space left on device")

    monkeypatch.setattr(features, "write_share", full)
    job = from_dict({"global": {"workload": "gnn", "engine": "mmap", "device": "cpu",
                                "nodes": 500, "feature_dim": 16, "batch_size": 8,
                                "directory": str(tmp_path)}}, "g.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="cannot write the generated features: No space left"):
        dataset.prepare(job)
    assert not list(tmp_path.glob("gnn-features-*"))


def _igb(root, nodes=300, dim=32, headerless=False, edges=None):
    """A small IGB-shaped directory: tiny/processed/paper/... and the cites relation."""
    base = root / "tiny" / "processed"
    (base / "paper").mkdir(parents=True)
    (base / "paper__cites__paper").mkdir()
    feats = np.random.default_rng(3).random((nodes, dim), dtype=np.float32)
    if headerless:
        feats.tofile(base / "paper" / "node_feat.npy")
    else:
        np.save(base / "paper" / "node_feat.npy", feats)
    np.save(base / "paper" / "node_label_19.npy", np.arange(nodes) % 19)
    if edges is None:
        rng = np.random.default_rng(4)
        edges = rng.integers(0, nodes, (nodes * 4, 2))
    np.save(base / "paper__cites__paper" / "edge_index.npy", np.asarray(edges, np.int64))
    return feats


@pytest.mark.parametrize("headerless", [False, True], ids=["npy", "headerless"])
def test_real_igb_data_is_read_and_every_checked_row_is_the_files(tmp_path, headerless):
    feats = _igb(tmp_path / "igb", headerless=headerless)
    g = {"workload": "gnn", "engine": "mmap", "device": "cpu", "dataset": "igb",
         "igb_root": str(tmp_path / "igb"), "feature_dim": 32, "hidden": 8, "batch_size": 16,
         "fanout": [3, 2], "iterations": 3, "warmup": 1, "directory": str(tmp_path / "s")}
    r = run_job(from_dict({"global": g}, "g.toml", {}).jobs[0])
    assert r["error"] == 0 and r["nodes"] == 300 and r["verify"]["rows_checked"] == 3 * 64
    assert r["feature_bytes"] == feats.nbytes and r["iterations_done"] == 3
    cached = list((tmp_path / "s").glob("gnn-graph-igb-tiny-*.npz"))
    assert len(cached) == 1 and not list((tmp_path / "igb").rglob("*.npz"))


def test_igb_graph_is_both_directions_without_loops_or_duplicates(tmp_path):
    from gpufio.workloads.gnn import igb

    _igb(tmp_path, nodes=4, dim=8, edges=[[0, 1], [1, 0], [2, 2], [3, 1], [0, 1]])
    data = igb.load(str(tmp_path), "tiny", 8, tmp_path / "cache")
    gr = data.graph
    assert [list(gr.indices[gr.indptr[i]:gr.indptr[i + 1]]) for i in range(4)] == [
        [1], [0, 3], [], [1]]
    assert data.header > 0  # a real .npy: rows start after its header


@pytest.mark.parametrize("break_it, message", [
    (lambda base: (base / "paper__cites__paper" / "edge_index.npy").unlink(),
     "edge_index.npy is missing"),
    (lambda base: open(base / "paper" / "node_feat.npy", "r+b").truncate(1000),
     "neither 300 headerless rows"),
])
def test_broken_igb_data_is_one_line_exit_2(tmp_path, break_it, message, write_profile):
    _igb(tmp_path / "igb", headerless=True)
    break_it(tmp_path / "igb" / "tiny" / "processed")
    path = write_profile(f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\n'
                         f'dataset = "igb"\nigb_root = "{tmp_path / "igb"}"\nfeature_dim = 32\n'
                         f'batch_size = 16\ndirectory = "{tmp_path}"\n')
    res = cli.invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and message in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_igb_needs_its_root():
    with pytest.raises(BadInput, match="key 'igb_root'"):
        from_dict({"global": {"workload": "gnn", "engine": "mmap", "dataset": "igb"}},
                  "g.toml", {})


def test_a_row_fetched_from_the_wrong_place_in_real_data_is_caught(tmp_path, monkeypatch):
    from gpufio.loops.rows import Gather

    _igb(tmp_path / "igb")
    real = Gather.fetch
    monkeypatch.setattr(Gather, "fetch",
                        lambda self, nodes: real(self, nodes)[::-1].copy())  # rows out of order
    g = {"workload": "gnn", "engine": "mmap", "device": "cpu", "dataset": "igb",
         "igb_root": str(tmp_path / "igb"), "feature_dim": 32, "hidden": 8, "batch_size": 16,
         "fanout": [3, 2], "iterations": 2, "warmup": 1, "directory": str(tmp_path / "s")}
    r = run_job(from_dict({"global": g}, "g.toml", {}).jobs[0])
    assert r["verify"]["mismatches"] > 0 and r["error"] == 1


def _igbh(root, dim=32, counts=None, headerless=("author", "institute"), skip_rel=None):
    """A small IGBH-shaped directory: every node type's features (some .npy, some
    headerless), paper labels and the four relations."""
    counts = counts or {"paper": 300, "author": 200, "fos": 50, "institute": 20}
    base = root / "tiny" / "processed"
    rng = np.random.default_rng(8)
    feats = {}
    for t, n in counts.items():
        (base / t).mkdir(parents=True)
        feats[t] = rng.random((n, dim), dtype=np.float32)
        if t in headerless:
            feats[t].tofile(base / t / "node_feat.npy")
        else:
            np.save(base / t / "node_feat.npy", feats[t])
    np.save(base / "paper" / "node_label_19.npy", np.arange(counts["paper"]) % 19)
    rels = {"paper__cites__paper": ("paper", "paper"), "paper__written_by__author": ("paper", "author"),
            "author__affiliated_to__institute": ("author", "institute"),
            "paper__topic__fos": ("paper", "fos")}
    if "journal" in counts:
        rels["paper__published__journal"] = ("paper", "journal")
    for rel, (a, b) in rels.items():
        if rel == skip_rel:
            continue
        (base / rel).mkdir()
        e = np.stack([rng.integers(0, counts[a], 400), rng.integers(0, counts[b], 400)], 1)
        np.save(base / rel / "edge_index.npy", e.astype(np.int64))
    return feats


def _igbh_job(tmp_path, **extra):
    g = {"workload": "gnn", "engine": "mmap", "device": "cpu", "dataset": "igb",
         "igb_hetero": True, "igb_root": str(tmp_path / "igb"), "feature_dim": 32, "hidden": 8,
         "batch_size": 16, "fanout": [3, 2], "iterations": 3, "warmup": 1,
         "directory": str(tmp_path / "s"), **extra}
    return from_dict({"global": g}, "g.toml", {}).jobs[0]


def test_igbh_node_types_get_gids_offsets_and_one_table_of_their_rows(tmp_path):
    feats = _igbh(tmp_path / "igb")
    r = run_job(_igbh_job(tmp_path))
    assert r["error"] == 0 and r["nodes"] == 570 and r["verify"]["mismatches"] == 0
    assert r["node_types"]["first_id"] == {"paper": 0, "author": 300, "fos": 500,
                                           "institute": 550}
    assert r["node_types"]["seeds"] == 300
    (table,) = (tmp_path / "s").glob("gnn-features-igbh-tiny-32-*.f32")
    want = np.concatenate([feats[t] for t in ("paper", "author", "fos", "institute")])
    assert np.array_equal(np.fromfile(table, np.float32).reshape(-1, 32), want)
    assert not [p for p in (tmp_path / "igb").rglob("*") if p.suffix in (".f32", ".npz")]


def test_igbh_with_journals_puts_them_after_institutes(tmp_path):
    _igbh(tmp_path / "igb", counts={"paper": 100, "author": 80, "fos": 10, "institute": 5,
                                    "journal": 7})
    r = run_job(_igbh_job(tmp_path))
    assert r["node_types"]["first_id"]["journal"] == 195 and r["nodes"] == 202


def test_igbh_missing_relation_or_truncated_type_is_one_line(tmp_path):
    _igbh(tmp_path / "a", skip_rel="paper__topic__fos")
    with pytest.raises(BadInput, match=r"paper__topic__fos/edge_index.npy is missing"):
        run_job(_igbh_job(tmp_path, igb_root=str(tmp_path / "a")))
    _igbh(tmp_path / "b")
    author = tmp_path / "b" / "tiny" / "processed" / "author" / "node_feat.npy"
    author.write_bytes(author.read_bytes()[:-4])
    with pytest.raises(BadInput, match=r"author/node_feat.npy: .* not a whole number of "
                                       r"headerless rows of 32 float32"):
        run_job(_igbh_job(tmp_path, igb_root=str(tmp_path / "b")))


def test_igb_hetero_needs_the_igb_dataset():
    with pytest.raises(BadInput, match="key 'igb_hetero': needs dataset"):
        from_dict({"global": {"workload": "gnn", "engine": "mmap", "igb_hetero": True}}, "g.toml",
                  {})


def test_row_depth_is_the_profiles_or_derived_from_the_batch():
    from gpufio.core.rows import ROW_DEPTH, RowRequest, row_depth

    assert row_depth(RowRequest(dim=8, max_rows=10_000, direct=True, iodepth=16)) == 16
    assert row_depth(RowRequest(dim=8, max_rows=10_000, direct=True)) == ROW_DEPTH
    assert row_depth(RowRequest(dim=8, max_rows=300, direct=True), queues=8) == 38
    assert row_depth(RowRequest(dim=8, max_rows=3, direct=True), queues=8) == 1


@needs_channel("cpu-gpu")
@pytest.mark.parametrize("extra,depth,sqe_async", [
    ({}, 128, None),  # None: io-wq where the table is in memory
    ({"iodepth": 8}, 8, None),
    ({"sqe_async": True}, 128, True),
    ({"sqe_async": False}, 128, False),
])
def test_gnn_jobs_need_no_tuning_keys(tmp_path, extra, depth, sqe_async):
    from gpufio.facts.device import path_facts

    if sqe_async is None:
        sqe_async = bool(path_facts(str(tmp_path)).get("ram_backed"))
    g = {"workload": "gnn", "engine": "cpu-gpu", "device": "cpu", "nodes": 3000,
         "feature_dim": 32, "hidden": 8, "batch_size": 64, "fanout": [4, 2], "iterations": 2,
         "warmup": 1, "directory": str(tmp_path), **extra}
    r = run_job(from_dict({"global": g}, "g.toml", {}).jobs[0])
    assert r["error"] == 0 and r["iodepth"] == depth
    assert r["fetch"]["sqe_async"] is sqe_async


def test_a_job_over_two_gpus_runs_a_trainer_each_over_the_one_table(tmp_path):
    from gpufio.workloads import all_workloads

    g = {"workload": "gnn", "engine": "mmap", "device": "cpu", "nodes": 4000,
         "feature_dim": 32, "hidden": 8, "batch_size": 32, "fanout": [4, 2], "iterations": 3,
         "warmup": 1, "directory": str(tmp_path), "gpus": [0, 1],
         "gnn_iolog": str(tmp_path / "agg.iolog")}
    doc = all_workloads()["gnn"].run(from_dict({"global": g}, "g.toml", {}), True, 1)
    (j,) = doc["jobs"]
    assert j["error"] == 0 and [p["gpu"] for p in j["per_gpu"]] == [0, 1]
    assert "not exchanged" in j["trainers"]["gradients"]
    per = [p["aggregation"] for p in j["per_gpu"]]
    assert j["aggregation"]["rows"] == sum(a["rows"] for a in per)
    assert j["aggregation"]["iops"] == pytest.approx(sum(a["iops"] for a in per))
    assert j["verify"]["rows_checked"] == sum(p["verify"]["rows_checked"] for p in j["per_gpu"])
    logs = [iolog.read(p["iolog"]["path"]) for p in j["per_gpu"]]
    assert not np.array_equal(logs[0].offs, logs[1].offs)  # their own mini-batches
    assert len(list(tmp_path.glob("gnn-features-*.f32"))) == 1  # the one shared table
    from gpufio.workloads.gnn.report import rows

    assert [r["job"] for r in rows(doc)] == ["g", "g · gpu 0", "g · gpu 1"]


def _trainers(pid: int) -> list[int]:
    """The trainer processes gpufio ``pid`` has started so far (not its resource tracker)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"resource_tracker" not in cmdline:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.parametrize("group,when", [(False, "running"), (True, "running"),
                                        (True, "spawning")])
def test_sigterm_stops_every_trainer_after_its_iteration_with_exit_130(tmp_path, write_profile,
                                                                       group, when):
    """SIGTERM to gpufio alone (kill) or to its process group (timeout(1)) ends a job over
    two GPUs' trainers as Ctrl-C does: each trainer's iterations so far are kept. Sent as the
    shared table is written and both trainer processes exist (spawned, not yet ready: a trainer
    takes the signal once its handlers are in) or once gpufio says the trainers run."""
    import os
    import select
    import signal
    import subprocess
    import sys

    text = (f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\nnodes = 4000\n'
            f'feature_dim = 32\nhidden = 8\nbatch_size = 32\nfanout = [4, 2]\n'
            f'iterations = 100000\nwarmup = 1\ndirectory = "{tmp_path}"\ngpus = [0, 1]\n')
    proc = subprocess.Popen([sys.executable, "-m", "gpufio", "run", str(write_profile(text)),
                             "-f", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=group)
    ready = "writing generated features" if when == "spawning" else "2 trainers running"
    seen: list[str] = []
    while not seen or ready not in seen[-1]:
        assert select.select([proc.stderr], [], [], 120)[0], f"no progress: {seen}"
        seen.append(proc.stderr.readline())
        assert seen[-1], f"gpufio ended (exit {proc.wait()}) first: {seen}"
    while when == "spawning" and len(_trainers(proc.pid)) < 2:  # born, not yet ready
        assert proc.poll() is None, proc.stderr.read()
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    (j,) = doc["jobs"]
    assert doc["interrupted"] and j["interrupted"] and j["error"] == 0
    assert [p["gpu"] for p in j["per_gpu"]] == [0, 1]
    assert all(p["iterations_done"] < 100000 for p in j["per_gpu"])


def test_memory_limit_with_several_trainers_is_refused(tmp_path):
    from gpufio.workloads.gnn.parallel import run_trainers

    job = from_dict({"global": {"workload": "gnn", "engine": "mmap", "device": "cpu",
                                "nodes": 2000, "gpus": [0, 1], "memory_limit": "1g",
                                "directory": str(tmp_path)}}, "g.toml", {}).jobs[0]
    with pytest.raises(BadInput, match="data-parallel job over gpus \\[0, 1\\] runs 2"):
        run_trainers(job, lambda: False, None)


@pytest.mark.parametrize("nodes,dim", [(1000, 32), (640, 1024), (77, 100)])
def test_the_generated_table_is_written_in_turns_and_holds_every_row(tmp_path, monkeypatch,
                                                                     nodes, dim):
    """Two buffers taking turns, O_DIRECT where the pieces are page-aligned and a last piece
    that is not written through the page cache: every row lands where the layout says."""
    from gpufio.core.rows import Layout
    from gpufio.workloads.gnn import features

    monkeypatch.setattr(features, "WRITE_BYTES", 64 * 1024)  # many pieces, and a tail
    seen = []
    monkeypatch.setattr(features.events, "emit", lambda kind, line: seen.append(line))
    layout = Layout(2, dim * 4)
    for t in range(2):
        path = tmp_path / f"part{t}.f32"
        features.write_share(str(path), t, layout, nodes, dim, 9)
        assert path.stat().st_size == layout.bytes_needed(t, nodes)
        ids = np.arange(t, nodes, 2)
        got = np.fromfile(path, np.float32).reshape(-1, dim)
        assert np.array_equal(got, features.values(9, ids, dim))
    assert seen and "GB/s" in seen[-1] and "s left" in seen[-1]


def test_a_gnn_job_without_a_directory_keeps_its_caches_out_of_the_users_home(
        tmp_path, scratch, write_profile):
    """The tests' fixture redirects every cache gpufio keeps: a GNN job on IGB data without
    a ``directory`` writes its graph cache into the test's scratch, nothing under HOME;
    without the redirection the same job writes to ``~/.cache/gpufio`` (what it covers)."""
    _igb(tmp_path / "igb")
    path = write_profile(f'[global]\nworkload = "gnn"\nengine = "mmap"\ndevice = "cpu"\n'
                         f'dataset = "igb"\nigb_root = "{tmp_path / "igb"}"\nfeature_dim = 32\n'
                         'hidden = 8\nbatch_size = 16\nfanout = [3, 2]\niterations = 2\n'
                         'warmup = 1\n')
    home = tmp_path / "home"
    home.mkdir()

    def run(env):
        res = subprocess.run([sys.executable, "-m", "gpufio", "run", str(path), "-q", "-f", "json"],
                             capture_output=True, text=True, env=env,
                             cwd=REPO)
        assert res.returncode == 0, res.stderr

    run({**os.environ, "HOME": str(home)})
    assert not list(home.rglob("*"))
    assert list(scratch.glob("gnn-graph-igb-tiny-*.npz"))
    bare = {k: v for k, v in os.environ.items() if k not in ("GPUFIO_SCRATCH", "XDG_CACHE_HOME")}
    run({**bare, "HOME": str(home)})
    assert list((home / ".cache" / "gpufio").glob("gnn-graph-igb-tiny-*.npz"))


def test_the_shipped_experiment_caps_the_page_cache_at_a_quarter_of_the_table():
    from gpufio.profile import load
    from gpufio.workloads.gnn import memlimit

    jobs = load(str(PROFILES / "gnn-igbh.toml")).jobs
    assert {j.workload_options["memory_limit"] for j in jobs} == {0.25}
    assert load(str(PROFILES / "gnn-igbh.toml"), {"memory_limit": "none"}).jobs[0] \
        .workload_options["memory_limit"] is None
    assert load(str(PROFILES / "gnn-igbh.toml"), {"memory_limit": "600m"}).jobs[0] \
        .workload_options["memory_limit"] == 600 << 20
    table = 558_000 * 4096
    assert memlimit.resolve(0.25, table) == (table // 4, "25% of the 2.29 GB feature table")
    assert memlimit.resolve(1 << 30, table) == (1 << 30, "")
    assert memlimit.resolve(None, table) == (None, "")
    for bad in ("0%", "150%", "x%", "0"):
        with pytest.raises(BadInput, match="key 'memory_limit'"):
            load(str(PROFILES / "gnn-igbh.toml"), {"memory_limit": bad})


def _cpu_doc(tmp_path, **extra):
    g = {"workload": "gnn", "engine": "mmap", "device": "cpu", "nodes": 2000,
         "feature_dim": 32, "hidden": 8, "batch_size": 16, "fanout": [3, 2],
         "iterations": 15, "warmup": 2, "directory": str(tmp_path), **extra}
    from gpufio.workloads.gnn import driver

    return driver, from_dict({"global": g, "job": [{"name": "a"}, {"name": "b"}]},
                             "g.toml", {})


def test_the_result_title_says_how_the_page_cache_was_capped(tmp_path):
    from rich.console import Console

    from gpufio.workloads.gnn import report

    driver, prof = _cpu_doc(tmp_path, iterations=3, warmup=1)
    doc = driver.run_profile(prof, quiet=True)
    for j in doc["jobs"]:  # what a run under memory_limit = "25%" records
        j["memory_limit"] = {"limit_bytes": 16_000, "asked": "25% of the 0.00 GB feature table"}
    out = io.StringIO()
    report.render(doc, "table", Console(file=out, width=300))
    assert "page cache capped at 0.00 GB (25% of the 0.00 GB feature table)" in out.getvalue()


def test_a_run_says_its_size_first_and_each_jobs_eta_after_its_first_iterations(tmp_path):
    from gpufio.core import events

    driver, prof = _cpu_doc(tmp_path)
    said = []
    with events.sink(lambda kind, text: said.append((kind, text))):
        driver.run_profile(prof)
    etas = [text for kind, text in said if kind == "eta"]
    assert etas[0] == ("gpufio: 2 GNN job(s), 30 iterations in all; each job's ETA follows "
                       "its first iterations")
    assert len(etas) == 3
    assert re.fullmatch(r"gpufio: a: \d+\.\d\d s an iteration over its first \d+: about .+ more "
                        r"for its 15 iterations \(ends near \d\d:\d\d UTC\); 1 more job\(s\) "
                        r"after it", etas[1]), etas[1]
    assert etas[2].startswith("gpufio: b: ") and "after it" not in etas[2]


def test_the_eta_takes_the_rate_of_the_first_iterations():
    from gpufio.core import events
    from gpufio.workloads.gnn import driver

    job = from_dict({"global": {"workload": "gnn", "device": "cpu", "engine": "mmap",
                                "iterations": 1100, "warmup": 1000}}, "g.toml", {}).jobs[0]
    now = [100.0]
    shown = []
    eta = driver.Eta([job], lambda *a: shown.append(a[1]), clock=lambda: now[0])
    said = []
    with events.sink(lambda kind, text: said.append(text)):
        for done in range(1, 30):
            eta(job, done, None)
            now[0] += 14.0  # 14 s an iteration: 30 s have passed at the fourth
    assert shown == list(range(1, 30)) and len(said) == 2
    assert said[0] == ("gpufio: 1 GNN job(s), 1100 iterations in all; each job's ETA follows "
                       "its first iterations")
    assert said[1].startswith(f"gpufio: {job.name}: 14.00 s an iteration over its first 4: "
                              "about 4 h 16 min more for its 1100 iterations")


def test_the_cpu_checks_tables_cut_no_header_on_a_narrow_terminal(tmp_path):
    from rich.console import Console

    from gpufio.workloads.gnn import report

    driver, prof = _cpu_doc(tmp_path, iterations=3, warmup=1)
    doc = driver.run_profile(prof, quiet=True)
    out = io.StringIO()
    report.render(doc, "table", Console(file=out, width=100))
    text = out.getvalue()
    assert "…" not in text
    assert all(len(line) <= 100 for line in text.splitlines())
    for header in report.rows(doc)[0]:
        assert header in text, header


def test_the_live_gnn_table_says_its_times_are_one_iterations(monkeypatch):
    from gpufio.workloads.gnn import driver

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "200")
    job = from_dict({"global": {"workload": "gnn", "device": "cpu", "engine": "mmap",
                                "iterations": 3, "warmup": 1}}, "g.toml", {}).jobs[0]
    tty = Tty()
    with driver.LiveStages(tty) as live:
        live(job, 3, [1_000_000, 2_000_000, 3_000_000])
    assert ("gpufio: GNN jobs (stage times of the last iteration; the result has the timed "
            "iterations' means)") in " ".join(tty.getvalue().split())
