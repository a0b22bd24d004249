"""Job profiles: TOML with [global] defaults, [[job]] entries and a [sweep] cross product.

The keys every workload uses (``COMMON_OPTIONS``) are here; a job's I/O-run keys (rw,
numjobs, runtime ...) and each workload's own keys come from the workload registry, an
engine's from the engine registry. Key names and meanings follow fio wherever fio has the
key. Every value is validated here or by the owner of its key, before any target is
touched, and every error names the file, the job and the key, with a suggestion when the
key looks like a typo of a real one.
"""

from __future__ import annotations

import difflib
import itertools
import os
import tomllib
from dataclasses import replace
from typing import Any

from gpufio.core.errors import BadInput, reading
from gpufio.core.job import Job, Profile
from gpufio.core.offsets import DEFAULT_SEED
from gpufio.core.options import Option
from gpufio.engines import DEFAULT_ENGINE, all_engines, settle
from gpufio.workloads import DEFAULT_WORKLOAD, all_workloads, run_keys
from gpufio.workloads import NAMES as WORKLOADS

# the keys every workload uses
COMMON_OPTIONS: tuple[Option, ...] = (
    Option("name", "str", None, "job name (default: the profile's file name, then job index)"),
    Option("engine", "str", DEFAULT_ENGINE, "data path; see 'gpufio engines'"),
    Option("workload", "str", DEFAULT_WORKLOAD, "what the job does: "
           + ", ".join(f"'{n}'" for n in WORKLOADS) + " (docs/reference/workloads.md)",
           choices=WORKLOADS),
    Option("bs", "size", 4096, "block size of each I/O", minimum=512),
    Option("direct", "bool", True, "O_DIRECT: bypass the page cache"),
    Option("iodepth", "int", 1, "I/Os in flight per worker (engines with a queue)", minimum=1),
    Option("targets", "strlist", (), "the SSD list: files or block devices (default: a file "
           "gpufio creates in 'directory')"),
    Option("directory", "str", None, "where gpufio creates target files when no targets are "
           "given (default: $GPUFIO_SCRATCH or ~/.cache/gpufio)"),
    Option("randseed", "int", DEFAULT_SEED, "seed of the offset streams and of created files", minimum=0),
    Option("gpu", "int", 0, "GPU index for GPU engines", minimum=0),
    Option("gpus", "intlist", (), "GPU indexes for GPU engines, given to the job's workers "
           "round-robin (overrides 'gpu')"),
    # every workload lays out files (targets, feature tables, checkpoint shards)
    Option("allow_large_layout", "bool", False, "lay out files that take more than 10% of "
           "their filesystem's free space without asking (as --yes does)"),
)
GLOBAL_ONLY: tuple[Option, ...] = (
    Option("concurrent", "bool", False, "run all jobs at once and report a group total"),
)
# how a concurrent profile's jobs group, as fio's: keys of the profile's shape, not of a job
GROUPING: tuple[Option, ...] = (
    Option("stonewall", "bool", False, "with concurrent = true: this job and those after it "
           "start once the jobs before it have finished, in a new reporting group (fio's "
           "stonewall, wait_for_previous)"),
    Option("new_group", "bool", False, "with concurrent = true: this job starts a new "
           "reporting group, with a group total of its own (fio's new_group)"),
)
_GROUPING = {o.name: o for o in GROUPING}
_COMMON = {o.name: o for o in COMMON_OPTIONS}


def _run_options() -> dict[str, Option]:
    """The keys of a job's I/O run (rw, numjobs, runtime ...): its default workload's."""
    return {o.name: o for o in run_keys().options}


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
    return list(_COMMON) + list(_run_options()) + list(_workload_keys()) + sorted(
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
    run = run_keys()
    run_opts = {o.name: o for o in run.options}
    for key, value in raw.items():
        if key in run_opts and used is not None and key not in used:
            users = [n for n, w in all_workloads().items()
                     if w.job_keys is None or key in w.job_keys]
            raise BadInput(f"{where}key '{key}' does nothing in a job of workload "
                           f"'{workload.name}' (it is a key of {' and '.join(users)} jobs)")
        if key in _COMMON:
            values[key] = _COMMON[key].convert(value, where)
        elif key in run_opts:
            values[key] = run_opts[key].convert(value, where)
        elif key in mine:  # two workloads may share a key name, each with its own meaning
            given[key] = mine[key].convert(value, where)
        elif key in own:
            extra[key] = own[key].convert(value, where)
        else:  # the other workloads and engines load only to say what is wrong
            raise _misplaced_key(key, where, engine_name)
    for opt in COMMON_OPTIONS + run.options:
        values.setdefault(opt.name, workload.defaults.get(opt.name, opt.default))
    for opt in own.values():
        extra.setdefault(opt.name, opt.default)
    for opt in workload.options:
        given.setdefault(opt.name, opt.default)
    typed = workload.settings(**given)
    workload.check(where, engine_name, typed)
    if values["bs"] % 512:  # a replayed iolog's own length may replace it (run.settle)
        raise BadInput(f"{where}key 'bs': {values['bs']} is not a multiple of 512")
    if any(g < 0 for g in values["gpus"]):
        raise BadInput(f"{where}key 'gpus': GPU indexes cannot be negative, got {raw['gpus']!r}")
    if "targets" in raw and not values["targets"]:
        raise BadInput(f"{where}key 'targets': the list is empty; name files or block devices, "
                       "or leave the key out for a scratch file")
    run.settle(values, raw, where)
    job = settle(Job(**values, engine_options=extra, workload_options=given,
                     workload_settings=typed, options_as_given=dict(raw)))
    engine.check_job(job)
    return job


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
    return "str" in _kinds(key)


def _kinds(key: str) -> set[str]:
    """The kinds of the options named ``key`` (a workload's or an engine's may repeat one)."""
    owners = [_COMMON, _run_options(), _workload_keys(), *_engine_options().values()]
    return {opts[key].kind for opts in owners if key in opts}


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
    return replace(prof, notes=(*notes, *prof.notes)) if notes else prof


def load_fio_args(args: list[str], overrides: dict[str, Any] | None = None) -> Profile:
    """The jobs of fio's command-line options (``--name=x --rw=randread ...``), read as the
    job file they stand for (fio/cmdline)."""
    from gpufio.fio.cmdline import SOURCE, parse_args

    data, notes = parse_args(args)
    prof = from_dict(data, SOURCE, overrides or {})
    return replace(prof, notes=(*notes, *prof.notes))


def _fio_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``overrides`` with fio's option names (filename, ioengine, readwrite ...) as gpufio's
    keys, read as a job file's [global] lines are, and the notes of that reading."""
    # fio's flags are 1 and 0 (direct=1)
    overrides = {k: bool(v) if type(v) is int and v in (0, 1) and _kinds(k) == {"bool"} else v
                 for k, v in overrides.items()}
    fio = {k: v for k, v in overrides.items()
           if not _is_known(k) and k != "concurrent" and k not in _GROUPING}
    if not fio:
        return overrides, ()
    from gpufio.fio.cmdline import fio_keys, option_text, translate

    for key in fio:
        if key not in fio_keys():
            raise _unknown_key(key, "--set: ", [*_known_keys(), *fio_keys()])
    keys, notes = translate({k: option_text(v) for k, v in fio.items()}, "--set")
    return {**{k: v for k, v in overrides.items() if k not in fio}, **keys}, tuple(notes)


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
    overrides, notes = _fio_overrides(overrides)
    if "concurrent" in overrides:
        concurrent = GLOBAL_ONLY[0].convert(overrides["concurrent"], "--set ")
    set_values = {k: v for k, v in overrides.items() if k != "concurrent"}
    groups: list[tuple[int, int]] = []
    stem = os.path.splitext(os.path.basename(path))[0]
    combos = _sweep_combinations(sweep, f"{path}: ", set(set_values))
    jobs: list[Job] = []
    for index, job_raw in enumerate(jobs_raw):
        base = {**glob, **job_raw, **set_values}
        default_name = stem if len(jobs_raw) == 1 else f"{stem}.{index}"
        base_name = str(base.get("name") or default_name)
        shape = {k: o.convert(base.pop(k, False), f"{path}: job '{base_name}': ")
                 for k, o in _GROUPING.items()}
        for n, combo in enumerate(combos):
            first = n == 0  # a job's sweep runs as one group
            groups.append(_group(groups, concurrent, first and shape["stonewall"],
                                 first and shape["new_group"]))
            raw = {**base, **combo}
            label = ",".join(f"{k}={v}" for k, v in combo.items())
            raw["name"] = f"{base_name}[{label}]" if label else base_name
            jobs.append(_build_job(raw, f"{path}: job '{raw['name']}': "))
    known = {m.name: m for name in dict.fromkeys(j.workload for j in jobs)
             for m in all_workloads()[name].metrics}
    return Profile(path=path, jobs=jobs, concurrent=concurrent,
                   limits=_check_limits(data.get("check", {}), path, known),
                   groups=tuple(groups), notes=notes)


def select(prof: Profile, sections: list[str]) -> Profile:
    """Only the jobs ``sections`` name, as fio's --section runs only the sections named:
    a job's name, or its name before a sweep's ``[...]`` (all its sweep points); in the
    profile's order, each keeping its groups. BadInput for a name that matches no job."""
    if not sections:
        return prof
    bases = [j.name.split("[", 1)[0] for j in prof.jobs]
    for s in sections:
        if s not in bases and not any(j.name == s for j in prof.jobs):
            raise BadInput(f"--section {s!r}: {prof.path} has no job of that name "
                           f"(its jobs: {', '.join(dict.fromkeys(bases))})")
    keep = [i for i, (j, b) in enumerate(zip(prof.jobs, bases))
            if j.name in sections or b in sections]
    groups = ()
    if prof.groups:  # numbered from 0 among the groups that run, as fio numbers them
        runs = {g: n for n, g in enumerate(dict.fromkeys(prof.groups[i][0] for i in keep))}
        reports = {g: n for n, g in enumerate(dict.fromkeys(prof.groups[i][1] for i in keep))}
        groups = tuple((runs[prof.groups[i][0]], reports[prof.groups[i][1]]) for i in keep)
    return replace(prof, jobs=[prof.jobs[i] for i in keep], groups=groups)


def _group(before: list[tuple[int, int]], concurrent: bool, stonewall: bool,
           new_group: bool) -> tuple[int, int]:
    """The next job's (run group, reporting group): a job of its own unless concurrent; with
    concurrent, the last job's groups, a new run group and reporting group after a
    stonewall, a new reporting group after new_group, as fio numbers them."""
    if not before:
        return (0, 0)
    run, report = before[-1]
    if not concurrent:
        return (run + 1, report + 1)
    return (run + stonewall, report + (stonewall or new_group))


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
