"""fio's options given on gpufio's command line (``gpufio run --name=x --rw=randread ...``)
and in ``--set``, read by the job-file reader so fio's names map onto gpufio's in one place.

As fio's command line: options before the first ``--name`` are the [global] section's, each
``--name=JOB`` starts a job whose options follow it. The options become job-file lines in
memory (``key=value``, or a bare ``key`` for a flag) and go through fio/jobfile.parse, so a
command-line job and a job file with the same lines run the same jobs.
"""

from __future__ import annotations

import re
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.fio import jobfile

# what a command-line job's errors and result name as its source
SOURCE = "command line"
# what starts a comment in a job-file line: a value holding one would be cut there
_COMMENT = re.compile(r"[#;\n]")
_LINE = re.compile(r"line \d+ \[")


# fio's options that jobfile reads itself (LAYOUT) and that set one gpufio key as written
_LAYOUT_NAMES = {"bs": "bs", "blocksize": "bs", "size": "size", "filesize": "size",
                 "offset": "offset", "io_size": "io_size", "io_limit": "io_size",
                 "numjobs": "numjobs", "directory": "directory", "verify": "verify"}
# what else --set takes by fio's name: the files, the engine, buffered (direct's negation)
_SETS = {**_LAYOUT_NAMES, "filename": "targets", "ioengine": "engine", "cuda_io": "engine",
         "buffered": "direct"}


def _line(token: str) -> tuple[str, str]:
    """One ``--key=value`` (or ``--flag``) as its key and job-file line."""
    if not token.startswith("--") or len(token) == 2:
        raise BadInput(f"{SOURCE}: {token!r}: fio's options are given as --key=value "
                       "(a profile file goes first, alone)")
    key, sep, value = token[2:].partition("=")
    if _COMMENT.search(value):
        raise BadInput(f"{SOURCE}: {token}: a value cannot hold '#', ';' or a newline")
    return key, f"{key}={value}" if sep else key


def job_text(args: list[str]) -> str:
    """fio's command-line options as the job file they stand for."""
    sections: list[list[str]] = [["[global]"]]
    for token in args:
        key, line = _line(token)
        if key == "name":
            name = line.partition("=")[2]
            if not name or "]" in name:
                raise BadInput(f"{SOURCE}: {token}: a job needs a name without ']'")
            sections.append([f"[{name}]"])
        else:
            sections[-1].append(line)
    if len(sections) == 1:
        raise BadInput(f"{SOURCE}: no job: --name=JOB starts one, as in fio (the options "
                       "before the first --name apply to every job)")
    return "\n".join(line for section in sections for line in section) + "\n"


def _reworded(e: BadInput, what: str) -> BadInput:
    """The job-file reader's error for options that were never a file's lines."""
    text = str(e).replace("fio job file gpufio cannot run as written", f"{what} gpufio "
                          "cannot run")
    return BadInput(_LINE.sub("[", text))


def parse_args(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A command line's fio options as the profile dict and notes jobfile.parse gives."""
    try:
        return jobfile.parse(job_text(args), SOURCE)
    except BadInput as e:
        raise _reworded(e, "fio options") from None


def key_names() -> dict[str, str]:
    """fio's name -> the gpufio key the job-file reader sets from it, for the options that
    pass key by key (the files, ``filename``, and the engine, ``ioengine``, aside): what
    fio's results read back (json_in) and fio-json writes (json_out) name the same way."""
    return {**{fio: ours for fio, ours in jobfile.KEYS.items() if ours != "targets"},
            **_LAYOUT_NAMES}


def fio_keys() -> list[str]:
    """fio's options that the job-file reader knows of (maps, notes or refuses with a hint)."""
    return list(dict.fromkeys([*jobfile.KEYS, *jobfile.LAYOUT, *jobfile.ACCEPTED,
                               *jobfile.EQUIVALENTS, *jobfile.REPORTING_ONLY]))


def option_text(value: Any) -> str:
    """A value as fio writes an option: a flag 1 or 0, files ':'-joined (a ':' escaped)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ":".join(str(v).replace(":", "\\:") for v in value)
    return str(value)


def translate(options: dict[str, str], where: str) -> tuple[dict[str, Any], list[str]]:
    """fio's ``key=value`` options (``--set filename=/dev/x``) as gpufio's keys and values,
    with the notes of their mapping (an engine that runs as another). Read as the [global]
    lines of a one-job file; only the keys those options set are kept, not fio's defaults."""
    if any(_COMMENT.search(v) for v in options.values()):
        raise BadInput(f"{where}: a fio option's value cannot hold '#', ';' or a newline")
    shaping = [k for k in options if k in jobfile.LAYOUT and k not in _SETS]
    if shaping:
        raise BadInput(f"{where}: fio option '{shaping[0]}' shapes a fio job file's files or "
                       "groups; in a profile, list the files in targets and use its own keys")
    text = "[global]\n" + "".join(f"{key}={value}\n" for key, value in options.items())
    try:
        data, notes = jobfile.parse(text + "[set]\n", where)
    except BadInput as e:
        raise _reworded(e, "fio options") from None
    job = data["job"][0]
    names = {**key_names(), **_SETS}
    return {names[k]: job[names[k]] for k in options if names.get(k) in job}, notes
