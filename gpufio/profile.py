"""Job profiles: TOML with [global] defaults, [[job]] entries and a [sweep] cross product.

Key names and meanings follow fio wherever fio has the key. Every value is validated here,
before any target is touched, and every error names the file, the job and the key, with a
suggestion when the key looks like a typo of a real one.
"""

from __future__ import annotations

import difflib
import itertools
import os
import tomllib
from dataclasses import replace
from typing import Any

from gpufio.core.errors import BadInput, reading
from gpufio.core.job import RW_MODES, Job, Profile
from gpufio.core.offsets import Distribution
from gpufio.core.options import Option
from gpufio.core.stats import PERCENTILES
from gpufio.engines import DEFAULT_ENGINE, all_engines, settle
from gpufio.workloads import DEFAULT_WORKLOAD, all_workloads
from gpufio.workloads import NAMES as WORKLOADS

# the keys every workload uses
COMMON_OPTIONS: tuple[Option, ...] = (
    Option("name", "str", None, "job name (default: the profile's file name, then job index)"),
    Option("engine", "str", DEFAULT_ENGINE, "data path; see 'gpufio engines'"),
    Option("workload", "str", DEFAULT_WORKLOAD, "what the job does: "
           + ", ".join(f"'{n}'" for n in WORKLOADS) + " (see README)", choices=WORKLOADS),
    Option("bs", "size", 4096, "block size of each I/O", minimum=512),
    Option("direct", "bool", True, "O_DIRECT: bypass the page cache"),
    Option("iodepth", "int", 1, "I/Os in flight per worker (engines with a queue)", minimum=1),
    Option("targets", "strlist", (), "the SSD list: files or block devices (default: a file "
           "gpufio creates in 'directory')"),
    Option("directory", "str", None, "where gpufio creates target files when no targets are "
           "given (default: $GPUFIO_SCRATCH or ~/.cache/gpufio)"),
    Option("randseed", "int", 0x89, "seed of the offset streams and of created files", minimum=0),
    Option("gpu", "int", 0, "GPU index for GPU engines", minimum=0),
    Option("gpus", "intlist", (), "GPU indexes for GPU engines, given to the job's workers "
           "round-robin (overrides 'gpu')"),
    # every workload lays out files (targets, feature tables, checkpoint shards)
    Option("allow_large_layout", "bool", False, "lay out files that take more than 10% of "
           "their filesystem's free space without asking (as --yes does)"),
)
# the keys of the I/O run of a job (its direction, phases, syncs, checks, reporting):
# each workload names those it uses (Workload.job_keys; the block workload all of them),
# and a job of another workload that gives one is refused, as an unknown key is
JOB_OPTIONS: tuple[Option, ...] = (
    Option("rw", "str", "randread", "read, randread, write, randwrite, readwrite (or rw) or "
           "randrw, as fio's", choices=RW_MODES, aliases=(("rw", "readwrite"),)),
    Option("rwmixread", "int", 50, "percent of a mixed job's I/Os that read", minimum=0),
    Option("rwmixwrite", "int", None, "percent of a mixed job's I/Os that write (the rest "
           "of rwmixread)", minimum=0),
    Option("fsync", "int", 0, "fsync the target after every N writes (0: never)", minimum=0),
    Option("fdatasync", "int", 0, "fdatasync the target after every N writes (0: never)",
           minimum=0),
    Option("end_fsync", "bool", False, "fsync every target when the writes are done, inside "
           "the measured time"),
    Option("overwrite", "bool", False, "allow writes to an existing file that does not carry "
           "gpufio's pattern (its data is lost)"),
    Option("write_device", "str", None, "the one block device this job may write to, named "
           "again to confirm (its data is lost; gpufio refuses a device holding anything "
           "libblkid recognises: a partition table, filesystem, LVM, RAID, LUKS, bcache, swap)"),
    Option("precondition", "str", "none", "write the whole region sequentially before the "
           "measured phase: once (seq) or twice (seq2)", choices=("none", "seq", "seq2")),
    Option("steadystate", "str", None, "end the job once its IOPS or bandwidth settle, as "
           "fio's: iops:LIMIT, iops_slope:LIMIT, bw:LIMIT or bw_slope:LIMIT (LIMIT absolute "
           "or N% of the mean)"),
    Option("steadystate_duration", "time", 0, "the window steadystate judges (fio's ss_dur)",
           minimum=0),
    Option("steadystate_ramp_time", "time", 0, "measured time before steadystate starts "
           "collecting (fio's ss_ramp)", minimum=0),
    Option("size", "size", None, "bytes of each target the job may touch, from offset "
           "(default: the rest of the target); also the size of files gpufio creates"),
    Option("offset", "size", 0, "first byte of each target the job may touch", minimum=0),
    Option("io_size", "size", None, "bytes each worker reads before it is done (default: size "
           "times the number of targets); ignored when time_based", minimum=1),
    Option("numjobs", "int", 1, "worker threads for this job", minimum=1),
    Option("runtime", "time", None, "measured time limit (e.g. 10s, 500ms, 2m)", minimum=1),
    Option("ramp_time", "time", 0, "run this long before measuring", minimum=0),
    Option("time_based", "bool", False, "run for the whole runtime, wrapping over the region"),
    Option("file_service", "str", "roundrobin", "how I/Os spread over targets",
           choices=("roundrobin", "random"), aliases=(("round-robin", "roundrobin"),)),
    Option("random_distribution", "str", "random", "random, zipf:THETA, pareto:H, normal:SIGMA"),
    Option("gpu_targets", "gpu_targets", "all", "which targets each GPU's workers read: "
           "\"all\", \"nearest\" (the closest by PCIe topology) or {0 = [...], 1 = [...]}"),
    Option("verify", "bool", False, "check every block read against the data pattern"),
    Option("continue_on_error", "bool", False, "keep going after I/O errors (they are counted "
           "either way)"),
    Option("read_iolog", "str", None, "replay this fio iolog (version 2 or 3) instead of "
           "generating offsets: its files are the targets, its one I/O length the block size, "
           "its reads and writes the job's, in its order (fio's read_iolog)"),
    Option("replay_no_stall", "bool", False, "replay an iolog as fast as possible, ignoring a "
           "version 3 log's timestamps (fio's replay_no_stall; gpufio replays no other way)"),
    Option("cpu_accounting", "str", "rusage", "how a block job's CPU is counted: 'rusage' "
           "(gpufio's own processes, with their io_uring kernel threads) or 'cgroup' (a cgroup "
           "of the job's own: every thread that works for it, counted as for any other tool)",
           choices=("rusage", "cgroup")),
    Option("sample_interval", "time", 500_000_000, "interval of the IOPS/bandwidth samples",
           minimum=1_000_000),
    Option("percentile_list", "percentiles", PERCENTILES, "latency percentiles to report, as "
           "fio's (the tables' p50, p99 and p99.9 are always added)"),
)
GLOBAL_ONLY: tuple[Option, ...] = (
    Option("concurrent", "bool", False, "run all jobs at once and report a group total"),
)
_COMMON = {o.name: o for o in COMMON_OPTIONS + JOB_OPTIONS}
_JOB = {o.name for o in JOB_OPTIONS}




def _workload_options() -> dict[str, dict[str, Option]]:
    return {name: {o.name: o for o in w.options} for name, w in all_workloads().items()}


def _workload_keys() -> dict[str, Option]:
    return {k: o for opts in _workload_options().values() for k, o in opts.items()}


def _engine_options() -> dict[str, dict[str, Option]]:
    return {name: {o.name: o for o in cls.options} for name, cls in all_engines().items()}


def _misplaced_key(key: str, where: str, engine_name: str) -> BadInput:
    """The error of a key that neither the common keys, the job's workload nor its engine
    know: whose it is, or the closest known key."""
    workload_keys = _workload_keys()
    if key in workload_keys:
        owner = next(n for n, opts in _workload_options().items() if key in opts)
        return BadInput(f"{where}key '{key}' needs workload = \"{owner}\"")
    engines = _engine_options()
    owners = [e for e, opts in engines.items() if key in opts]
    if owners:
        return BadInput(f"{where}key '{key}' is an option of engine '{owners[0]}', not of "
                        f"'{engine_name}'")
    return _unknown_key(key, where, _known_keys())


def _known_keys() -> list[str]:
    """Every key a job of some workload and engine takes."""
    return list(_COMMON) + list(_workload_keys()) + sorted(
        {k for opts in _engine_options().values() for k in opts})


def _is_known(key: str) -> bool:
    """Whether some job takes ``key`` (a common key needs no workload or engine loaded)."""
    return key in _COMMON or key in _known_keys()


def _unknown_key(key: str, where: str, known: list[str]) -> BadInput:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return BadInput(f"{where}unknown key '{key}'{hint}")


def _build_job(raw: dict[str, Any], where: str) -> Job:
    engine_name = _COMMON["engine"].convert(raw.get("engine", DEFAULT_ENGINE), where)
    if engine_name not in all_engines():
        engines = list(all_engines())
        close = difflib.get_close_matches(engine_name, engines, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise BadInput(f"{where}key 'engine': unknown engine '{engine_name}'{hint}; "
                       f"known: {', '.join(engines)}")
    engine = all_engines()[engine_name]
    own = {o.name: o for o in engine.options}
    workload = all_workloads()[_COMMON["workload"].convert(raw.get("workload", DEFAULT_WORKLOAD),
                                                           where)]
    mine = {o.name: o for o in workload.options}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    given: dict[str, Any] = {}
    used = workload.job_keys
    for key, value in raw.items():
        if key in _JOB and used is not None and key not in used:
            users = [n for n, w in all_workloads().items()
                     if w.job_keys is None or key in w.job_keys]
            raise BadInput(f"{where}key '{key}' does nothing in a job of workload "
                           f"'{workload.name}' (it is a key of {' and '.join(users)} jobs)")
        if key in _COMMON:
            values[key] = _COMMON[key].convert(value, where)
        elif key in mine:  # two workloads may share a key name, each with its own meaning
            given[key] = mine[key].convert(value, where)
        elif key in own:
            extra[key] = own[key].convert(value, where)
        else:  # the other workloads and engines load only to say what is wrong
            raise _misplaced_key(key, where, engine_name)
    for opt in COMMON_OPTIONS + JOB_OPTIONS:
        values.setdefault(opt.name, workload.defaults.get(opt.name, opt.default))
    for opt in own.values():
        extra.setdefault(opt.name, opt.default)
    for opt in workload.options:
        given.setdefault(opt.name, opt.default)
    typed = workload.settings(**given)
    workload.check(where, engine_name, typed)
    values["random_distribution"] = Distribution.parse(
        values["random_distribution"], f"{where}key 'random_distribution'")
    for key in ("size", "io_size"):
        if values[key] is not None and values[key] <= 0:
            raise BadInput(f"{where}key '{key}': must be greater than 0, got {raw[key]!r}")
    if values["verify"] and values["offset"] % 8:
        raise BadInput(f"{where}key 'offset': verify checks 8-byte pattern words, so the offset "
                       f"must be a multiple of 8, got {values['offset']}")
    if values["read_iolog"]:
        _replay(values, raw, where)
    elif values["bs"] % 512:
        raise BadInput(f"{where}key 'bs': {values['bs']} is not a multiple of 512")
    if any(g < 0 for g in values["gpus"]):
        raise BadInput(f"{where}key 'gpus': GPU indexes cannot be negative, got {raw['gpus']!r}")
    if isinstance(values["gpu_targets"], tuple):
        gpus = set(values["gpus"] or (values["gpu"],))
        for gpu, paths in values["gpu_targets"]:
            if gpu not in gpus:
                raise BadInput(f"{where}key 'gpu_targets': GPU {gpu} is not one of the job's "
                               f"GPUs ({', '.join(map(str, sorted(gpus)))})")
            for p in paths:
                if p not in values["targets"]:
                    raise BadInput(f"{where}key 'gpu_targets': {p} (GPU {gpu}) is not one of "
                                   "the job's targets")
        missing = gpus - {g for g, _ in values["gpu_targets"]}
        if missing:
            raise BadInput(f"{where}key 'gpu_targets': GPU {min(missing)} reads no target")
    if "targets" in raw and not values["targets"]:
        raise BadInput(f"{where}key 'targets': the list is empty; name files or block devices, "
                       "or leave the key out for a scratch file")
    if values["time_based"] and values["runtime"] is None:
        raise BadInput(f"{where}key 'time_based': needs a runtime")
    _check_writes(values, raw, where)
    job = settle(Job(**values, engine_options=extra, workload_options=given,
                     workload_settings=typed, options_as_given=dict(raw)))
    engine.check_job(job)
    return job


def _replay(values: dict[str, Any], raw: dict[str, Any], where: str) -> None:
    """A replayed iolog decides the targets, the block size and the direction (keys that
    say otherwise are refused)."""
    from gpufio.core import iolog

    trace = iolog.read(values["read_iolog"])
    if trace.version == 3 and not values["replay_no_stall"]:
        raise BadInput(f"{where}key 'read_iolog': gpufio does not replay a version 3 log's "
                       "timing; set replay_no_stall = true")
    lengths = sorted(set(trace.lens.tolist()))
    if len(lengths) > 1:
        raise BadInput(f"{where}key 'read_iolog': its I/Os have {len(lengths)} lengths "
                       f"({', '.join(map(str, lengths[:4]))}...); gpufio replays one block size")
    rw = ("write" if trace.writes.all() else "readwrite" if trace.writes.any() else "read")
    mine = {"targets": tuple(trace.files), "bs": lengths[0], "rw": rw}
    for key, value in mine.items():
        if key in raw and values[key] != value:
            raise BadInput(f"{where}key '{key}': the iolog {values['read_iolog']} gives "
                           f"{value!r}; leave '{key}' out")
    values.update(mine)
    if rw == "readwrite":
        share = float(trace.writes.mean())
        values["rwmixread"] = round(100 * (1 - share))


def _check_writes(values: dict[str, Any], raw: dict[str, Any], where: str) -> None:
    """Validate the write keys together, folding rwmixwrite into rwmixread."""
    mixwrite = values.pop("rwmixwrite")
    for key, value in (("rwmixread", values["rwmixread"]), ("rwmixwrite", mixwrite)):
        if value is not None and value > 100:
            raise BadInput(f"{where}key '{key}': a percentage, at most 100, got {raw[key]!r}")
    if mixwrite is not None:
        if "rwmixread" in raw and values["rwmixread"] + mixwrite != 100:
            raise BadInput(f"{where}keys 'rwmixread' ({values['rwmixread']}) and 'rwmixwrite' "
                           f"({mixwrite}) must add up to 100")
        values["rwmixread"] = 100 - mixwrite
    if values["rw"] in ("read", "randread", "write", "randwrite"):
        for key in ("rwmixread", "rwmixwrite"):
            if key in raw:
                raise BadInput(f"{where}key '{key}': needs a mixed job (rw = readwrite or "
                               f"randrw), not rw = {values['rw']}")
    writes = values["rw"] not in ("read", "randread")
    for key in ("fsync", "fdatasync", "end_fsync"):
        if values[key] and not writes:
            raise BadInput(f"{where}key '{key}': the job does not write (rw = {values['rw']})")
    if values["fsync"] and values["fdatasync"]:
        raise BadInput(f"{where}keys 'fsync' and 'fdatasync': give one of them")
    if values["steadystate"] is not None:
        from gpufio.core.steady import Criterion

        Criterion.parse(values["steadystate"], f"{where}key 'steadystate'")
        if not values["steadystate_duration"]:
            raise BadInput(f"{where}key 'steadystate': needs a steadystate_duration")
        if values["runtime"] is None:
            raise BadInput(f"{where}key 'steadystate': needs a runtime (the longest the job "
                           "may take to settle)")
    elif values["steadystate_duration"] or values["steadystate_ramp_time"]:
        raise BadInput(f"{where}key 'steadystate_duration': needs a steadystate criterion")


def _sweep_combinations(sweep: dict[str, Any], where: str,
                        fixed: set[str]) -> list[dict[str, Any]]:
    axes = []
    for key, values in sweep.items():
        if not _is_known(key):
            raise _unknown_key(key, f"{where}[sweep]: ", _known_keys())
        if not isinstance(values, list) or not values:
            raise BadInput(f"{where}[sweep] key '{key}': expected a non-empty list of values")
        if key not in fixed:
            axes.append([(key, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def parse_set(items: list[str]) -> dict[str, Any]:
    """--set KEY=VALUE pairs as a dict. A value is read as a TOML value (a list
    ``["/a", "/b"]``, a quoted string, a number, true/false); anything that is not TOML is
    kept as the bare text (``4k``, ``/dev/nvme0n1``, ``/a,/b``), as fio's command line has it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise BadInput(f"--set {item!r}: expected KEY=VALUE")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as e:
            if value.startswith(("[", "{", '"', "'")):
                raise BadInput(f"--set {key}: {value!r} is not a TOML value ({e}); give a list "
                               'as --set \'targets=["/a", "/b"]\' or a bare /a,/b') from None
            parsed = value
        # a number given to a string key is the text as typed (name=1 names a job "1")
        out[key] = value if _is_str_key(key) and not isinstance(parsed, str) else parsed
    return out


def _is_str_key(key: str) -> bool:
    owners = [_COMMON, _workload_keys(), *_engine_options().values()]
    return any(key in opts and opts[key].kind == "str" for opts in owners)


def load(path: str, overrides: dict[str, Any] | None = None) -> Profile:
    """Read, merge and validate a profile; BadInput for anything wrong with it."""
    notes: list[str] = []
    with reading(path, "profile"):
        if path.endswith(".fio"):
            from gpufio.fio.jobfile import parse

            with open(path, encoding="utf-8") as f:
                data, notes = parse(f.read(), path)
        else:
            with open(path, "rb") as f:
                try:
                    data = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    raise BadInput(f"{path}: malformed TOML: {e}") from None
    prof = from_dict(data, path, overrides or {})
    return replace(prof, notes=tuple(notes)) if notes else prof


def from_dict(data: dict[str, Any], path: str, overrides: dict[str, Any]) -> Profile:
    """Build a Profile from parsed TOML; separate from ``load`` so tests need no files."""
    for key in data:
        if key not in ("global", "job", "sweep", "check"):
            raise _unknown_key(key, f"{path}: top level: ", ["global", "job", "sweep", "check"])
    glob = data.get("global", {})
    jobs_raw = data.get("job", [{}])
    sweep = data.get("sweep", {})
    if not isinstance(glob, dict) or not isinstance(sweep, dict):
        raise BadInput(f"{path}: [global] and [sweep] must be tables")
    if not isinstance(jobs_raw, list) or not all(isinstance(j, dict) for j in jobs_raw):
        raise BadInput(f"{path}: jobs must be [[job]] tables")
    glob = dict(glob)
    concurrent = GLOBAL_ONLY[0].convert(glob.pop("concurrent", False), f"{path}: [global] ")
    for key in overrides:
        if not _is_known(key) and key != "concurrent":
            raise _unknown_key(key, "--set: ", _known_keys())
    if "concurrent" in overrides:
        concurrent = GLOBAL_ONLY[0].convert(overrides["concurrent"], "--set ")
    set_values = {k: v for k, v in overrides.items() if k != "concurrent"}
    stem = os.path.splitext(os.path.basename(path))[0]
    combos = _sweep_combinations(sweep, f"{path}: ", set(set_values))
    jobs: list[Job] = []
    for index, job_raw in enumerate(jobs_raw):
        base = {**glob, **job_raw, **set_values}
        default_name = stem if len(jobs_raw) == 1 else f"{stem}.{index}"
        base_name = str(base.get("name") or default_name)
        for combo in combos:
            raw = {**base, **combo}
            label = ",".join(f"{k}={v}" for k, v in combo.items())
            raw["name"] = f"{base_name}[{label}]" if label else base_name
            jobs.append(_build_job(raw, f"{path}: job '{raw['name']}': "))
    known = {m.name: m for name in dict.fromkeys(j.workload for j in jobs)
             for m in all_workloads()[name].metrics}
    return Profile(path=path, jobs=jobs, concurrent=concurrent,
                   limits=_check_limits(data.get("check", {}), path, known))


def _check_limits(table: Any, path: str, known: dict[str, Any]) -> dict[str, float]:
    """The [check] table: max_drop / max_rise sub-tables of metric = "N%", of the metrics
    the profile's workload reports (``known``)."""
    if not isinstance(table, dict):
        raise BadInput(f"{path}: [check] must be a table")
    limits: dict[str, float] = {}
    if not table:  # the gate's module loads for a profile that has limits only
        return limits
    from gpufio.results.check import parse_limits

    for key, value in table.items():
        if key not in ("max_drop", "max_rise"):
            raise _unknown_key(key, f"{path}: [check]: ", ["max_drop", "max_rise"])
        if not isinstance(value, dict):
            raise BadInput(f"{path}: [check] {key} must be a table of metric = \"N%\"")
        limits.update(parse_limits(value, f"{path}: [check] {key}", rising=key == "max_rise",
                                   known=known))
    return limits
