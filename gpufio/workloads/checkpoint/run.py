"""One checkpoint job: ``iterations`` rounds of save, sync, page-cache drop and restore,
through the job's engine, and then (``naive``) through the naive path on the same files.

A round: the state gets a new seed's pattern (untimed); the save runs until the mover has
written every byte, the sync until they are durable (both timed: the save's seconds include
the sync, whose share is reported); the files' pages are dropped; the restore reads into
other memory, cleared first, until every byte is there; the two states are compared where
they live (untimed). Time to first byte runs from a phase's start to its first piece done;
CPU time is the process's user and system time over the phase, I/O threads included.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.core.targets import evict
from gpufio.core.tensors import Mover, TensorIOError, TensorRequest
from gpufio.engines import all_engines
from gpufio.engines.base import label
from gpufio.io import gpu
from gpufio.workloads.checkpoint import layout
from gpufio.loops.tensors import ChannelMover
from gpufio.workloads.checkpoint.naive import LABEL as NAIVE_LABEL
from gpufio.workloads.checkpoint.naive import NaiveMover
from gpufio.workloads.checkpoint.options import shard_sizes
from gpufio.workloads.checkpoint.state import State, cycled, llama_mix

# (job, path label, rounds done, the last round) -> None
Progress = Callable[[Job, str, int, "Round"], None]


def _cpu_ns() -> int:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


@dataclass
class Round:
    """One save and restore, in nanoseconds; ``bad``: (shard, byte) that differed."""

    bytes: int
    save_ns: int
    sync_ns: int
    save_ttfb_ns: int
    save_cpu_ns: int
    restore_ns: int
    restore_ttfb_ns: int
    restore_cpu_ns: int
    bad: list[tuple[int, int]] = field(default_factory=list)


def one_round(mover: Mover, p: layout.Plan, saved: State, restored: State, seed: int,
              compare: bool = True) -> Round:
    """Fill, save, sync, drop, restore, compare (see the module; no compare for a path
    that moves no data)."""
    saved.fill(p.extents, seed)
    device_sync = restored.synchronize
    c0, t0 = _cpu_ns(), time.perf_counter_ns()
    first_w = mover.save(saved.tensors)
    device_sync()
    t1 = time.perf_counter_ns()
    mover.sync()
    t2, c1 = time.perf_counter_ns(), _cpu_ns()
    evict(p.paths)
    restored.clear()
    c2, t3 = _cpu_ns(), time.perf_counter_ns()
    first_r = mover.restore(restored.tensors)
    device_sync()
    t4, c3 = time.perf_counter_ns(), _cpu_ns()
    return Round(bytes=sum(e.nbytes for e in p.extents), save_ns=t2 - t0, sync_ns=t2 - t1,
                 save_ttfb_ns=first_w - t0, save_cpu_ns=c1 - c0, restore_ns=t4 - t3,
                 restore_ttfb_ns=first_r - t3, restore_cpu_ns=c3 - c2,
                 bad=saved.differing(restored) if compare else [])


def sizes_of(job: Job) -> list[int]:
    """The job's shard sizes: its ``shards`` repeated, or the Llama mix."""
    c = job.workload_settings
    given = shard_sizes(c)
    return cycled(given, c.state_size) if given else llama_mix(c.state_size)


def _states(xp: Any, sizes: list[int], job: Job) -> tuple[State, State]:
    """The saved state and the memory it is restored into; BadInput when they do not fit."""
    try:
        return State(xp, sizes), State(xp, sizes)
    except (MemoryError, OSError) as e:
        raise BadInput(f"job '{job.name}': no room for two states of {sum(sizes)} bytes in "
                       f"host memory: {e}") from None
    except Exception as e:
        if type(e).__name__ != "OutOfMemoryError":
            raise
        raise BadInput(f"job '{job.name}': gpu {job.gpu}: out of memory for two states of "
                       f"{sum(sizes)} bytes (the saved one and the restored one)") from None


def run_job(job: Job, stop: Callable[[], bool], progress: Progress | None,
            naive: bool) -> list[dict[str, Any]]:
    """The engine's rounds, then the naive path's when ``naive``: one result each."""
    c = job.workload_settings
    xp = gpu.array_module(job.workload_settings.device, job.gpu)
    sizes = sizes_of(job)
    p = layout.plan(job, sizes)
    files = layout.open_files(job, p)
    saved = restored = None
    try:
        saved, restored = _states(xp, sizes, job)
        engine = all_engines()[job.engine]
        request = TensorRequest(chunk=job.bs, iodepth=job.iodepth, direct=job.direct)
        paths: list[tuple[str, Callable[[], Mover]]] = [
            (job.engine, lambda: ChannelMover(engine, job, files, p.extents, xp, request))]
        if naive:
            paths.append((NAIVE_LABEL, lambda: NaiveMover(files, p.extents, xp)))
        results = []
        for k, (name, make) in enumerate(paths):
            if stop():
                break
            seed0 = job.randseed + 1 + k * c.iterations  # every round saves a new state
            results.append(_run_path(job, name, make, p, files, saved, restored, seed0, stop,
                                     progress, baseline=k > 0))
        return results
    finally:
        for s in (saved, restored):
            if s is not None:
                s.close()
        for f in files:
            f.close()


def _run_path(job: Job, name: str, make: Callable[[], Mover], p: layout.Plan, files: list,
              saved: State, restored: State, seed0: int, stop: Callable[[], bool],
              progress: Progress | None, baseline: bool) -> dict[str, Any]:
    c = job.workload_settings
    rounds: list[Round] = []
    failure = None
    mover = make()
    cap = None if baseline else all_engines()[job.engine].capability
    moving = cap is None or cap.moves_data
    try:
        for it in range(c.iterations):
            if stop():
                break
            rounds.append(one_round(mover, p, saved, restored, seed0 + it, moving))
            if progress is not None:
                progress(job, name, len(rounds), rounds[-1])
    except TensorIOError as e:  # the job ends; the rounds done so far are reported
        failure = f"round {len(rounds) + 1}: {e}"
    finally:
        mover.close()
    mode = getattr(mover, "mode", None)
    result = _result(job, name, mode, baseline, mover, p, files, rounds, failure)
    if not moving:
        result["moves_data"] = False
        result["verify"].update(bytes=0, skipped=f"engine '{job.engine}' moves no data: "
                                "nothing restored to compare")
    return result


def _phase(rounds: list[Round], key: str) -> dict[str, Any]:
    """A phase's totals over the rounds: GB/s of all bytes over all its time, mean seconds
    and time to first byte, CPU seconds per GB."""
    ns = sum(getattr(r, f"{key}_ns") for r in rounds)
    nbytes = sum(r.bytes for r in rounds)
    cpu = sum(getattr(r, f"{key}_cpu_ns") for r in rounds)
    out = {"seconds": ns / 1e9 / len(rounds) if rounds else 0.0,
           "gb_per_s": nbytes / ns if ns else 0.0,  # bytes per ns = GB/s
           "ttfb_ms": sum(getattr(r, f"{key}_ttfb_ns") for r in rounds) / 1e6 / len(rounds)
           if rounds else 0.0,
           "cpu_s_per_gb": cpu / nbytes if nbytes else 0.0}  # ns per byte = s per GB
    if key == "save":
        out["fsync_share"] = sum(r.sync_ns for r in rounds) / ns if ns else 0.0
    return out


def _targets(p: layout.Plan, files: list) -> list[dict[str, Any]]:
    """Facts of each directory or device the checkpoint went to (one entry per place)."""
    out: dict[str, dict[str, Any]] = {}
    for f in files:
        where = os.path.dirname(f.path) if os.path.basename(f.path).startswith(
            "gpufio-ckpt-shard") else f.path
        out.setdefault(where, {**f.facts, "path": where})
    return list(out.values())


def _result(job: Job, name: str, mode: str | None, baseline: bool, mover: Mover,
            p: layout.Plan, files: list, rounds: list[Round], failure: str | None) -> dict[str, Any]:
    c = job.workload_settings
    bad = [b for r in rounds for b in r.bad]
    first_bad = None
    if bad:
        ext = p.extents[bad[0][0]]
        first_bad = f"shard {ext.shard}: {p.paths[ext.file]} at byte {ext.offset + bad[0][1]}"
    done = len(rounds)
    return {
        "jobname": f"{job.name} naive" if baseline else job.name,
        "engine": None if baseline else job.engine,
        "path": name if baseline else label(job.engine, {"mode": mode}),
        "engine_mode": mode, "baseline": baseline, "workload": "checkpoint",
        "device": c.device, "layout": c.layout, "targets": _targets(p, files),
        "files": len(p.paths), "state_bytes": sum(e.nbytes for e in p.extents),
        "shards": len(p.extents), "largest_shard": max(e.nbytes for e in p.extents),
        "smallest_shard": min(e.nbytes for e in p.extents),
        "bs": job.bs, "iodepth": job.iodepth, "direct": job.direct and not baseline,
        "page_cache": mover.page_cache, "mover": mover.facts,
        "iterations": c.iterations, "iterations_done": done,
        "rounds": [{k: v for k, v in asdict(r).items() if k != "bad"} | {"bad_shards": len(r.bad)}
                   for r in rounds],
        "save": _phase(rounds, "save"), "restore": _phase(rounds, "restore"),
        "verify": {"bytes": sum(r.bytes for r in rounds), "bad_shards": len(bad),
                   "first_bad": first_bad},
        "interrupted": done < c.iterations and failure is None,
        "failure": failure, "error": int(bool(bad) or failure is not None),
        "resolved options": {"engine": job.engine, "bs": job.bs, "iodepth": job.iodepth,
                             "direct": job.direct, "targets": list(job.targets),
                             **{k: list(v) if isinstance(v, tuple) else v
                                for k, v in vars(c).items()}},
    }
