"""fio's JSON results read as gpufio result documents, so ``compare``, ``check`` and
``plot`` put a fio run beside a gpufio run."""

from __future__ import annotations

import re
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.core.stats import bucket_index
from gpufio.engines import DEFAULT_ENGINE
from gpufio.fio.cmdline import key_names
from gpufio.fio.jobfile import fio_engine_names

_ZERO_PCT = {p: 0 for p in ("50.000000", "99.000000", "99.900000")}


def from_fio(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """A fio JSON result (fio's own, or gpufio's fio-json) as the fields compare/check read.

    Latency is fio's lat (lat_ns) where the file has it. fio reports percentiles and json+
    bins on completion latency (clat_ns) unless lat_percentiles=1 put them on lat_ns; the
    total latency's are used when present, and each job's ``latency`` says which one its
    mean and its percentiles are. fio's usr_cpu and sys_cpu under group_reporting are
    per-job averages, so CPU per I/O multiplies by numjobs. The job's options, [global]'s
    with its own, are under gpufio's names (``resolved options``) with fio's text as values.
    """
    shared = doc.get("global options", {})
    jobs = []
    for job in doc["jobs"]:
        try:
            given = {**shared, **job.get("job options", {})}
            blocks = {d: _block(job[d]) for d in ("read", "write") if d in job}
            rd = blocks["read"]
            ios = sum(b["total_ios"] for b in blocks.values())
            runtime = max(b["runtime"] for b in blocks.values())
            numjobs = int(given.get("numjobs", 1))
            cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime / 1000 * numjobs
            kinds = _kinds(job[_main(blocks)])
            resolved = options(given)
            jobs.append({
                "jobname": job["jobname"], "error": job.get("error", 0),
                "engine": given.get("ioengine", DEFAULT_ENGINE),
                **blocks, "read": rd,
                "cpu_us_per_io": 1e6 * cpu_s / ios if ios else 0.0,
                "resolved options": resolved, "latency": kinds,
                "targets": [{"path": p} for p in resolved.get("targets", [])]})
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"{path}: fio result lacks a field gpufio needs: {e}") from None
    return {"fio version": doc["fio version"], "host": {}, "gpus": [], "jobs": jobs,
            "interrupted": False}


def options(given: dict[str, str]) -> dict[str, Any]:
    """fio's options under gpufio's names, fio's text as the values: the files a list, the
    engine gpufio's name for it where it has one."""
    out: dict[str, Any] = {}
    names = key_names()
    for key, value in given.items():
        if key == "filename":
            out["targets"] = [p.replace("\\:", ":") for p in re.split(r"(?<!\\):", value) if p]
        elif key in names:
            out[names[key]] = value
    # a job that names none ran fio's default, psync, which gpufio's default engine is too
    engine = given.get("ioengine", DEFAULT_ENGINE)
    cuda_io = given.get("cuda_io")
    out["engine"] = fio_engine_names().get(f"{engine}:{cuda_io}" if cuda_io else engine,
                                           (engine, ""))[0]
    return out


def _main(blocks: dict[str, dict[str, Any]]) -> str:
    """The direction that did I/O (read where both or neither did)."""
    return "write" if not blocks["read"]["total_ios"] and blocks.get("write", {}).get(
        "total_ios") else "read"


def _kinds(rd: dict[str, Any]) -> dict[str, str]:
    """Which of fio's latencies a block's mean and percentiles are: lat or clat."""
    return {"mean": "lat" if "lat_ns" in rd else "clat",
            "percentiles": "lat" if "percentile" in rd.get("lat_ns", {}) else "clat"}


def _block(rd: dict[str, Any]) -> dict[str, Any]:
    """A fio read/write block with its latency where gpufio reads it (lat_ns): lat's mean,
    and the percentiles and histogram (json+'s bins, by bucket value, as gpufio's buckets)
    of lat where fio wrote them, else of clat."""
    kinds = _kinds(rd)
    source = rd["lat_ns" if kinds["percentiles"] == "lat" else "clat_ns"]
    lat = dict(rd["lat_ns" if kinds["mean"] == "lat" else "clat_ns"])
    lat["percentile"] = source.get("percentile") or dict(_ZERO_PCT)
    bins: dict[str, int] = {}
    for value, count in source.get("bins", {}).items():
        index = str(int(bucket_index(int(value))))
        bins[index] = bins.get(index, 0) + int(count)
    lat["bins"] = bins
    return {**rd, "lat_ns": lat}
