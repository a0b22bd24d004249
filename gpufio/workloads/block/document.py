"""The block workload's results as data (fio-style JSON) and as tables (Rich, CSV, Markdown).

The document is built once from the runner's results; every other format is rendered from
that document, so a table can never disagree with the JSON, and later tools (compare, check)
can render loaded result files the same way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufio.core.job import Job, Profile, directions, job_direction
from gpufio.core.stats import LatencyStats
from gpufio.engines import all_engines
from gpufio.engines.base import label
from gpufio.facts.device import pci_device_of
from gpufio.facts.host import host_facts
from gpufio.facts.system import pci_relation
from gpufio.io.nvme.spec import error_name
from gpufio.results.load import job_heading, storage_note
from gpufio.results.render import render as render_rows
from gpufio.run.records import JobResult, RunOutcome
from gpufio.workloads.documents import not_storage_title

if TYPE_CHECKING:
    from rich.console import Console

FORMATS = ("table", "json", "fio-json", "csv", "markdown")


# the percentiles every table shows, reported whatever percentile_list asks for
TABLE_PERCENTILES = (50.0, 99.0, 99.9)


def _lat_block(lat: LatencyStats, plist: tuple[float, ...]) -> dict[str, Any]:
    wanted = tuple(sorted(set(plist) | set(TABLE_PERCENTILES)))
    return {"min": lat.min, "max": lat.max, "mean": lat.mean, "stddev": lat.stddev, "N": lat.n,
            "percentile": {f"{p:f}": v for p, v in lat.percentiles(wanted).items()},
            # fio's json+ histogram: the non-zero buckets, so results merge exactly
            "bins": hist_bins(lat)}


def hist_bins(lat: LatencyStats) -> dict[str, int]:
    """The histogram's non-zero buckets, by index."""
    return {str(i): int(c) for i, c in enumerate(lat.hist.tolist()) if c}


def lat_from_block(block: dict[str, Any]) -> LatencyStats:
    """The LatencyStats a document's lat_ns block was written from (histogram, count,
    moments and extremes), for merging documents exactly."""
    lat = LatencyStats(n=int(block["N"]), mean=float(block["mean"]),
                       m2=float(block["stddev"]) ** 2 * max(int(block["N"]) - 1, 0),
                       min=int(block["min"]), max=int(block["max"]))
    for i, c in block.get("bins", {}).items():
        lat.hist[int(i)] = c
    return lat


def rw_block(ios: int, nbytes: int, runtime_ns: int, short: int, lat: LatencyStats,
              plist: tuple[float, ...]) -> dict[str, Any]:
    secs = runtime_ns / 1e9
    return {
        "io_bytes": nbytes, "io_kbytes": nbytes // 1024,
        "bw_bytes": nbytes / secs if secs else 0.0,
        "bw": nbytes / 1024 / secs if secs else 0.0,
        "iops": ios / secs if secs else 0.0,
        "runtime": runtime_ns / 1e6,
        "total_ios": ios, "short_ios": short, "drop_ios": 0,
        "lat_ns": _lat_block(lat, plist),
    }


def _cpu_fields(usr: float, sys: float, runtime_ns: int, ios: int) -> dict[str, float]:
    secs = runtime_ns / 1e9
    return {"usr_cpu": 100.0 * usr / secs if secs else 0.0,
            "sys_cpu": 100.0 * sys / secs if secs else 0.0,
            "cpu_us_per_io": 1e6 * (usr + sys) / ios if ios else 0.0}


def _job_document(r: JobResult, groupid: int) -> dict[str, Any]:
    job = r.job
    # the options as the profile resolved them (engine and workload settings hold the
    # same values typed, and what the engine picked, which engine_facts report)
    resolved = {k: v for k, v in vars(job).items()
                if k not in ("engine_options", "options_as_given", "engine_settings",
                             "workload_settings")}
    resolved["random_distribution"] = str(job.random_distribution)
    resolved.update(job.engine_options)
    per_target = {p["path"]: p for p in r.per_target}
    return {
        "jobname": job.name, "groupid": groupid, "error": 0 if r.ok else 1,
        "engine": job.engine, "engine_facts": r.engine_facts,
        "job options": {k: str(v) for k, v in job.options_as_given.items()},
        "resolved options": resolved,
        **{name: rw_block(d.ios, d.bytes, r.runtime_ns,
                           r.short_ios if name == main_direction(job) else 0, d.lat,
                           job.percentile_list)
           for name, d in (("read", r.read), ("write", r.write))},
        "sync": {"total_ios": r.syncs, "lat_ns": {"mean": r.sync_ns / r.syncs if r.syncs else 0.0},
                 "seconds": r.sync_ns / 1e9},
        **_cpu_fields(r.cpu.usr, r.cpu.sys, r.runtime_ns, r.ios),
        "cpu_accounting": r.cpu_accounting, "window_unix_ms": list(r.window_unix_ms),
        "targets": [{**t, **per_target.get(t["path"], {})} for t in r.targets],
        "workers": r.per_worker,
        "errors": [{**e, "errno_name": error_name(e["errno"])} for e in r.errors],
        "verify": {"enabled": job.verify, "failures": r.verify_failures,
                   "bad_offsets": r.bad_offsets},
        "samples": r.samples,
        "lat_hist": {"layout": "fio plat: 64 buckets per power of two, 29 groups, ns",
                     "bins": hist_bins(r.lat)},
        "interrupted": r.interrupted,
        "failure": r.failure,
        **({"steadystate": r.steadystate} if r.steadystate else {}),
        **({"phases": r.phases} if r.phases else {}),
        **({"per_gpu": [{"gpu": g["gpu"], "workers": g["workers"],
                         **{name: rw_block(d.ios, d.bytes, r.runtime_ns, 0, d.lat,
                                           job.percentile_list)
                            for name, d in zip(("read", "write"), g["dirs"])}}
                        for g in r.per_gpu]} if r.per_gpu else {}),
    }


def main_direction(job: Job) -> str:
    """The direction a job's headline numbers are: write for write-only jobs, else read."""
    return "read" if job.reads else "write"


def _group_total(results: list[JobResult]) -> dict[str, Any]:
    runtime = max(r.runtime_ns for r in results)
    plist = tuple(sorted({p for r in results for p in r.job.percentile_list}))
    out: dict[str, Any] = {}
    for name in ("read", "write"):
        lat = LatencyStats()
        for r in results:
            lat.merge(getattr(r, name).lat)
        out[name] = rw_block(sum(getattr(r, name).ios for r in results),
                              sum(getattr(r, name).bytes for r in results), runtime,
                              sum(r.short_ios for r in results if main_direction(r.job) == name),
                              lat, plist)
    return {**out, **_cpu_fields(max(r.cpu.usr for r in results),
                                 max(r.cpu.sys for r in results), runtime,
                                 sum(r.ios for r in results))}


def _gpus_if_used(outcome: RunOutcome) -> list[dict[str, Any]]:
    """GPU facts when a job used a GPU engine (CPU-only runs never load CUDA for them), each
    with its PCIe path to the disk of every target of the run that has one."""
    if not any(all_engines()[r.job.engine].uses_gpu for r in outcome.results):
        return []
    from gpufio.io.gpu import gpu_facts

    disks: dict[str, str] = {}  # a disk, and one target's path on it
    for r in outcome.results:
        for t in r.targets:
            if t.get("device") and not t.get("ram_backed"):
                disks.setdefault(str(t["device"]), t["path"])
    return [{**g, **topology(g, disks)} for g in gpu_facts()]


def topology(gpu: dict[str, Any], disks: dict[str, str],
             pci_devices: Path = Path("/sys/bus/pci/devices")) -> dict[str, Any]:
    """``pcie_path_to``: how the GPU and each disk (given by a path on it) meet in the PCIe
    tree (same switch, same root port, same root complex, across root complexes), where the
    disk hangs below a PCI function (an NVMe controller, a virtio or SCSI adapter)."""
    place = pci_devices / str(gpu.get("pci_bus_id", "")).lower()
    if not disks or not place.exists():
        return {}
    out = {}
    for disk, path in disks.items():
        try:
            dev = pci_device_of(path)
        except OSError:  # the target is gone by now: nothing to place
            dev = None
        if dev is not None:
            out[disk] = pci_relation(dev, place.resolve())
    return {"pcie_path_to": out} if out else {}


def build_document(outcome: RunOutcome, profile: Profile) -> dict[str, Any]:
    """The result file: fio's field names where fio has them, gpufio's own beside them."""
    now = time.time()
    host = host_facts()
    doc: dict[str, Any] = {
        "gpufio version": host["gpufio_version"],
        "timestamp": int(now), "time": time.ctime(now),
        "profile": profile.path,
        "host": host,
        "gpus": _gpus_if_used(outcome),
        "interrupted": outcome.interrupted,
        "jobs": [_job_document(r, profile.group_of(i)[1])
                 for i, r in enumerate(outcome.results)],
    }
    if profile.limits:
        doc["check"] = profile.limits
    if profile.notes:  # how a fio job file's options run here (verify, engines ...)
        doc["notes"] = list(profile.notes)
    groups: dict[int, list[JobResult]] = {}
    for i, r in enumerate(outcome.results):
        groups.setdefault(profile.group_of(i)[1], []).append(r)
    if profile.concurrent and len(groups) == 1 and len(outcome.results) > 1:  # one job is its total
        doc["group_total"] = _group_total(outcome.results)
    elif profile.concurrent and len(groups) > 1:  # fio's reporting groups (stonewall, new_group)
        doc["group_totals"] = [{"groupid": g, **_group_total(rs)} for g, rs in groups.items()]
    return doc


def _status(job: dict[str, Any]) -> str:
    """The table's status of a job, with what its targets were where not a drive
    ('ok (page cache: not storage)')."""
    if job.get("failure"):
        return "failed"
    if job["errors"] or any(job.get(d, {}).get("short_ios") for d in ("read", "write")):
        status = "io-errors"
    elif job["verify"]["failures"]:
        status = "bad-data"
    else:
        status = "interrupted" if job.get("interrupted") else "ok"
    note = next((n for t in job.get("targets", []) if (n := storage_note(t))), "")
    return f"{status} ({note})" if note else status


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per job (and the group total): the numbers every table format shows."""
    rows = []
    entries = [(j["jobname"], j.get("engine", ""), j) for j in doc["jobs"]]
    if "group_total" in doc:
        entries.append(("group total", "", doc["group_total"]))
    entries.extend((f"group {g['groupid']} total", "", g) for g in doc.get("group_totals", []))
    for name, engine, j in entries:
        have = directions(j)
        for rw in have:
            shown = _rw_shown(j, rw, len(have) > 1)
            rows.append(_row(name, engine, rw, j, shown))
            rows.extend(_row(part, engine, rw, p, shown) for part, p in _parts(name, j)
                        if p.get(rw, {}).get("total_ios"))
    return rows


def _rw_shown(job: dict[str, Any], direction: str, mixed: bool) -> str:
    """A row's rw: the job's rw as its profile wrote it (randread, not read), a mixed job's
    direction beside it; the direction alone where no job wrote one (the group total)."""
    written = job.get("job options", {}).get("rw") or job.get("resolved options", {}).get("rw")
    if not written:
        return direction
    return f"{written} ({direction})" if mixed else str(written)


def _parts(name: str, job: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A job's parts as rows of their own: each GPU of a job over several, and an MPI run's
    hosts (when more than one) and ranks."""
    gpus = [(f"{name} · gpu {g['gpu']}" + (f" of rank {g['rank']}" if "rank" in g else ""), g)
            for g in job.get("per_gpu", [])]
    mpi = job.get("mpi")
    if not mpi:
        return gpus
    hosts = [(f"{name} · {h['host']}", h) for h in mpi["hosts"]] if len(mpi["hosts"]) > 1 else []
    return gpus + hosts + [(f"{name} · rank {r['rank']}", r) for r in mpi["ranks"]]


def _row(name: str, engine: str, rw: str, j: dict[str, Any], shown: str) -> dict[str, Any]:
    """A table row: one direction (``rw``) of one job, its rw column ``shown``."""
    rd = j[rw]
    pct = rd["lat_ns"]["percentile"]
    row = {
        "job": name, "engine": label(engine, j.get("engine_facts", {})), "rw": shown,
        "IOPS": round(rd["iops"]), "MB/s": round(rd["bw_bytes"] / 1e6, 1),
        "mean_us": round(rd["lat_ns"]["mean"] / 1e3, 1),
        "p50_us": round(pct["50.000000"] / 1e3, 1), "p99_us": round(pct["99.000000"] / 1e3, 1),
        "p99.9_us": round(pct["99.900000"] / 1e3, 1),
        "usr%": round(j["usr_cpu"], 1) if "usr_cpu" in j else "",
        "sys%": round(j["sys_cpu"], 1) if "sys_cpu" in j else "",
        "cpu_us/io": round(j["cpu_us_per_io"], 2) if "cpu_us_per_io" in j else "",
        "status": _status(j) if "errors" in j else "",
    }
    if "repeat" in j:  # --repeat promises the spread: the table shows it beside the median
        rep, key = j["repeat"], "iops" if rw == "read" else "write_iops"
        if key in rep["median"]:
            row["IOPS"] = round(rep["median"][key])
            row["IOPS min-max"] = (f"{rep['min'][key]:,.0f}-{rep['max'][key]:,.0f} "
                                   f"(n={rep['n']})")
    return row


def _title(doc: dict[str, Any]) -> str:
    return f"gpufio {doc['gpufio version']} · {doc['profile']}" + not_storage_title(doc)


def render(doc: dict[str, Any], fmt: str, console: Console | None = None) -> str:
    """The document in ``fmt``; 'table' is printed to ``console`` and returns ''."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "fio-json":
        from gpufio.fio.json_out import to_fio

        return json.dumps(to_fio(doc), indent=2) + "\n"
    return render_rows(summary_rows(doc), fmt, title=_title(doc),
                       left=("job", "engine", "rw", "status"), columns=("job",), console=console,
                       problems=problems(doc) if fmt == "table" else (),
                       heading=[job_heading(j) for j in doc["jobs"]])


def problems(doc: dict[str, Any]) -> list[str]:
    """Every job's lines about numbers that cannot be trusted."""
    return [line for job in doc["jobs"] for line in problem_lines(job)]


def problem_lines(job: dict[str, Any]) -> list[str]:
    """Human lines for everything that makes a job's numbers untrustworthy."""
    name = job["jobname"]
    lines = []
    if job.get("failure"):
        lines.append(f"job '{name}': {job['failure']}")
    for e in job["errors"]:
        lines.append(f"job '{name}': {e['count']} I/O errors {e['errno_name']} on {e['target']}")
    short = "short writes" if job_direction(job) == "write" else "short I/Os" \
        if job.get("write", {}).get("total_ios") else "short reads"
    for t in job["targets"]:
        if t.get("short_ios"):
            lines.append(f"job '{name}': {t['short_ios']} {short} on {t['path']}")
    ss = job.get("steadystate")
    if ss and not ss["attained"] and not job.get("interrupted"):
        lines.append(f"job '{name}': steady state {ss['criterion']} not attained in the "
                     "runtime (the numbers are of a drive still settling)")
    if job["verify"]["failures"]:
        offs = ", ".join(f"{b['target']}@{b['offset']}" for b in job["verify"]["bad_offsets"])
        lines.append(f"job '{name}': {job['verify']['failures']} blocks failed verify; first: {offs}")
    return lines
