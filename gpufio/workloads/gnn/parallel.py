"""Data-parallel GNN training over a job's ``gpus``: one trainer per GPU, each a spawned
process with its own CUDA context, its own mini-batches and its own copy of the model, all
gathering from the one shared feature table. Gradients are not exchanged (the measurement is
the data path, and the result says so); aggregation rows/s are reported per GPU and in all.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from typing import Any

import numpy as np

from gpufio.core import events, processes
from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.workloads.gnn import dataset
from gpufio.workloads.gnn.run import array_module, run_job

GRADIENTS = ("not exchanged: each trainer trains its own copy of the model on its own "
             "mini-batches; the measurement is the data path")


def trainer_gpus(job: Job) -> list[int]:
    """The GPUs that get a trainer each (the job's distinct GPUs, in order)."""
    return list(dict.fromkeys(job.gpu_list))


def run_trainers(job: Job, stop: Any, progress: Any) -> list[dict[str, Any]]:
    """The job's result: run_job's for one GPU, else the trainers' combined (combine)."""
    gpus = trainer_gpus(job)
    if len(gpus) < 2:
        return [run_job(job, stop=stop, progress=progress)]
    if job.workload_settings.memory_limit:
        raise BadInput(f"job '{job.name}': memory_limit caps one process's page cache; a "
                       f"data-parallel job over gpus {gpus} runs {len(gpus)}: give one GPU")
    # the shared table and graph, once, before the trainers look for them (generated on the
    # GPU for a GPU job, as one trainer alone would)
    dataset.prepare(job, array_module(job))
    ctx = multiprocessing.get_context("spawn")
    stopping = ctx.Event()
    pipes, procs = [], []
    try:
        for i, gpu in enumerate(gpus):
            mine, theirs = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_trainer_main, args=(replace(job, gpu=gpu, gpus=()), i, theirs,
                                                         stopping),
                            daemon=True, name=f"{job.name}/gpu{gpu}")
            processes.start(p)
            pipes.append(mine)
            procs.append(p)
        for pipe, proc, gpu in zip(pipes, procs, gpus):
            processes.await_ready(f"job '{job.name}': the trainer on GPU {gpu}",
                                  lambda t, pipe=pipe: _said_ready(pipe, t),
                                  lambda proc=proc: proc.exitcode)
        if progress is not None:
            events.emit("progress", f"gpufio: job '{job.name}': {len(gpus)} trainers running, "
                        f"on GPUs {', '.join(map(str, gpus))}")

        def pass_stop() -> None:
            """A stop sent to gpufio alone (kill, not the process group's Ctrl-C) reaches
            the trainers too, each ending after its current iteration."""
            if stop() and not stopping.is_set():
                with processes.held():
                    stopping.set()

        results = [_receive(pipe, proc, gpu, pass_stop)
                   for pipe, proc, gpu in zip(pipes, procs, gpus)]
    finally:
        for p in procs:  # a trainer still running after a failure must not outlive the run
            if p.is_alive():
                p.kill()
            p.join()
    return [combine(job, gpus, results)]


def _said_ready(pipe: Any, timeout: float) -> bool:
    """Whether the trainer at the pipe's other end has said processes.READY (a pipe at its
    end says no more: the trainer ended first)."""
    try:
        return pipe.poll(timeout) and pipe.recv() == processes.READY
    except EOFError:
        return False


def _receive(pipe: Any, proc: Any, gpu: int, waiting: Any) -> dict[str, Any]:
    """A trainer's result, or its one-line error raised here; ``waiting`` runs at each
    look while there is none yet."""
    while not pipe.poll(0.2):
        waiting()
        if not proc.is_alive() and not pipe.poll(0):
            raise RuntimeError(f"the trainer on GPU {gpu} ended (exit {proc.exitcode}) "
                               "without a result")
    kind, value = pipe.recv()
    if kind == "bad":
        raise BadInput(value)
    if kind == "error":
        raise RuntimeError(f"the trainer on GPU {gpu}: {value}")
    return value


def _trainer_main(job: Job, trainer: int, pipe: Any, stopping: Any) -> None:
    """One trainer: its GPU, its mini-batches; Ctrl-C or SIGTERM (sent to the whole process
    group), or ``stopping`` set by gpufio, ends it after its current iteration, as in one
    process."""
    processes.die_with_parent()
    stopped: list[bool] = []
    processes.take_stop_signals(lambda: stopped.append(True))
    pipe.send(processes.READY)
    try:
        pipe.send(("ok", run_job(job, stop=lambda: bool(stopped) or stopping.is_set(),
                                 trainer=trainer)))
    except BadInput as e:
        pipe.send(("bad", str(e)))
    except Exception as e:  # reported by the parent, naming this trainer's GPU
        pipe.send(("error", f"{type(e).__name__}: {e}"))


def combine(job: Job, gpus: list[int], results: list[dict[str, Any]]) -> dict[str, Any]:
    """One job's result from its trainers': aggregation rows, bytes and rows/s summed (the
    trainers ran at once), the stage times their mean, verification summed, a row per GPU."""
    out = dict(results[0])
    agg = [r["aggregation"] for r in results]
    out["aggregation"] = {k: float(sum(a[k] for a in agg)) if k in ("iops", "bw_bytes")
                          else int(sum(a[k] for a in agg)) for k in agg[0] if k != "per_target"}
    out["aggregation"]["per_target"] = [  # each drive's rows (and reads) from every trainer
        {"target": ts[0]["target"], "rows": sum(t["rows"] for t in ts),
         **({"reads": sum(t["reads"] for t in ts)} if all("reads" in t for t in ts) else {}),
         "iops": float(sum(t["iops"] for t in ts))}
        for ts in zip(*(a["per_target"] for a in agg))]
    stages = [r["stages"] for r in results if r["stages"]]
    if stages:
        out["stages"] = {k: (float(np.mean([s[k] for s in stages]))
                             if isinstance(stages[0][k], float) else stages[0][k])
                         for k in stages[0]}
    out["verify"] = {k: sum(r["verify"][k] for r in results) for k in results[0]["verify"]}
    out["error"] = max(r["error"] for r in results)
    out["interrupted"] = any(r["interrupted"] for r in results)
    failures = [f"gpu {g}: {r['failure']}" for g, r in zip(gpus, results) if r.get("failure")]
    if failures:
        out["failure"] = "; ".join(failures)
    out["trainers"] = {"gpus": gpus, "gradients": GRADIENTS}
    out["per_gpu"] = [{"gpu": g, "aggregation": r["aggregation"], "stages": r["stages"],
                       "verify": r["verify"], "iterations_done": r["iterations_done"],
                       **({"iolog": r["iolog"]} if "iolog" in r else {})}
                      for g, r in zip(gpus, results)]
    return out
