"""fio's JSON results read as gpufio result documents, so ``compare``, ``check`` and
``plot`` put a fio run beside a gpufio run."""

from __future__ import annotations

from typing import Any

from gpufio.core.errors import BadInput


def from_fio(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """A fio JSON result (fio's own, or gpufio's fio-json) as the fields compare/check read.

    fio reports percentiles on completion latency (clat_ns) unless lat_percentiles=1 put
    them on lat_ns; the total latency's are used when present. fio's usr_cpu and sys_cpu
    under group_reporting are per-job averages, so CPU per I/O multiplies by numjobs.
    """
    jobs = []
    for job in doc["jobs"]:
        try:
            blocks = {d: _block(job[d]) for d in ("read", "write") if d in job}
            rd = blocks["read"]
            ios = sum(b["total_ios"] for b in blocks.values())
            runtime = max(b["runtime"] for b in blocks.values())
            numjobs = int(job.get("job options", {}).get("numjobs", 1))
            cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime / 1000 * numjobs
            jobs.append({
                "jobname": job["jobname"], "error": job.get("error", 0),
                "engine": job.get("job options", {}).get("ioengine", "fio"),
                **blocks, "read": rd,
                "cpu_us_per_io": 1e6 * cpu_s / ios if ios else 0.0,
                "resolved options": job.get("job options", {}), "targets": []})
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"{path}: fio result lacks a field gpufio needs: {e}") from None
    return {"host": {"cpu": doc["fio version"]}, "gpus": [], "jobs": jobs,
            "interrupted": False}


def _block(rd: dict[str, Any]) -> dict[str, Any]:
    """A fio read/write block with its percentiles where gpufio reads them (lat_ns)."""
    lat = dict(rd["lat_ns"])
    lat["percentile"] = (rd["lat_ns"].get("percentile") or rd["clat_ns"].get("percentile")
                         or {p: 0 for p in ("50.000000", "99.000000", "99.900000")})
    return {**rd, "lat_ns": lat}
