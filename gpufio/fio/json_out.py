"""``--format fio-json``: a result as fio's ``json+``, for fio's tools and fio-plot.

gpufio measures one latency per I/O, from issue to completion, fio's ``lat``; fio splits it
into submission (slat) and completion (clat) latency. Here it is reported as both
``clat_ns`` and ``lat_ns``, each with its percentiles and json+'s histogram (``bins``: each
non-empty bucket's value in ns, as text, and its count), where fio's tools look for either.
Fields gpufio does not measure (submission latency, context switches, page faults,
queue-depth distributions, disk utilisation) are left out rather than written as zeros; a
target whose reads did not reach storage is named under ``gpufio not storage``; a
direction the job did not do, and trim, are zero blocks as in fio. The job options are
fio's names and values, as text (``ioengine: io_uring``, ``direct: "1"``, ``filename`` the
':'-joined files).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from gpufio.core.job import directions
from gpufio.core.stats import PLAT_NR, bucket_value
from gpufio.fio.cmdline import key_names, option_text
from gpufio.fio.jobfile import fio_engine_names

_US_EDGES = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000)
_MS_EDGES = (2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000)


# what fio's job options always show of a gpufio job, given or not (fio-plot and scripts
# read rw, bs, iodepth and numjobs there)
_ALWAYS = ("rw", "bs", "iodepth", "numjobs", "direct")


def _stat_block(lat: dict[str, Any]) -> dict[str, Any]:
    """fio's clat_ns/lat_ns block: the moments, and where there were I/Os (as fio writes
    them) the percentiles and the histogram by bucket value."""
    block = {k: lat[k] for k in ("min", "max", "mean", "stddev", "N")}
    if lat["N"]:
        block["percentile"] = lat["percentile"]
        block["bins"] = {str(int(bucket_value(int(i)))): int(c)
                         for i, c in sorted(lat.get("bins", {}).items(), key=lambda b: int(b[0]))}
    return block


def _zero_block() -> dict[str, Any]:
    zero = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
    return {"io_bytes": 0, "io_kbytes": 0, "bw_bytes": 0, "bw": 0, "iops": 0.0, "runtime": 0,
            "total_ios": 0, "short_ios": 0, "drop_ios": 0, "clat_ns": dict(zero),
            "lat_ns": dict(zero), "bw_min": 0, "bw_max": 0, "bw_agg": 0.0, "bw_mean": 0.0,
            "bw_dev": 0.0, "bw_samples": 0, "iops_min": 0, "iops_max": 0, "iops_mean": 0.0,
            "iops_stddev": 0.0, "iops_samples": 0}


def _sample_stats(values: list[float]) -> tuple[float, float, float, float, int]:
    if not values:
        return 0, 0, 0.0, 0.0, 0
    dev = statistics.stdev(values) if len(values) > 1 else 0.0
    return min(values), max(values), statistics.fmean(values), dev, len(values)


def _distribution(bins: dict[str, int], scale_ns: int, edges: tuple[int, ...]) -> dict[str, float]:
    """fio's latency_us / latency_ms: percent of I/Os up to each edge, from the histogram."""
    counts = np.zeros(PLAT_NR, dtype=np.int64)
    for index, count in bins.items():
        counts[int(index)] = count
    total = counts.sum()
    values = bucket_value(np.arange(PLAT_NR))
    out, lower = {}, (0 if scale_ns == 1 else scale_ns)  # each unit starts where the last ended
    for edge in edges:
        upper = edge * scale_ns
        share = counts[(values > lower) & (values <= upper)].sum()
        out[str(edge)] = 100.0 * share / total if total else 0.0
        lower = upper
    if scale_ns == 1_000_000:
        out[f">={edges[-1]}"] = 100.0 * counts[values > lower].sum() / total if total else 0.0
    return out


def _direction(rd: dict[str, Any], samples: list[dict[str, float]]) -> dict[str, Any]:
    """One of fio's read/write blocks from gpufio's; ``samples`` are this direction's
    bandwidth/IOPS samples (none for a mixed job, whose samples count both)."""
    bmin, bmax, bmean, bdev, bn = _sample_stats([s["bw_bytes"] / 1024 for s in samples])
    imin, imax, imean, idev, inum = _sample_stats([s["iops"] for s in samples])
    block = {k: rd[k] for k in ("io_bytes", "io_kbytes", "iops", "total_ios", "short_ios",
                                "drop_ios")}
    block.update(bw_bytes=int(rd["bw_bytes"]), bw=int(rd["bw"]), runtime=int(rd["runtime"]),
                 clat_ns=_stat_block(rd["lat_ns"]), lat_ns=_stat_block(rd["lat_ns"]),
                 bw_min=int(bmin), bw_max=int(bmax), bw_agg=100.0, bw_mean=bmean, bw_dev=bdev,
                 bw_samples=bn, iops_min=int(imin), iops_max=int(imax), iops_mean=imean,
                 iops_stddev=idev, iops_samples=inum)
    return block


def _job(job: dict[str, Any]) -> dict[str, Any]:
    have = directions(job)
    samples = job.get("samples", []) if len(have) == 1 else []
    blocks = {d: _direction(job[d], samples) if d in have or d == have[0] else _zero_block()
              for d in ("read", "write")}
    runtime = int(job[have[0]]["runtime"])
    sync = job.get("sync", {"total_ios": 0, "lat_ns": {"mean": 0.0}})
    hist = job.get("lat_hist", {}).get("bins")
    out = {"jobname": job["jobname"], "groupid": job.get("groupid", 0), "error": job["error"],
           "eta": 0, "elapsed": int(runtime / 1000),
           "job options": job_options(job),
           **blocks, "trim": _zero_block(),
           "sync": {"total_ios": sync["total_ios"],
                    "lat_ns": {"min": 0, "max": 0, "mean": sync["lat_ns"]["mean"],
                               "stddev": 0.0, "N": sync["total_ios"]}},
           "job_runtime": runtime, "usr_cpu": job["usr_cpu"],
           "sys_cpu": job["sys_cpu"], "latency_target": 0, "latency_percentile": 100.0, "latency_window": 0}
    # fio has no such field: a key of gpufio's own, which fio's tools pass over, so a result
    # whose reads did not reach storage never reads as a drive's
    unbacked = [{"path": t.get("path", "?"), **t["storage"]} for t in job.get("targets", [])
                if t.get("storage") and not t["storage"]["reaches_storage"]]
    if unbacked:
        out["gpufio not storage"] = unbacked
    if hist:
        out["latency_ns"] = _distribution(hist, 1, _US_EDGES)
        out["latency_us"] = _distribution(hist, 1_000, _US_EDGES)
        out["latency_ms"] = _distribution(hist, 1_000_000, _MS_EDGES)
    return out


# gpufio keys whose values fio reads otherwise: gpufio's verify is its own pattern check,
# which no value of fio's verify names
_NOT_FIOS = ("verify",)


def _fio_names() -> dict[str, str]:
    """gpufio key -> fio's name for it (fio's own spelling where it is the same word)."""
    names: dict[str, str] = {}
    for fio, ours in key_names().items():
        if ours not in _NOT_FIOS and (fio == ours or ours not in names):
            names[ours] = fio
    return names


def _ioengine(engine: str) -> dict[str, str]:
    """fio's ioengine (and cuda_io) for a gpufio engine: the one it runs as without a note,
    else the first; a path fio has none for keeps gpufio's name."""
    found = sorted(((note != "", fio) for fio, (ours, note) in fio_engine_names().items()
                    if ours == engine))
    if not found:
        return {"ioengine": engine}
    ioengine, _, cuda_io = found[0][1].partition(":")
    return {"ioengine": ioengine, **({"cuda_io": cuda_io} if cuda_io else {})}


def job_options(job: dict[str, Any]) -> dict[str, str]:
    """A result job's options as fio's "job options": fio's names, values as fio's text;
    the keys it gave, and those fio's readers look for, as they resolved."""
    given = job.get("job options", {})
    resolved = {**job.get("resolved options", {}),
                **job.get("resolved options", {}).get("workload_options", {})}
    out = {"name": job["jobname"]}
    for key, fio in _fio_names().items():
        if key not in given and key not in _ALWAYS or resolved.get(key) is None:
            continue
        value = resolved[key]
        plain = isinstance(value, (bool, list, tuple)) or key not in given
        out[fio] = option_text(value) if plain else str(given[key])
    paths = [t["path"] for t in job.get("targets", []) if "path" in t]
    if paths:  # what the job ran on: a scratch file gpufio laid out included
        out["filename"] = option_text(paths)
    return {**out, **_ioengine(job["engine"])}


def to_fio(doc: dict[str, Any]) -> dict[str, Any]:
    """The fio json+ document for a gpufio result document; "global options" holds what
    every job shares (each job's options keep it too, for readers that look there only)."""
    jobs = [_job(j) for j in doc["jobs"]]
    options = [j["job options"] for j in jobs]
    shared = {k: v for k, v in options[0].items()
              if k != "name" and all(o.get(k) == v for o in options)} if options else {}
    return {"fio version": f"gpufio-{doc['gpufio version']}", "timestamp": doc["timestamp"],
            "timestamp_ms": doc["timestamp"] * 1000, "time": doc["time"],
            "global options": shared, "jobs": jobs, "disk_util": []}
