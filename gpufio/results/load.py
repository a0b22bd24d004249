"""Reading result files back: validation, the metrics every comparison uses, setup facts.

``compare`` and ``check`` both work on result documents, never on live runs, so that a
baseline stored in CI months ago compares exactly like one made a minute ago.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from gpufio.core.errors import BadInput, reading
from gpufio.core.job import directions, job_direction
from gpufio.core.units import parse_size
from gpufio.fio.json_in import from_fio


@dataclass(frozen=True)
class Metric:
    """One number per job: how to read it from a job document, which way is better, and
    the direction it belongs to (None: the job as a whole)."""

    name: str
    unit: str
    higher_is_better: bool
    read: Callable[[dict[str, Any]], float]
    direction: str | None = None


def _pct(d: str, p: str) -> Callable[[dict[str, Any]], float]:
    return lambda job: job[d]["lat_ns"]["percentile"][p] / 1e3


def _direction_metrics(d: str) -> tuple[Metric, ...]:
    """The per-direction metrics: read's carry the plain names (iops, lat_p99), write's
    the prefix write_, as fio's read and write blocks."""
    pre = "" if d == "read" else "write_"
    return (Metric(f"{pre}iops", "IOPS", True, lambda j: j[d]["iops"], d),
            Metric(f"{pre}bw", "MB/s", True, lambda j: j[d]["bw_bytes"] / 1e6, d),
            Metric(f"{pre}lat_mean", "us", False, lambda j: j[d]["lat_ns"]["mean"] / 1e3, d),
            Metric(f"{pre}lat_p50", "us", False, _pct(d, "50.000000"), d),
            Metric(f"{pre}lat_p99", "us", False, _pct(d, "99.000000"), d),
            Metric(f"{pre}lat_p99.9", "us", False, _pct(d, "99.900000"), d))


METRICS: dict[str, Metric] = {m.name: m for m in (
    *_direction_metrics("read"), *_direction_metrics("write"),
    Metric("cpu_per_io", "us", False, lambda j: j["cpu_us_per_io"]),
)}


def _read(path: str) -> dict[str, Any]:
    """A JSON file's document with a 'jobs' list, or BadInput naming the file."""
    with reading(path, "result file"), open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise BadInput(f"{path}: not a gpufio result (no 'jobs' list)")
    return doc


def saved(path: str) -> dict[str, Any]:
    """A result document gpufio wrote (``run -f json``), of any workload, as it was written:
    what ``gpufio show`` prints again."""
    doc = _read(path)
    if "gpufio version" not in doc:
        what = f"a fio result ({doc['fio version']})" if "fio version" in doc else \
            "not a gpufio result (no 'gpufio version')"
        raise BadInput(f"{path}: {what}; show prints the results gpufio run -f json writes "
                       "(compare and check read fio's too)")
    return doc


def load(path: str) -> dict[str, Any]:
    """A result document from ``path`` (gpufio's JSON), or BadInput naming the file."""
    doc = _read(path)
    if "workload" in doc and "metric_info" not in doc:  # a workload's own tables only
        title = doc.get("workload_title", doc["workload"])
        raise BadInput(f"{path}: a {title} workload result; compare, check and plot read "
                       f"results that carry metrics (a {title} result carries its own "
                       f"{doc.get('own_tables', 'tables')})")
    if "metric_info" in doc:
        if not all(isinstance(j, dict) and "jobname" in j for j in doc["jobs"]):
            raise BadInput(f"{path}: a job lacks 'jobname'")
        return doc
    if "fio version" in doc:
        doc = from_fio(doc, path)
    for job in doc["jobs"]:
        if not isinstance(job, dict) or "jobname" not in job or "read" not in job:
            raise BadInput(f"{path}: a job lacks 'jobname' or 'read'")
    return doc


def plottable(path: str) -> dict[str, Any]:
    """A result document ``gpufio plot`` draws: those ``load`` reads, and a workload's whose
    jobs are timed in stages (its ``stages``: their names, in order), or BadInput naming
    the file."""
    doc = _read(path)
    if "stages" not in doc:
        return load(path)
    if not all(isinstance(j, dict) and "jobname" in j and "stages" in j for j in doc["jobs"]):
        raise BadInput(f"{path}: a job lacks 'jobname' or 'stages'")
    return doc


def metrics_of(doc: dict[str, Any]) -> dict[str, Metric]:
    """The metrics of a document: the I/O metrics, or those a workload's document declares
    in its ``metric_info`` (each job then carries its values in ``metrics``)."""
    info = doc.get("metric_info")
    if info is None:
        return METRICS
    return {name: Metric(name, i["unit"], i["higher_is_better"],
                         lambda job, n=name: job["metrics"][n]) for name, i in info.items()}


def median(values: Iterable[float]) -> float:
    """statistics.median, imported on first use: a run's start, which takes no median,
    does not wait for it (and the fractions and decimal modules it brings)."""
    import statistics

    return statistics.median(values)


def job_metrics(job: dict[str, Any]) -> dict[str, float]:
    """Every metric of one job that its directions have (a workload's job: the ``metrics``
    it carries); with ``--repeat`` results, the medians over the repeats."""
    if "read" not in job:  # a workload's job
        return dict(job.get("metrics", {}))
    repeats = job.get("repeat", {}).get("runs")
    if repeats:
        return {name: median(run[name] for run in repeats) for name in repeats[0]}
    have = directions(job)
    return {name: m.read(job) for name, m in METRICS.items()
            if m.direction is None or m.direction in have}


def headline_iops(job: dict[str, Any]) -> float:
    """The IOPS a job is ranked and plotted by: its main direction's."""
    return job[job_direction(job)]["iops"]


def jobs_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Jobs keyed by name, in file order; a name met again (fio's numjobs clones, which
    share their job's name) as NAME#2, NAME#3 ..., so no job hides another."""
    out: dict[str, dict[str, Any]] = {}
    for job in doc["jobs"]:
        name, n = job["jobname"], 1
        while name in out:
            n += 1
            name = f"{job['jobname']}#{n}"
        out[name] = job
    return out


def storage_of(target: dict[str, Any]) -> dict[str, Any] | None:
    """A result target's ``storage`` fact (what its reads reached: facts/storage); for a
    result written before there was one, what its ``ram_backed`` said."""
    if "storage" in target:
        return target["storage"]
    if target.get("ram_backed"):
        kind = target.get("ram_backing", "RAM")
        return {"kind": kind, "reaches_storage": False, "reason": f"ram-backed: {kind}"}
    return None


def storage_note(target: dict[str, Any]) -> str:
    """How a table names a result target's storage: '' for a drive, else its kind, with
    ': not storage' where its reads did not reach storage."""
    found = storage_of(target)
    if not found or found["kind"] == "drive":
        return ""
    return found["kind"] + ("" if found["reaches_storage"] else ": not storage")


def not_storage(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target of the document whose reads did not reach storage, by path: its
    ``storage`` fact."""
    out: dict[str, dict[str, Any]] = {}
    for job in doc["jobs"]:
        for t in job.get("targets", []):
            found = storage_of(t)
            if found and not found["reaches_storage"]:
                out.setdefault(t.get("path", "?"), found)
    return out


def setup_facts(doc: dict[str, Any]) -> dict[str, str]:
    """What was measured: host, kernel, GPUs and each target's drive, for headers and
    warnings; of a fio result (which names no host), fio's version and its targets."""
    host = doc.get("host", {})
    facts = {"tool": doc["fio version"]} if "fio version" in doc else {
        "host": f"{host.get('cpu', '?')} x{host.get('cpus', '?')}",
        "kernel": str(host.get("kernel", "?")),
        "gpus": ", ".join(g.get("name", "?") for g in doc.get("gpus", [])) or "none"}
    targets = []
    for job in doc["jobs"]:
        for t in job.get("targets", []):
            if set(t) == {"path"}:  # a fio result's file: its name is all it says
                entry = t["path"]
            else:
                entry = f"{t.get('path', '?')} ({_target(t)})"
            if entry not in targets:
                targets.append(entry)
    facts["targets"] = "; ".join(targets) or "none"
    return facts


def _target(t: dict[str, Any]) -> str:
    """What a target is: its drive's model, or filesystem, or kind; its link; its RAM."""
    desc = t.get("model") or t.get("filesystem") or t.get("kind", "?")
    if "current_pcie_gen" in t:
        desc += f" Gen{t['current_pcie_gen']}x{t.get('current_link_width', '?')}"
    note = storage_note(t)
    if note:
        desc += f", {note}"
    return desc


def target_paths(doc: dict[str, Any]) -> list[str]:
    """Every target path of a result, once each, in order."""
    return list(dict.fromkeys(t["path"] for j in doc["jobs"] for t in j.get("targets", [])
                              if "path" in t))


def describe(facts: dict[str, str]) -> str:
    """A result's setup facts as one line (a compare header)."""
    if "tool" in facts:
        return f"{facts['tool']}; targets {facts['targets']}"
    return (f"{facts['host']}, kernel {facts['kernel']}, GPUs {facts['gpus']}; "
            f"targets {facts['targets']}")


def _size(nbytes: int) -> str:
    """A block size as fio prints one: 4KiB, 128KiB, 1MiB, 512B."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def job_heading(job: dict[str, Any]) -> str:
    """A job's line as fio heads its output with one: ``randread: rw=randread, bs=4KiB,
    engine=uring, iodepth=32, numjobs=1, target=/dev/nvme0n1`` (a fio result's engine is
    fio's ioengine, and its latency says which of fio's it is where its percentiles are
    clat)."""
    opts = job.get("resolved options", {})
    parts = [f"rw={opts.get('rw', job_direction(job))}"]
    if opts.get("bs") is not None:
        try:
            parts.append(f"bs={_size(parse_size(opts['bs'], 'bs'))}")
        except BadInput:
            parts.append(f"bs={opts['bs']}")
    parts.append(f"engine={job.get('engine', '?')}")
    parts += [f"{k}={opts.get(k) if opts.get(k) is not None else d}"
              for k, d in (("iodepth", 1), ("numjobs", 1))]
    paths = [t["path"] for t in job.get("targets", []) if "path" in t]
    if paths:
        parts.append(f"target{'s' if len(paths) > 1 else ''}={':'.join(paths)}")
    kinds = job.get("latency")
    if kinds and kinds["percentiles"] == "clat":
        parts.append(f"latency: {kinds['mean']} mean, clat percentiles")
    return f"{job['jobname']}: {', '.join(parts)}"


def latency_notes(docs: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """A line per fio result whose latency percentiles are clat, not lat (gpufio's)."""
    return [f"{label}: fio's latency percentiles there are clat (completion only, without "
            "submission), gpufio's are lat; rerun fio with --lat_percentiles=1 to compare "
            "percentiles of lat" for label, doc in zip(labels, docs)
            if any(j.get("latency", {}).get("percentiles") == "clat" for j in doc["jobs"])]


def stage_seconds(job: dict[str, Any], stages: Iterable[str]) -> dict[str, float]:
    """A job's seconds per stage (and in all: 'total') over its timed iterations, from its
    ``stages`` summary (``<stage>_ms`` per iteration, ``timed_iterations``)."""
    s = job.get("stages") or {}
    return {st: s.get(f"{st}_ms", 0.0) * s.get("timed_iterations", 0) / 1e3
            for st in (*stages, "total")}


def emulated_labels(jobs: Iterable[dict[str, Any]]) -> list[str]:
    """Each drive model's "emulated: <model>, rates from <source>" that ``jobs`` read
    through (their fetch facts' ``drive``), once each, in order."""
    return list(dict.fromkeys(d["label"] for j in jobs
                              if (d := j.get("fetch", {}).get("drive"))))


def merged(docs: list[dict[str, Any]], paths: list[str], workload: Any) -> dict[str, Any]:
    """Saved results ``docs`` (read from ``paths``) of one workload and kind of machine, the
    runs of a profile's sections, as one document (the workload's ``merge``, its hostname
    every machine's); BadInput naming the file that does not belong."""
    if workload.merge is None:
        raise BadInput(f"{paths[1]}: {workload.name} results are shown one at a time")
    seen: dict[str, str] = {}
    for doc, path in zip(docs, paths):
        for job in doc["jobs"]:
            name = job.get("jobname", "")
            if name in seen:
                raise BadInput(f"{path}: job '{name}' is in {seen[name]} too; each section "
                               "once")
            seen[name] = path
    first = machine_kind(docs[0].get("host"))
    for doc, path in zip(docs[1:], paths[1:]):
        if doc.get("profile") != docs[0].get("profile"):
            raise BadInput(f"{path}: a run of {doc.get('profile')}, not of "
                           f"{docs[0].get('profile')} like {paths[0]}")
        if doc.get("workload") != docs[0].get("workload"):
            raise BadInput(f"{path}: a {doc.get('workload', 'block')} result, not "
                           f"{workload.name} like {paths[0]}")
        kind = machine_kind(doc.get("host"))
        if not same_kind(kind, first):
            raise BadInput(f"{path}: ran on another machine than {paths[0]} "
                           f"({kind} against {first}); one table holds one kind of "
                           "machine's runs")
    out = workload.merge(docs)
    names = list(dict.fromkeys(n for d in docs if (n := (d.get("host") or {}).get("hostname"))))
    if len(names) > 1:  # lent machines of one kind: the document names each
        out["host"] = {**(out.get("host") or {}), "hostname": ", ".join(names)}
        out["sections_ran_on"] = names
    return out


def machine_kind(host: dict[str, Any] | None) -> dict[str, Any]:
    """What makes two machines' seconds comparable: CPU, its count, memory, kernel, GPUs and
    gpufio's version; not the hostname, as lent machines of one kind differ in it."""
    h = host or {}
    return {k: h.get(k) for k in ("cpu", "cpus", "memory_bytes", "kernel", "gpus",
                                  "gpufio_version")}


def same_kind(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Machine kinds (``machine_kind``) alike: memory within 2% (what a kernel reserves
    varies), GPUs compared where both runs name them (a section of CPU jobs names none)."""
    ma, mb = a["memory_bytes"], b["memory_bytes"]
    if (ma is None) != (mb is None) or (ma and abs(ma - mb) > 0.02 * max(ma, mb)):
        return False
    if a["gpus"] is not None and b["gpus"] is not None and a["gpus"] != b["gpus"]:
        return False
    return all(a[k] == b[k] for k in ("cpu", "cpus", "kernel", "gpufio_version"))
