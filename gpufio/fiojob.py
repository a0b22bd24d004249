"""``gpufio run job.fio``: read a fio job file as a gpufio profile.

fio's INI dialect ([global] and one section per job, key=value or a bare flag, # and ;
comments) is translated key by key into gpufio's profile keys, then validated exactly like a
TOML profile. Keys gpufio does not support are listed together in one error, so a user
converting a job file sees everything to change at once.
"""

from __future__ import annotations

import re
from typing import Any

from gpufio.errors import BadInput

ENGINES = {"psync": "psync", "io_uring": "uring", "libcufile": "cufile"}
# fio key -> gpufio key; a bare flag (no '=') means 1
KEYS = {
    "name": "name", "ioengine": "engine", "rw": "rw", "readwrite": "rw", "bs": "bs",
    "blocksize": "bs", "size": "size", "offset": "offset", "io_size": "io_size",
    "io_limit": "io_size", "direct": "direct", "iodepth": "iodepth", "numjobs": "numjobs",
    "runtime": "runtime", "timeout": "runtime", "ramp_time": "ramp_time",
    "time_based": "time_based", "filename": "targets", "directory": "directory",
    "file_service_type": "file_service", "random_distribution": "random_distribution",
    "randseed": "randseed", "sqthread_poll": "sqpoll", "fixedbufs": "fixedbufs",
    "registerfiles": "registerfiles", "verify": "verify",
}
# accepted and ignored: they change how fio prints or schedules, not what is measured
IGNORED = {"group_reporting", "thread", "description"}
_FLAG_KEYS = {"direct", "time_based", "sqthread_poll", "fixedbufs", "registerfiles"}


def _value(key: str, raw: str | None, where: str) -> Any:
    if raw is None:
        return True if key in _FLAG_KEYS else "1"
    if key in _FLAG_KEYS:
        return raw.strip() not in ("0", "false")
    if key == "ioengine":
        if raw not in ENGINES:
            raise BadInput(f"{where}: ioengine={raw} has no gpufio engine "
                           f"(supported: {', '.join(f'{k} -> {v}' for k, v in ENGINES.items())})")
        return ENGINES[raw]
    if key == "filename":
        return [p.replace("\\:", ":") for p in re.split(r"(?<!\\):", raw) if p]
    if key == "verify":
        return raw not in ("0", "none")
    return raw


def parse(text: str, path: str) -> dict[str, Any]:
    """fio job-file text as the dict a TOML profile would give ({global, job})."""
    sections: list[tuple[str, dict[str, Any]]] = []
    unsupported: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1].strip(), {}))
            continue
        if not sections:
            raise BadInput(f"{path}: line {lineno}: option before any [section]")
        name, options = sections[-1]
        key, sep, raw = line.partition("=")
        key = key.strip()
        if key in IGNORED:
            continue
        if key not in KEYS:
            unsupported.append(f"{key} (line {lineno}, [{name}])")
            continue
        options[KEYS[key]] = _value(key, raw.strip() if sep else None, f"{path}: line {lineno}")
    if unsupported:
        raise BadInput(f"{path}: fio keys gpufio does not support: {', '.join(unsupported)}")
    glob = next((opts for name, opts in sections if name == "global"), {})
    jobs = [{"name": name, **opts} for name, opts in sections if name != "global"]
    return {"global": glob, "job": jobs or [{}]}
