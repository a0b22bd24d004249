"""gpufio.pyg.FeatureStore and model = "pyg-sage" (need torch and torch_geometric, the
`pyg` extra; skipped without them): the rows a store returns are the generator's, in the
order asked, and PyG's SAGEConv trains on the rows gpufio fetched."""

import numpy as np
import pytest

pytest.importorskip("torch_geometric")

import torch  # noqa: E402

from gpufio.core.errors import BadInput  # noqa: E402
from gpufio.core.rows import Layout  # noqa: E402
from gpufio.profile import from_dict  # noqa: E402
from gpufio.workloads.gnn import features  # noqa: E402
from gpufio.workloads.gnn.run import run_job  # noqa: E402

DIM, NODES, SEED = 64, 3000, 11


@pytest.fixture
def table(tmp_path):
    paths = [str(tmp_path / f"f{i}.f32") for i in range(2)]
    layout = Layout(2, DIM * 4)
    for t, p in enumerate(paths):
        features.write_share(p, t, layout, NODES, DIM, SEED)
    return paths


def _store(paths, engine, device, **kw):
    from gpufio.engines import all_engines
    from gpufio.pyg import FeatureStore

    if device == "gpu" and (why := all_engines()[engine].unavailable()):
        pytest.skip(why)
    return FeatureStore(paths, DIM, engine=engine, device=device, group_name="paper", **kw)


def _check_rows(store, device):
    ids = torch.tensor([5, 0, 2999, 5, 1234])
    x = store["paper", "x", ids]
    assert x.shape == (5, DIM) and x.dtype == torch.float32
    assert (x.device.type == "cuda") == (device == "gpu")
    assert np.array_equal(x.cpu().numpy(), features.values(SEED, ids.numpy(), DIM))
    a, b = store.multi_get_tensor([store._attr.__class__("paper", "x", torch.tensor([7, 8])),
                                   store._attr.__class__("paper", "x", torch.tensor([9]))])
    assert np.array_equal(torch.cat([a, b]).cpu().numpy(),
                          features.values(SEED, np.array([7, 8, 9]), DIM))
    assert store.get_tensor_size("paper", "x") == (NODES, DIM)
    assert [(t.group_name, t.attr_name) for t in store.get_all_tensor_attrs()] == [("paper", "x")]
    with pytest.raises(IndexError, match="0..2999"):
        store["paper", "x", torch.tensor([NODES])]
    assert store.put_tensor(torch.zeros(1, DIM), "paper", "x", torch.tensor([0])) is False


@pytest.mark.parametrize("engine", ["uring", "mmap"])
def test_a_cpu_store_returns_the_generators_rows_in_order(table, engine):
    store = _store(table, engine, "cpu", iodepth=8)
    try:
        _check_rows(store, "cpu")
    finally:
        store.close()


def test_a_gpu_only_engine_on_the_cpu_and_an_engine_without_rows_are_refused(table):
    with pytest.raises(BadInput, match="fetches rows into GPU memory only"):
        _store(table, "gpu-uring", "cpu")
    with pytest.raises(BadInput, match="fetches no rows"):
        _store(table, "uring-cmd", "cpu")
    with pytest.raises(BadInput, match="reads NVMe namespaces .* not files"):
        _store(table, "bam", "cpu")  # its CPU stand-in reads a table laid out on a namespace
    with pytest.raises(BadInput, match="device 'cpus': use \"gpu\" or \"cpu\""):
        _store(table, "cpu-gpu", "cpus")


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["gpu-uring", "cpu-gpu", "mmap"])
def test_a_gpu_store_returns_the_generators_rows_as_cuda_tensors(table, engine):
    store = _store(table, engine, "gpu")
    try:
        _check_rows(store, "gpu")
    finally:
        store.close()


def _pyg_job(tmp_path, engine, device):
    g = {"workload": "gnn", "engine": engine, "device": device, "model": "pyg-sage",
         "nodes": NODES, "feature_dim": DIM, "hidden": 32, "batch_size": 64, "fanout": [4, 2],
         "iterations": 50, "warmup": 5, "learning_rate": "0.2", "verify_rows": 32,
         "directory": str(tmp_path)}
    return from_dict({"global": g}, "g.toml", {}).jobs[0]


def _fifty_steps(xp, store):
    """PygSage over one fixed mini-batch whose rows come from ``store``: the loss after 50
    SGD steps, and before."""
    from gpufio.workloads.gnn import graph
    from gpufio.workloads.gnn.pyg_model import PygSage
    from gpufio.workloads.gnn.sampler import sample

    gr = graph.generate(NODES, 6, 2)
    seeds = xp.asarray(np.random.default_rng(0).choice(NODES, 32, replace=False))
    mb = sample(xp, xp.asarray(gr.indptr), xp.asarray(gr.indices), seeds, [4, 2],
                xp.random.default_rng(0))
    nodes = mb.input_nodes if xp is np else mb.input_nodes.get()
    x = store["paper", "x", torch.as_tensor(nodes)]
    x = x.numpy() if xp is np else xp.from_dlpack(x)
    labels = mb.seeds % 4
    model = PygSage(xp, DIM, 16, 4, 2, 0, 0.5)
    first, _ = model.loss_and_grads(mb, x, labels)
    for _ in range(50):
        model.loss_and_grads(mb, x, labels)
        model.step(None, 0.5)
    return model.loss_and_grads(mb, x, labels)[0], first


def test_pyg_sage_learns_from_the_rows_a_store_fetched(table):
    store = _store(table, "uring", "cpu", iodepth=8)
    try:
        last, first = _fifty_steps(np, store)
    finally:
        store.close()
    assert last < first


def test_a_gnn_job_trains_pyg_sage_on_the_rows_gpufio_fetched(tmp_path):
    r = run_job(_pyg_job(tmp_path, "uring", "cpu"))
    assert r["error"] == 0 and r["verify"]["mismatches"] == 0 and r["iterations_done"] == 50
    assert np.isfinite(r["loss_first"]) and np.isfinite(r["loss_last"])


@pytest.mark.gpu
def test_pyg_sage_learns_on_the_gpu_through_gpu_uring(table, tmp_path):
    import cupy as cp

    store = _store(table, "gpu-uring", "gpu")
    try:
        last, first = _fifty_steps(cp, store)
    finally:
        store.close()
    assert last < first
    r = run_job(_pyg_job(tmp_path, "gpu-uring", "gpu"))
    assert r["error"] == 0 and r["verify"]["mismatches"] == 0 and r["iterations_done"] == 50
