"""One GNN job: sample, aggregate, train, for ``iterations`` mini-batches, each stage timed.

Stage boundaries wait for the device (a CuPy synchronize), so each stage's time is its own.
After each iteration, outside the timed stages, a sample of the aggregated rows is compared
with the generator's values, or the files' own rows (``verify_rows``). Ctrl-C ends the job after the current
iteration with the iterations done so far reported; so does a row that cannot be read
(the job then fails, exit 1, with the node and errno named).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufio.core import iolog
from gpufio.core.job import Job
from gpufio.core.rows import RowFetchError, RowRequest
from gpufio.core.targets import evict
from gpufio.engines import all_engines
from gpufio.facts.device import path_facts
from gpufio.io import gpu
from gpufio.loops import rows as gather
from gpufio.workloads.gnn import dataset, features, memlimit, timing
from gpufio.workloads.gnn.model import GraphSage
from gpufio.workloads.gnn.sampler import max_input_nodes, sample


def array_module(job: Job) -> Any:
    """NumPy for ``device = "cpu"``, else CuPy on the job's GPU."""
    return gpu.array_module(job.workload_settings.device, job.gpu)


def _fetcher(job: Job, ds: dataset.Dataset, xp: Any) -> Any:
    """The rows through the job's engine (loops/rows); host landing buffers are
    sized for the largest possible mini-batch here, before any memory_limit applies."""
    g = job.workload_settings
    most = max_input_nodes(g.batch_size, list(g.fanout), ds.graph.nodes)
    request = RowRequest(dim=g.feature_dim, max_rows=most, direct=job.direct,
                         cache_bytes=g.cache_size, advice=g.mmap_advice,
                         iodepth=job.iodepth,
                         ram_backed=all(path_facts(p).get("ram_backed") for p in ds.paths))
    return gather.fetcher(all_engines()[job.engine], job, ds.table, xp, request)


def moves_data(job: Job) -> bool:
    """False for an engine whose channel completes reads without moving bytes (null): its
    rows hold nothing to verify."""
    cap = all_engines()[job.engine].capability
    return cap is None or cap.moves_data


@dataclass
class _Tally:
    """What the iterations leave behind for the result."""

    stage_ns: np.ndarray
    done: int = 0
    rows_timed: int = 0
    checked: int = 0
    mismatches: int = 0
    losses: list[float] = field(default_factory=list)
    failure: str | None = None
    cache_at_warmup: dict[str, int] = field(default_factory=dict)
    # each drive's reads as its own model counted them, when the timed iterations began
    reads_at_warmup: list[int] | None = None
    # and their reads since, as of the last timed iteration that completed (a failed one's
    # reads have no rows or time in the result)
    reads_timed: list[int] | None = None
    trace: Any = None  # the gnn_iolog being written (core/iolog.Writer)
    trace_counts: list[int] = field(default_factory=list)  # its reads, per iteration
    # the timed iterations' rows asked of each target (striped tables: each drive's share)
    target_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def run_job(job: Job, stop: Any = None, progress: Any = None,
            trainer: int | None = None) -> dict[str, Any]:
    """Run one GNN job; ``stop()`` returning True ends it early (Ctrl-C); ``progress(job,
    iterations done, last iteration's stage ns)`` is called after each iteration;
    ``trainer``: this trainer's index among a data-parallel job's, which draws its own
    mini-batches."""
    g = job.workload_settings
    xp = array_module(job)
    ds = dataset.prepare(job, xp)
    fetcher = _fetcher(job, ds, xp)
    tally = _Tally(np.zeros((g.iterations, 3), dtype=np.int64),
                   target_rows=np.zeros(ds.layout.ntargets, np.int64))
    limit, asked = memlimit.resolve(g.memory_limit, ds.graph.nodes * ds.layout.row_bytes)
    if limit:
        _rehearse(job, ds, xp, fetcher)
        evict(ds.paths)  # pages cached before the move would not count against it
    if g.gnn_iolog:  # a trainer of a data-parallel job writes a log of its own
        tally.trace = iolog.Writer(g.gnn_iolog + ("" if trainer is None else f".gpu{job.gpu}"),
                                   ds.paths)
    try:
        with memlimit.limited(limit) if limit else contextlib.nullcontext({}) as limit_facts:
            try:
                _iterate(job, ds, xp, fetcher, tally, stop, progress, trainer)
            except RowFetchError as e:  # the run ends; what was measured so far is reported
                tally.failure = f"iteration {tally.done}: {e}"
    finally:
        fetcher.close()
        if tally.trace is not None:
            tally.trace.close()
    result = _result(job, ds, tally, fetcher)
    if ds.type_offsets is not None:
        result["node_types"] = {"first_id": ds.type_offsets, "seed_type": "paper",
                                "seeds": ds.seeds}
    if tally.trace is not None:
        result["iolog"] = {"path": tally.trace.path, "entries": tally.trace.entries,
                           "per_iteration": tally.trace_counts, "row_bytes": ds.layout.row_bytes}
    result["memory_limit"] = ({**limit_facts, "asked": asked} if asked else limit_facts) or None
    if _cache_of(fetcher) is not None:
        result["cache"] = _cache_result(fetcher, tally)
    if getattr(fetcher, "mode", None):
        result["engine_mode"] = fetcher.mode  # cufile: gds or compat, never left unsaid
    if tally.failure:
        result.update(failure=tally.failure, error=1, interrupted=False)
    return result


def make_model(job: Job, xp: Any) -> Any:
    """The job's model: gpufio's GraphSAGE, or PyG's (``model = "pyg-sage"``)."""
    g = job.workload_settings
    if g.model == "pyg-sage":
        from gpufio.workloads.gnn.pyg_model import PygSage

        return PygSage(xp, g.feature_dim, g.hidden, g.classes, len(g.fanout),
                       job.randseed, float(g.learning_rate))
    return GraphSage(xp, g.feature_dim, g.hidden, g.classes, len(g.fanout),
                     job.randseed)


def _rehearse(job: Job, ds: dataset.Dataset, xp: Any, fetcher: Any) -> None:
    """One untimed training step on a small mini-batch of its own, before a job moves into
    its memory cgroup: everything the iterations set up lazily (the GPU's modules and
    libraries, kernel compilation, memory pools) is then allocated outside the group, so
    the anonymous memory the group's limit must make room for (memlimit's watcher) stays
    what the iterations themselves allocate. The measured iterations draw the same
    mini-batches as without it."""
    g = job.workload_settings
    indptr, indices = xp.asarray(ds.graph.indptr), xp.asarray(ds.graph.indices)
    model = make_model(job, xp)
    rng = (np.random.default_rng([job.randseed, 2]) if xp is np
           else xp.random.default_rng(job.randseed + 1))
    seeds = _seeds(xp, rng, min(8, g.batch_size), ds)
    mb = sample(xp, indptr, indices, seeds, list(g.fanout), rng)
    _, grads = model.loss_and_grads(mb, fetcher.fetch(mb.input_nodes), seeds % g.classes)
    model.step(grads, float(g.learning_rate))
    if xp is not np:
        xp.cuda.Device().synchronize()
    fetcher.rows = 0  # the rehearsal's rows are not the job's


def _seeds(xp: Any, rng: Any, n: int, ds: dataset.Dataset) -> Any:
    """``n`` mini-batch seeds, uniform over the seed nodes (IGBH: the papers)."""
    return xp.floor(rng.random(n) * (ds.seeds or ds.graph.nodes)).astype(xp.int64)


def _iterate(job: Job, ds: dataset.Dataset, xp: Any, fetcher: Any, tally: _Tally,
             stop: Any, progress: Any, trainer: int | None = None) -> None:
    """Sample, aggregate, train, ``iterations`` times, each stage timed to a device sync."""
    g = job.workload_settings
    sync = (lambda: None) if xp is np else xp.cuda.Device().synchronize
    indptr, indices = xp.asarray(ds.graph.indptr), xp.asarray(ds.graph.indices)
    model = make_model(job, xp)
    # each trainer of a data-parallel job its own mini-batches; the table's seed stays the job's
    seed = [job.randseed, 1] if trainer is None else [job.randseed, 1, trainer]
    rng = (np.random.default_rng(seed) if xp is np else xp.random.default_rng(
        job.randseed if trainer is None else int(np.random.SeedSequence(seed).generate_state(1)[0])))
    lr = float(g.learning_rate)
    for it in range(g.iterations):
        if stop is not None and stop():
            break
        if it == g.warmup and _cache_of(fetcher) is not None:
            tally.cache_at_warmup = fetcher.counters()
        if it == g.warmup:
            tally.reads_at_warmup = _drive_reads(fetcher)
        t0 = time.perf_counter_ns()
        seeds = _seeds(xp, rng, g.batch_size, ds)
        mb = sample(xp, indptr, indices, seeds, list(g.fanout), rng)
        sync()
        t1 = time.perf_counter_ns()
        if tally.trace is not None:  # written before the fetch, outside its time
            tgt, off = ds.layout.locate(_host(xp, mb.input_nodes))
            tally.trace.reads(tgt, off, ds.layout.row_bytes)
            tally.trace_counts.append(len(off))
            t1 = time.perf_counter_ns()
        x = fetcher.fetch(mb.input_nodes)
        sync()
        t2 = time.perf_counter_ns()
        loss, grads = model.loss_and_grads(mb, x, seeds % g.classes)
        model.step(grads, lr)
        sync()
        t3 = time.perf_counter_ns()
        tally.stage_ns[it] = (t1 - t0, t2 - t1, t3 - t2)
        tally.losses.append(loss)
        if it >= g.warmup:  # outside the stages: the ids come back from the GPU for it
            tally.rows_timed += len(mb.input_nodes)
            tally.target_rows += features.target_counts(ds.layout, _host(xp, mb.input_nodes))
            if tally.reads_at_warmup is not None:  # the drives' counts, with the rows'
                tally.reads_timed = [b - a for a, b in zip(tally.reads_at_warmup,
                                                           _drive_reads(fetcher))]
        if g.verify_rows and moves_data(job):
            k = min(g.verify_rows, len(mb.input_nodes))
            want = (features.values(job.randseed, mb.input_nodes[:k], g.feature_dim, xp)
                    if ds.generated else
                    xp.asarray(features.file_rows(ds.paths, ds.layout,
                                                  _host(xp, mb.input_nodes[:k]), g.feature_dim)))
            tally.mismatches += int((x[:k] != want).any(axis=1).sum())
            tally.checked += k
        tally.done = it + 1
        if progress is not None:
            progress(job, tally.done, tally.stage_ns[it])


def _host(xp: Any, a: Any) -> np.ndarray:
    return a if xp is np else xp.asnumpy(a)


def _drive_reads(fetcher: Any) -> list[int] | None:
    """Each drive's reads so far as the drive counted them, where the fetch path has such
    counts (rows_device.QueueGather over modelled drives); else None."""
    counts = getattr(fetcher, "drive_reads", None)
    return None if counts is None else counts()


def _per_target(paths: list[str], t: "_Tally", agg_s: float) -> list[dict[str, Any]]:
    """Each target's rows asked over the timed iterations and, where its drive counted
    them, the reads that reached it (a GPU cache's hits do not); its IOPS from the reads
    where counted, else from the rows (a read each)."""
    out = []
    for i, (p, r) in enumerate(zip(paths, t.target_rows)):
        entry: dict[str, Any] = {"target": p, "rows": int(r)}
        if t.reads_timed is not None:
            entry["reads"] = int(t.reads_timed[i])
        n = entry.get("reads", entry["rows"])
        entry["iops"] = n / agg_s if agg_s else 0.0
        out.append(entry)
    return out


def _cache_of(fetcher: Any) -> Any:
    """The fetcher's GPU cache, or None (only gpu-uring has one, when cache_size is set)."""
    return getattr(fetcher, "cache", None)


def _cache_result(fetcher: Any, t: _Tally) -> dict[str, Any]:
    """The cache's size and its hits and reads over the timed iterations."""
    now = fetcher.counters()
    timed = {k: v - t.cache_at_warmup.get(k, 0) for k, v in now.items()} \
        if t.cache_at_warmup else dict.fromkeys(now, 0)
    looked = timed["hits"] + timed["reads"]
    return {**fetcher.cache.facts(), **timed,
            "hit_rate": timed["hits"] / looked if looked else 0.0}


def _result(job: Job, ds: dataset.Dataset, t: _Tally, fetcher: Any) -> dict[str, Any]:
    g = job.workload_settings
    done, rows_timed, losses = t.done, t.rows_timed, t.losses
    stages = timing.summarize(t.stage_ns[:done], g.warmup) if done > g.warmup else {}
    agg_s = stages.get("aggregation_ms", 0.0) * stages.get("timed_iterations", 0) / 1e3
    row_bytes = ds.layout.row_bytes
    return {
        "jobname": job.name, "engine": job.engine, "workload": "gnn",
        "device": g.device, "nodes": ds.graph.nodes, "edges": int(len(ds.graph.indices)),
        "degree": {"mean": float(ds.graph.degrees.mean()), "max": int(ds.graph.degrees.max())},
        "feature_dim": g.feature_dim, "batch_size": g.batch_size,
        "fanout": list(g.fanout), "hidden": g.hidden, "targets": ds.paths,
        "stripe": {"rows": ds.layout.stripe_rows, "bytes": ds.layout.stripe_rows * row_bytes},
        "feature_bytes": ds.graph.nodes * row_bytes, "page_cache": fetcher.page_cache,
        "iodepth": fetcher.facts.get("iodepth"), "fetch": dict(fetcher.facts),
        "drop_cache": bool(fetcher.facts.get("drop_cache", False)),
        "mmap_advice": fetcher.facts.get("mmap_advice"),
        # the loader as DGL runs it: a tuned madvise is a contender, not the baseline
        "baseline": all_engines()[job.engine].row_support().baseline
        and g.mmap_advice == "normal",
        "iterations": g.iterations, "warmup": g.warmup, "iterations_done": done,
        "stages": stages,
        # every iteration's, warmup's too: the span a controller's own counts cover
        "aggregation_all_ms": float(t.stage_ns[:done, 1].sum()) / 1e6,
        "aggregation": {"rows": rows_timed, "bytes": rows_timed * row_bytes,
                        "iops": rows_timed / agg_s if agg_s else 0.0,
                        "bw_bytes": rows_timed * row_bytes / agg_s if agg_s else 0.0,
                        "per_target": _per_target(ds.paths, t, agg_s)},
        "verify": {"rows_checked": t.checked, "mismatches": t.mismatches,
                   **({} if moves_data(job) else
                      {"skipped": f"engine '{job.engine}' moves no data: the rows hold none"})},
        "moves_data": moves_data(job),
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "interrupted": done < g.iterations,
        "error": int(t.mismatches > 0),
    }
