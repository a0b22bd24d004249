"""``gpufio run job.fio``: read a fio job file as a gpufio profile that runs as fio runs it.

fio's INI dialect: ``[global]`` sections (each one's options apply to the jobs after it) and
one section per job, ``key=value`` or a bare flag, ``#`` and ``;`` comments, ``include FILE``
(relative to the including file), ``${VAR}`` from the environment. Each job is translated key
by key into gpufio's profile keys, then validated exactly like a TOML profile, with fio's
semantics kept:

- the jobs run at once (``concurrent``) until a ``stonewall`` / ``wait_for_previous``, and
  ``new_group`` starts a reporting group (profile keys of the same names);
- each job's files are named and placed as fio names them (``filename``, ``directory``,
  ``nrfiles``, ``filename_format``, else ``jobname.jobnum.filenum``), ``size`` divided among
  them; ``numjobs`` clones are jobs of their own, each on its own files unless ``filename``
  names shared ones, as fio reports them;
- fio's defaults where gpufio's differ (``rw=read``, buffered I/O, the ``psync`` engine),
  and fio's size units (``k`` = 1024, ``KiB`` = 1000, unless ``kb_base=1000``).

fio's engine names come from each engine's ``fio_engines`` table, so this module names none.
Options that only change fio's own reporting, and ``verify=md5`` and its kind (run as
gpufio's pattern verify), are accepted with a note. Everything that cannot be run as fio
would run it is listed in one error, with line numbers and gpufio's equivalent where it has
one, so a user converting a job file sees everything to change at once.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from gpufio.core.errors import BadInput
from gpufio.core.offsets import DEFAULT_SEED
from gpufio.engines import DEFAULT_ENGINE, all_engines

# fio key -> gpufio key, for keys whose value passes as written; a bare flag (no '=') means 1
KEYS = {
    "name": "name", "rw": "rw", "readwrite": "rw", "direct": "direct", "iodepth": "iodepth",
    "runtime": "runtime", "timeout": "runtime", "ramp_time": "ramp_time",
    "time_based": "time_based", "file_service_type": "file_service",
    "random_distribution": "random_distribution", "randseed": "randseed",
    "sqthread_poll": "sqpoll", "fixedbufs": "fixedbufs", "registerfiles": "registerfiles",
    "hipri": "hipri", "gpu_dev_ids": "gpus", "percentile_list": "percentile_list",
    "rwmixread": "rwmixread", "rwmixwrite": "rwmixwrite", "fsync": "fsync",
    "fdatasync": "fdatasync", "end_fsync": "end_fsync",
    "steadystate": "steadystate", "ss": "steadystate", "steadystate_duration":
    "steadystate_duration", "ss_dur": "steadystate_duration", "steadystate_ramp_time":
    "steadystate_ramp_time", "ss_ramp": "steadystate_ramp_time",
    "rate_iops": "rate_iops", "rate_process": "rate_process", "invalidate": "invalidate",
    "iodepth_batch_submit": "iodepth_batch_submit", "iodepth_batch": "iodepth_batch_submit",
}
# fio keys read by this module itself: the job's files, sizes, clones, grouping, engine
LAYOUT = {"filename", "directory", "nrfiles", "filename_format", "size", "filesize",
          "offset", "io_size", "io_limit", "bs", "blocksize", "numjobs", "kb_base",
          "stonewall", "wait_for_previous", "new_group", "verify", "do_verify", "buffered",
          "ioengine", "cuda_io", "cmd_type", "group_reporting"}
# accepted as they are: gpufio already behaves so (random offsets never repeat within a pass,
# workers may be threads) or they only describe the job
ACCEPTED = {"norandommap", "thread", "description"}
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
_FLAG_KEYS = {"direct", "time_based", "sqthread_poll", "fixedbufs", "registerfiles", "end_fsync",
              "hipri", "invalidate"}
# fio's own defaults where gpufio's differ (the engine is the same): a job file means fio's
FIO_DEFAULTS = {"rw": "read", "direct": False}
# fio's block size where a job gives none
FIO_BS = 4096
# fio's io_uring_cmd command types gpufio sends (nvme, fio's default, is the only one)
CMD_TYPES = {"nvme"}
# fio's verify kinds that write checksummed headers: gpufio checks its own pattern instead
VERIFY_OFF = {"0", "none"}
# what a user can do instead, for fio keys gpufio cannot honour
EQUIVALENTS = {
    "openfiles": "all of a job's files stay open",
    "iodepth_batch_complete_min": "engines reap what has completed",
    "loops": "use runtime with time_based",
    "startdelay": "none", "thinktime": "none", "rate": "rate_iops: rate divided by bs",
    "cpus_allowed": "none (use taskset)", "numa_cpu_nodes": "none (use numactl)",
    "output-format": "gpufio run --format", "write_bw_log": "samples are in the JSON result",
    "write_lat_log": "the latency histogram is in the JSON result",
    "write_iops_log": "samples are in the JSON result", "log_avg_msec": "sample_interval",
    "mem": "engines choose their buffers", "iomem": "engines choose their buffers",
    "randrepeat": "randseed", "random_generator": "none",
    "bsrange": "gpufio runs one block size", "blocksize_range": "gpufio runs one block size",
    "bssplit": "gpufio runs one block size", "offset_increment": "give each job its offset",
    "unique_filename": "none", "create_on_open": "none", "file_append": "none",
}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SIZE = re.compile(r"(0x[0-9a-f]+|\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)(b?)", re.IGNORECASE)
_MULT = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
# fio's keywords of filename_format ($clientuid is empty outside client/server runs)
_FORMAT = re.compile(r"\$(jobname|jobnum|filenum|clientuid)", re.IGNORECASE)
_SPLIT = re.compile(r"(?<!\\):")


@dataclass
class _Problems:
    """Everything wrong with a job file, gathered so one error can list it all."""

    found: list[tuple[int, str]] = field(default_factory=list)
    # the section each line was written in ([global]'s options reach every job after it)
    origin: dict[int, str] = field(default_factory=dict)

    def add(self, lineno: int, section: str, text: str) -> None:
        entry = (lineno, f"line {lineno} [{self.origin.get(lineno, section)}]: {text}")
        if entry not in self.found:  # once, though every clone of a job meets it
            self.found.append(entry)

    def lines(self) -> list[str]:
        """The problems in file order."""
        return [text for _, text in sorted(self.found, key=lambda p: p[0])]


@dataclass
class Section:
    """One job section as fio reads it: its name, its header's line, and every option it
    runs with ([global]'s before its own), each as (line, raw value or None for a flag)."""

    name: str
    lineno: int
    options: dict[str, tuple[int, str | None]]


def _keywords() -> dict[str, str]:
    """fio's keywords in option values: this machine's page size, memory in MiB, CPUs."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"$pagesize": str(os.sysconf("SC_PAGE_SIZE")), "$mb_memory": str(pages >> 20),
            "$ncpus": str(os.cpu_count() or 1)}


def _expand(raw: str, lineno: int, section: str, problems: _Problems) -> str:
    """fio's ${VAR}: the environment's value (an unset variable is a problem, as in fio),
    and its keywords ($pagesize, $mb_memory, $ncpus)."""
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            problems.add(lineno, section, f"${{{m.group(1)}}} is not set in the environment")
            return ""
        return value
    raw = _VAR.sub(sub, raw)
    for keyword, value in _keywords().items():
        raw = raw.replace(keyword, value)
    return raw


def _lines(text: str, path: str, seen: tuple[str, ...] = ()) -> Iterable[tuple[int, str]]:
    """The job file's (line number, line) with comments stripped and ``include FILE``
    lines replaced by that file's (relative to the including file, as fio finds it)."""
    for lineno, line in enumerate(text.splitlines(), 1):
        line = re.split(r"[#;]", line, maxsplit=1)[0].strip()
        if line.startswith("include ") or line.startswith("include\t"):
            name = line.split(None, 1)[1].strip()
            inc = os.path.join(os.path.dirname(path), name) if not os.path.isabs(name) else name
            if os.path.abspath(inc) in seen:
                raise BadInput(f"{path}: line {lineno}: include {name} includes itself")
            try:
                with open(inc, encoding="utf-8") as f:
                    sub = f.read()
            except OSError as e:
                raise BadInput(f"{path}: line {lineno}: include {name}: {e.strerror}") from None
            yield from ((lineno, s) for _, s in _lines(sub, inc, seen + (os.path.abspath(inc),)))
        elif line:
            yield lineno, line


def _read_sections(text: str, path: str, problems: _Problems) -> list[Section]:
    """The job sections of fio job-file text, each with the [global] options before it."""
    glob: dict[str, tuple[int, str | None]] = {}
    sections: list[Section] = []
    current: dict[str, tuple[int, str | None]] | None = None
    name = ""
    for lineno, line in _lines(text, path, (os.path.abspath(path),)):
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip()
            if name == "global":
                current = glob
            else:
                # the header names the job: a name= in [global] names none (as in fio)
                sections.append(Section(name, lineno, {k: v for k, v in glob.items()
                                                       if k != "name"}))
                current = sections[-1].options
            continue
        if current is None:
            raise BadInput(f"{path}: line {lineno}: option before any [section]")
        key, sep, raw = line.partition("=")
        problems.origin.setdefault(lineno, name)
        current[key.strip()] = (lineno, _expand(raw.strip(), lineno, name, problems)
                                if sep else None)
    return sections


def parse(text: str, path: str, sections: Sequence[str] | None = None
          ) -> tuple[dict[str, Any], list[str]]:
    """fio job-file text as the dict a TOML profile would give ({global, job}), and the notes
    to show the user (how fio's engines and options map onto gpufio's). ``sections``: run
    only these jobs, as fio's ``--section``."""
    problems = _Problems()
    found = _read_sections(text, path, problems)
    if sections is not None:
        missing = [s for s in sections if s not in {f.name for f in found}]
        if missing:
            raise BadInput(f"{path}: no job section [{missing[0]}]")
        found = [f for f in found if f.name in sections]
    try:
        data, notes = from_sections(found, problems)
    except BadInput as e:
        raise BadInput(f"{path}: {e}") from None
    if problems.found:
        raise BadInput(f"{path}: fio job file gpufio cannot run as written: "
                       + "; ".join(problems.lines()))
    return data, notes


def from_sections(found: list[Section], problems: _Problems | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """Parsed job sections as the profile dict and its notes: one gpufio job per fio job
    clone, all concurrent, fio's stonewalls and new_groups kept. Problems go into
    ``problems`` (BadInput at once where none is given)."""
    mine = problems if problems is not None else _Problems()
    notes: list[str] = []
    jobs: list[dict[str, Any]] = []
    for section in found:
        jobs.extend(_job(section, mine, notes, thread=len(jobs)))
    if not found:
        raise BadInput("no fio job to run (a job file needs a section besides [global])")
    if problems is None and mine.found:
        raise BadInput("fio job gpufio cannot run as written: " + "; ".join(mine.lines()))
    return {"global": {"concurrent": True}, "job": jobs}, notes


# the values fio takes for a flag (a bare flag is on)
_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


def _value(key: str, raw: str | None) -> Any:
    if raw is None:
        return True if key in _FLAG_KEYS else "1"
    if key in _FLAG_KEYS:
        return _FLAG_WORDS.get(raw.strip().lower(), True)
    if key in ("gpu_dev_ids", "percentile_list"):
        return [v for v in re.split(r"[:,]", raw) if v]
    return raw


def fio_size(raw: str, kb_base: int = 1024) -> int:
    """Bytes from a fio size as a job file writes it: with fio's default kb_base=1024,
    ``4k``/``4kb`` are 4096 and ``4KiB`` is 4000 (fio reads the two the other way round from
    the standard); kb_base=1000 turns that back. ValueError for anything else."""
    m = _SIZE.fullmatch(raw.strip())
    if not m:
        raise ValueError(raw)
    number, unit, iec = m.group(1), m.group(2).lower(), bool(m.group(3))
    base = kb_base if not iec else (1000 if kb_base == 1024 else 1024)
    value = int(number, 16) if number.lower().startswith("0x") else float(number)
    nbytes = value * base ** _MULT[unit]
    if nbytes != int(nbytes):
        raise ValueError(raw)
    return int(nbytes)


def _size(opts: dict[str, tuple[int, str | None]], key: str, section: str,
          problems: _Problems) -> int | None:
    """A size key in bytes, or None where the job does not give it or gives a share of its
    files' size (``_percent``); a problem noted for a range, or for what is no size."""
    if key not in opts or _percent(opts, key) is not None:
        return None
    lineno, raw = opts[key]
    raw = raw or ""
    base_line, base = opts.get("kb_base", (0, "1024"))
    if (base or "1024").strip() not in ("1000", "1024"):
        problems.add(base_line, section, f"kb_base={base}: 1000 or 1024")
        return None
    kb_base = int(base or "1024")
    parts = [p for p in re.split(r"[,:]", raw) if p]
    try:
        values = {fio_size(p, kb_base) for p in parts or [raw]}
    except ValueError:
        ranged = re.fullmatch(r"\s*[\w.]+\s*-\s*[\w.]+\s*", raw) or "," in raw
        problems.add(lineno, section, f"{key}={raw}: " + (
            "gpufio runs one block size (no ranges or read,write pairs that differ)"
            if ranged else "not a size"))
        return None
    if len(values) != 1:
        problems.add(lineno, section, f"{key}={raw}: gpufio runs one block size (no ranges "
                     "or read,write pairs that differ)")
        return None
    return values.pop()


def _percent(opts: dict[str, tuple[int, str | None]], key: str) -> float | None:
    """fio's ``size=N%`` / ``offset=N%``: the share, None for a size in bytes."""
    raw = (opts.get(key, (0, None))[1] or "").strip()
    try:
        return float(raw[:-1]) if raw.endswith("%") else None
    except ValueError:
        return None


def _existing_size(path: str) -> int | None:
    """The size of an existing file or block device, None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        ok = stat.S_ISREG(mode) or stat.S_ISBLK(mode)
        return os.lseek(fd, 0, os.SEEK_END) if ok else None
    finally:
        os.close(fd)


def _shares(job: dict[str, Any], section: Section, problems: _Problems) -> None:
    """fio's ``offset=N%`` and ``size=N%`` of a clone's files, as fio reckons them: the
    offset rounded up to the block size, the size down to it and to what the offset leaves.
    gpufio gives every file one region, so the files must be one size; fio needs them to
    exist, and so does this."""
    pcts = {k: _percent(section.options, k) for k in ("offset", "size")}
    given = [k for k, v in pcts.items() if v is not None]
    if not given:
        return
    key = given[0]
    where = f"{key}={section.options[key][1]}"
    sizes = {_existing_size(p) for p in job.get("targets", [])}
    if not sizes or None in sizes:
        problems.add(section.options[key][0], section.name, f"{where}: a share of the size of "
                     "files that do not exist (fio needs them too)")
        return
    if len(sizes) > 1:
        problems.add(section.options[key][0], section.name, f"{where}: a share of files of "
                     "different sizes is not supported (gpufio gives every file one region)")
        return
    real, bs = sizes.pop(), int(job.get("bs", FIO_BS))
    if pcts["offset"] is not None:
        job["offset"] = -(-int(real * pcts["offset"] / 100) // bs) * bs
    if pcts["size"] is not None:
        share = min(int(real * pcts["size"] / 100), real - job.get("offset", 0))
        job["size"] = share - share % bs


def fio_engine_names() -> dict[str, tuple[str, str]]:
    """fio's ``ioengine`` (or ``ioengine:cuda_io``) -> (gpufio engine, note)."""
    return {fio: (name, note) for name, cls in all_engines().items()
            for fio, note in cls.fio_engines.items()}


def _engine(opts: dict[str, tuple[int, str | None]], section: str, problems: _Problems,
            notes: list[str]) -> str | None:
    """The gpufio engine of a job's ioengine (and cuda_io); gpufio's default, which is fio's
    default, where it names none."""
    if "ioengine" not in opts:
        return DEFAULT_ENGINE
    lineno, ioengine = opts["ioengine"]
    cuda_io = opts.get("cuda_io", (0, ""))[1]
    names = fio_engine_names()
    key = f"{ioengine}:{cuda_io}" if cuda_io else str(ioengine)
    if key not in names:
        known = ", ".join(f"{k.replace(':', ' cuda_io=')} -> {v[0]}" for k, v in names.items())
        problems.add(lineno, section, f"ioengine={key.replace(':', ' cuda_io=')} has no gpufio "
                     f"engine (supported: {known})")
        return None
    name, note = names[key]
    _add(notes, note)
    return name


def _add(notes: list[str], note: str) -> None:
    if note and note not in notes:
        notes.append(note)


def _translate(section: Section, problems: _Problems, notes: list[str]) -> dict[str, Any]:
    """A job's options that pass key by key (its files, sizes and clones aside)."""
    out: dict[str, Any] = {"rw": FIO_DEFAULTS["rw"], "direct": FIO_DEFAULTS["direct"]}
    for key, (lineno, raw) in section.options.items():
        if key in ACCEPTED or key in LAYOUT:
            continue
        if key in REPORTING_ONLY:
            _add(notes, f"{key}={'1' if raw is None else raw} {REPORTING_ONLY[key]}")
        elif key in KEYS:
            if key in _FLAG_KEYS and raw is not None and raw.strip().lower() not in _FLAG_WORDS:
                problems.add(lineno, section.name, f"{key}={raw}: a flag is 0 or 1")
            out[KEYS[key]] = _value(key, raw)
        else:
            problems.add(lineno, section.name, f"{key} is not supported "
                         f"({EQUIVALENTS.get(key, 'no gpufio equivalent')})")
    if "buffered" in section.options and "direct" not in section.options:
        raw = section.options["buffered"][1]
        out["direct"] = not _value("direct", raw)
        _add(notes, f"buffered={'1' if raw is None else raw} runs as "
             f"direct={1 if out['direct'] else 0}")
    engine = _engine(section.options, section.name, problems, notes)
    if engine is not None:
        out["engine"] = engine
    if "cmd_type" in section.options and section.options["cmd_type"][1] not in CMD_TYPES:
        lineno, raw = section.options["cmd_type"]
        problems.add(lineno, section.name, f"cmd_type={raw} is not supported (only cmd_type=nvme)")
    _verify(section, out, problems, notes)
    if str(out["rw"]).startswith("rand") and "norandommap" not in section.options:
        _add(notes, f"rw={out['rw']}: fio's random map reads each block once a pass; gpufio "
             "draws random offsets with replacement, as fio's norandommap")
    return out


def _verify(section: Section, out: dict[str, Any], problems: _Problems,
            notes: list[str]) -> None:
    """fio's verify kinds run as gpufio's pattern verify, with a note: each block gpufio
    writes carries its offset and seed, so a block that lands wrong or at the wrong place
    is caught, as fio's checksums catch it; do_verify=0 turns it off, as in fio."""
    if "verify" not in section.options:
        return
    lineno, raw = section.options["verify"]
    kind = raw or "1"
    on = kind not in VERIFY_OFF and section.options.get("do_verify", (0, "1"))[1] != "0"
    out["verify"] = on
    if on:
        _add(notes, f"verify={kind} runs as gpufio's pattern verify (every block carries its "
             f"offset and seed, checked as it is read; not fio's {kind} headers)")


def _names(section: Section, clone: int, nfiles: int, problems: _Problems) -> list[str]:
    """The files of clone ``clone`` of a job, as fio names and places them."""
    opts = section.options
    jobname = str(opts.get("name", (0, section.name))[1] or section.name)
    directory = opts.get("directory", (0, None))[1]
    dirs = [d.replace("\\:", ":") for d in _SPLIT.split(directory) if d] if directory else []
    for d in dirs:
        if not os.path.isdir(d):
            problems.add(opts["directory"][0], section.name, f"directory={directory}: {d} is "
                         "not a directory (gpufio, like fio, does not create it)")
    if "filename" in opts:
        names = [f.replace("\\:", ":") for f in _SPLIT.split(opts["filename"][1] or "") if f]
    else:
        fmt = opts.get("filename_format", (0, None))[1]
        keys = {"jobname": jobname, "jobnum": str(clone), "clientuid": ""}
        if nfiles == 1 and not fmt and _not_regular(jobname):
            names = [jobname]  # fio runs a job named after a device on that device
        else:
            names = [_FORMAT.sub(lambda m: {**keys, "filenum": str(i)}[m.group(1).lower()], fmt)
                     if fmt else f"{jobname}.{clone}.{i}" for i in range(nfiles)]
    if not dirs:
        return names
    where = dirs[clone % len(dirs)].rstrip("/")
    return [f"{where}/{n.lstrip('/')}" for n in names]


def _not_regular(name: str) -> bool:
    """fio's exists_and_not_regfile: a job named after an existing device or pipe."""
    try:
        return not stat.S_ISREG(os.stat(name).st_mode)
    except OSError:
        return False


def _flag(opts: dict[str, tuple[int, str | None]], key: str) -> bool:
    """Whether a fio flag is on: given bare, or as 1 (true, yes, on)."""
    return key in opts and (opts[key][1] is None
                            or _FLAG_WORDS.get(opts[key][1].strip().lower(), True))


def _job(section: Section, problems: _Problems, notes: list[str],
         thread: int) -> list[dict[str, Any]]:
    """A job section as gpufio jobs: one per clone (numjobs), each with its files, sizes
    and seed (fio seeds each job thread apart)."""
    opts = section.options
    base = _translate(section, problems, notes)
    try:
        numjobs = int(opts.get("numjobs", (0, "1"))[1] or "1")
        nrfiles = int(opts.get("nrfiles", (0, "1"))[1] or "1")
    except ValueError:
        numjobs = nrfiles = 0
    if numjobs < 1 or nrfiles < 1:
        problems.add(section.lineno, section.name, "numjobs and nrfiles take whole numbers "
                     "of at least 1")
        return []
    given = _size(opts, "bs", section.name, problems)
    if given == 0:
        problems.add(opts["bs"][0], section.name, "bs=0: a block needs at least one byte")
    bs = given or _size(opts, "blocksize", section.name, problems)
    size = _size(opts, "size", section.name, problems)
    filesize = _size(opts, "filesize", section.name, problems)
    offset = _size(opts, "offset", section.name, problems)
    io_size = _size(opts, "io_size", section.name, problems) or _size(
        opts, "io_limit", section.name, problems)
    if bs is not None:
        base["bs"] = bs
    if offset is not None:
        base["offset"] = offset
    if "group_reporting" in opts and numjobs > 1:
        _add(notes, "group_reporting: each numjobs clone is reported as a job, with its group's "
             "total beside them")
    jobs = []
    for clone in range(numjobs):
        job = {"name": str(opts.get("name", (0, section.name))[1] or section.name), **base}
        if base.get("engine") is None or all_engines()[base["engine"]].touches_storage:
            job["targets"] = _names(section, clone, nrfiles, problems)
        nfiles = len(job.get("targets", ())) or 1
        if filesize is not None:
            job["size"] = filesize
            if size is not None and io_size is None:
                job["io_size"] = size
        elif size is not None:
            job["size"] = size // nfiles  # fio divides a job's size among its files
        if io_size is not None:
            job["io_size"] = io_size
        _shares(job, section, problems)
        job["randseed"] = int(base.get("randseed", DEFAULT_SEED)) + thread + clone
        if base.get("gpus"):
            k = clone % len(base["gpus"])  # fio hands its GPUs to the job threads in turn
            job["gpus"] = base["gpus"][k:] + base["gpus"][:k]
        if clone == 0:
            job["stonewall"] = _flag(opts, "stonewall") or _flag(opts, "wait_for_previous")
            job["new_group"] = _flag(opts, "new_group")
        jobs.append(job)
    return jobs
