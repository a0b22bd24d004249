"""``gpufio run job.fio``: read a fio job file as a gpufio profile.

fio's INI dialect ([global] and one section per job, key=value or a bare flag, # and ;
comments, ``${VAR}`` from the environment) is translated key by key into gpufio's profile
keys, then validated exactly like a TOML profile. fio's engine names come from each engine's
``fio_engines`` table, so this module names none. ``directory`` and ``filename`` join as in
fio (the directory must exist); options that only change fio's own reporting, or that are a
gpufio flag negated (``buffered``), are accepted with a note. Everything that cannot be honoured is
listed in one error, with line numbers and gpufio's equivalent where it has one, so a user
converting a job file sees everything to change at once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.engines import all_engines

# fio key -> gpufio key; a bare flag (no '=') means 1
KEYS = {
    "name": "name", "rw": "rw", "readwrite": "rw", "bs": "bs",
    "blocksize": "bs", "size": "size", "filesize": "size", "offset": "offset",
    "io_size": "io_size", "io_limit": "io_size", "direct": "direct", "iodepth": "iodepth",
    "numjobs": "numjobs", "runtime": "runtime", "timeout": "runtime", "ramp_time": "ramp_time",
    "time_based": "time_based", "filename": "targets", "directory": "directory",
    "file_service_type": "file_service", "random_distribution": "random_distribution",
    "randseed": "randseed", "sqthread_poll": "sqpoll", "fixedbufs": "fixedbufs",
    "registerfiles": "registerfiles", "hipri": "hipri", "verify": "verify", "gpu_dev_ids": "gpus",
    "percentile_list": "percentile_list", "rwmixread": "rwmixread", "rwmixwrite": "rwmixwrite",
    "fsync": "fsync", "fdatasync": "fdatasync", "end_fsync": "end_fsync",
    "steadystate": "steadystate", "ss": "steadystate", "steadystate_duration":
    "steadystate_duration", "ss_dur": "steadystate_duration", "steadystate_ramp_time":
    "steadystate_ramp_time", "ss_ramp": "steadystate_ramp_time",
    "rate_iops": "rate_iops", "rate_process": "rate_process",
    "iodepth_batch_submit": "iodepth_batch_submit", "iodepth_batch": "iodepth_batch_submit",
}
# accepted as they are: gpufio already behaves so (random offsets never repeat within a pass,
# jobs run one after another, results are reported per job, workers may be threads) or they
# only describe the job
ACCEPTED = {"norandommap", "stonewall", "wait_for_previous", "group_reporting", "thread",
            "description"}
# fio keys that only change what fio itself measures or reports: accepted, with a note
REPORTING_ONLY = {
    "gtod_reduce": "cuts fio's own clock calls; gpufio times every I/O as always",
    **{k: "chooses the latency fio gives percentiles of; gpufio gives its one latency "
          "(submission to completion) with percentiles"
       for k in ("clat_percentiles", "lat_percentiles", "slat_percentiles")},
    **{k: "turns one of fio's measurements off; gpufio measures as always"
       for k in ("disable_lat", "disable_clat", "disable_slat", "disable_bw_measurement",
                 "disable_bw")},
}
# fio keys that are the negation of a gpufio flag: buffered=0 is direct=1
NEGATED = {"buffered": "direct"}
# keys read together with ioengine
ENGINE_KEYS = {"ioengine", "cuda_io"}
_FLAG_KEYS = {"direct", "time_based", "sqthread_poll", "fixedbufs", "registerfiles", "end_fsync",
              "hipri"}
# fio's io_uring_cmd command types gpufio sends (nvme, fio's default, is the only one)
CMD_TYPES = {"nvme"}
# what a user can do instead, for fio keys gpufio cannot honour
EQUIVALENTS = {
    "nrfiles": "list the files in filename=a:b", "openfiles": "list the files in filename",
    "iodepth_batch_complete_min": "engines reap what has completed",
    "cmd_type": "only cmd_type=nvme", "loops": "use runtime with time_based",
    "startdelay": "none", "thinktime": "none", "rate": "rate_iops: rate divided by bs",
    "cpus_allowed": "none (use taskset)", "numa_cpu_nodes": "none (use numactl)",
    "output-format": "gpufio run --format", "write_bw_log": "samples are in the JSON result",
    "write_lat_log": "the latency histogram is in the JSON result",
    "write_iops_log": "samples are in the JSON result", "log_avg_msec": "sample_interval",
    "mem": "engines choose their buffers", "iomem": "engines choose their buffers",
    "randrepeat": "randseed", "random_generator": "none",
}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class _Problems:
    """Everything wrong with a job file, gathered so one error can list it all."""

    found: list[tuple[int, str]] = field(default_factory=list)

    def add(self, lineno: int, section: str, text: str) -> None:
        self.found.append((lineno, f"line {lineno} [{section}]: {text}"))

    def lines(self) -> list[str]:
        """The problems in file order."""
        return [text for _, text in sorted(self.found, key=lambda p: p[0])]


def _expand(raw: str, lineno: int, section: str, problems: _Problems) -> str:
    """fio's ${VAR}: the environment's value; an unset variable is a problem, as in fio."""
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            problems.add(lineno, section, f"${{{m.group(1)}}} is not set in the environment")
            return ""
        return value
    return _VAR.sub(sub, raw)


def _unescape(name: str) -> str:
    """A file or directory name as fio reads it: ``\\:`` is a colon, a bare one separates."""
    return name.replace("\\:", ":")


def _value(key: str, raw: str | None) -> Any:
    if raw is None:
        return True if key in _FLAG_KEYS else "1"
    if key in _FLAG_KEYS:
        return raw.strip() not in ("0", "false")
    if key == "filename":
        return [_unescape(p) for p in re.split(r"(?<!\\):", raw) if p]
    if key == "directory":
        return _unescape(raw)
    if key in ("gpu_dev_ids", "percentile_list"):
        return [v for v in re.split(r"[:,]", raw) if v]
    if key == "verify":
        return raw not in ("0", "none")
    return raw


def fio_engine_names() -> dict[str, tuple[str, str]]:
    """fio's ``ioengine`` (or ``ioengine:cuda_io``) -> (gpufio engine, note)."""
    return {fio: (name, note) for name, cls in all_engines().items()
            for fio, note in cls.fio_engines.items()}


def _engine(keys: dict[str, tuple[int, str]], section: str, problems: _Problems,
            notes: list[str]) -> str | None:
    """The gpufio engine of a section's ioengine (and cuda_io), or None where it names none."""
    if "ioengine" not in keys:
        return None
    lineno, ioengine = keys["ioengine"]
    cuda_io = keys.get("cuda_io", (0, ""))[1]
    names = fio_engine_names()
    key = f"{ioengine}:{cuda_io}" if cuda_io else ioengine
    if key not in names:
        known = ", ".join(f"{k.replace(':', ' cuda_io=')} -> {v[0]}" for k, v in names.items())
        problems.add(lineno, section, f"ioengine={key.replace(':', ' cuda_io=')} has no gpufio "
                     f"engine (supported: {known})")
        return None
    name, note = names[key]
    if note and note not in notes:
        notes.append(note)
    return name


def _note(key: str, raw: str | None, notes: list[str]) -> None:
    """The note for an option accepted as harmless, once per option."""
    value = "1" if raw is None else raw
    if key in NEGATED:
        flag = _value(NEGATED[key], raw)
        text = f"{key}={value} runs as {NEGATED[key]}={0 if flag else 1}"
    else:
        text = f"{key}={value} {REPORTING_ONLY[key]}"
    if text not in notes:
        notes.append(text)


def _check_directory(value: str, lineno: int, section: str, problems: _Problems) -> None:
    """fio's check of ``directory``: one directory, and it must exist (neither fio nor gpufio
    creates it)."""
    if re.search(r"(?<!\\):", value):
        problems.add(lineno, section, f"directory={value}: several directories are not "
                     "supported (list the files in filename)")
    elif not os.path.isdir(_unescape(value)):
        problems.add(lineno, section, f"directory={value}: {value} is not a directory "
                     "(gpufio, like fio, does not create it)")


def _join_directories(sections: list[tuple[str, dict[str, Any], Any]]) -> None:
    """fio's ``directory`` + ``filename``: each file's path is the directory, '/', and the
    name, even an absolute one, as fio builds it; a job section takes either key from
    [global] where it does not give it."""
    glob = next((opts for name, opts, _ in sections if name == "global"), {})
    joined = []
    for name, options, _ in sections:
        inherited = {} if name == "global" else glob
        directory = options.get("directory", inherited.get("directory"))
        files = options.get("targets", inherited.get("targets"))
        if directory and files and ("directory" in options or "targets" in options):
            joined.append((options, [f"{directory.rstrip('/')}/{f.lstrip('/')}"
                                     for f in files]))
    for options, targets in joined:
        options["targets"] = targets


def parse(text: str, path: str) -> tuple[dict[str, Any], list[str]]:
    """fio job-file text as the dict a TOML profile would give ({global, job}), and the notes
    to show the user (how fio's engines and harmless options map onto gpufio's)."""
    sections: list[tuple[str, dict[str, Any], dict[str, tuple[int, str]]]] = []
    problems = _Problems()
    notes: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1].strip(), {}, {}))
            continue
        if not sections:
            raise BadInput(f"{path}: line {lineno}: option before any [section]")
        name, options, engine_keys = sections[-1]
        key, sep, raw = line.partition("=")
        key = key.strip()
        value = _expand(raw.strip(), lineno, name, problems) if sep else None
        if key in ACCEPTED:
            continue
        if key in REPORTING_ONLY or key in NEGATED:
            _note(key, value, notes)
            if key in NEGATED:
                options[NEGATED[key]] = not _value(NEGATED[key], value)
            continue
        if key == "directory" and value:
            _check_directory(value, lineno, name, problems)
        if key == "cmd_type" and value in CMD_TYPES:
            continue
        if key in ENGINE_KEYS:
            engine_keys[key] = (lineno, value or "")
            continue
        if key not in KEYS:
            hint = EQUIVALENTS.get(key, "no gpufio equivalent")
            problems.add(lineno, name, f"{key} is not supported ({hint})")
            continue
        options[KEYS[key]] = _value(key, value)
    _join_directories(sections)
    glob_keys = next((keys for name, _, keys in sections if name == "global"), {})
    for name, options, engine_keys in sections:
        if name != "global" and not engine_keys:
            continue  # the job runs the [global] engine
        keys = engine_keys if name == "global" else {**glob_keys, **engine_keys}
        engine = _engine(keys, name, problems, notes)
        if engine is not None:
            options["engine"] = engine
    if problems.found:
        raise BadInput(f"{path}: fio job file gpufio cannot run as written: "
                       + "; ".join(problems.lines()))
    glob = next((opts for name, opts, _ in sections if name == "global"), {})
    jobs = [{"name": name, **opts} for name, opts, _ in sections if name != "global"]
    return {"global": glob, "job": jobs or [{}]}, notes
