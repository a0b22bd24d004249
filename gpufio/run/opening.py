"""What a job runs on: its target paths (a scratch file, the files it names, or none for an
engine that touches no storage), laid out where missing, opened behind the write guard and
checked, before any worker starts."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gpufio.core import backing, iolog, pattern, space
from gpufio.core import targets as tg
from gpufio.core.errors import BadInput
from gpufio.core.guard import WriteConsent
from gpufio.core.job import Job
from gpufio.engines import all_engines
from gpufio.engines.base import Engine

# threads one worker may use to generate the pattern of its writes in host memory
MAX_FILL_THREADS = 4


def fill_threads(job: Job) -> int:
    """The fill threads of each of the job's workers: the cores the workers leave over,
    at most MAX_FILL_THREADS, at least one. A job that writes also has the compiled fill
    built and loaded here, before its workers fork and its clock starts."""
    if not job.writes and job.precondition == "none":
        return 1
    pattern.native_fill()
    return max(1, min(MAX_FILL_THREADS, (os.cpu_count() or 1) // job.numjobs))


def job_target_paths(job: Job) -> tuple[list[str], int | None]:
    """The job's target paths and the size gpufio creates missing ones with (None: never).
    None at all for a job naming none whose engine touches no storage (null): it runs on an
    offset space of its size, and nothing is laid out. A job sending NVMe commands names
    namespaces, which gpufio never creates: nothing is laid out for it either."""
    if all_engines()[job.engine].generic_targets(job):
        return namespace_paths(job), None
    if job.targets:
        return tg.resolve(job.targets), None if job.size is None else job.offset + job.size
    if job.size is None:
        raise BadInput(f"job '{job.name}': no targets and no size: give targets, or a size "
                       "for gpufio to create a scratch file of")
    if not all_engines()[job.engine].touches_storage:
        return [], None
    return [tg.scratch_path(job.directory, job.randseed)], job.offset + job.size


def namespace_paths(job: Job) -> list[str]:
    """The namespaces a job sending NVMe commands names; BadInput for none, or for a path
    that does not exist (the job's size never creates one)."""
    if not job.targets:
        raise BadInput(f"job '{job.name}': engine '{job.engine}' sends NVMe commands: name "
                       "its namespaces (/dev/nvmeXnY or /dev/ngXnY) in targets")
    paths = tg.resolve(job.targets)
    for path in paths:
        if not os.path.lexists(path):
            raise BadInput(f"target {path}: does not exist; engine '{job.engine}' sends NVMe "
                           "commands to namespaces (/dev/nvmeXnY or /dev/ngXnY), and gpufio "
                           "creates none")
    return paths


def job_targets(job: Job, quiet: bool) -> list[str]:
    """The job's target paths, creating missing files that the job gives a size for."""
    paths, create_size = job_target_paths(job)
    if not paths:
        return paths
    if job.targets:
        if create_size is not None:  # all the files it creates on one filesystem, together
            missing = [p for p in paths if not os.path.lexists(p)]
            for path in missing:
                tg.check_creatable(path)  # where no file may be, that is the error to report
            space.check_layouts([(p, create_size) for p in missing], job.allow_large_layout)
        for path in paths:
            tg.ensure_exists(path, create_size, job.randseed, quiet=quiet,
                             allow_large=job.allow_large_layout)
        return paths
    if job.directory is not None and not os.path.isdir(job.directory):
        raise BadInput(f"job '{job.name}': key 'directory': {job.directory} does not exist "
                       "(as in fio, gpufio does not create it)")
    tg.ensure_scratch(paths[0], create_size or 0, job.randseed, quiet=quiet,
                      allow_large=job.allow_large_layout)
    return paths


def check_trace(job: Job, trace: Any, opened: list[tg.Target]) -> None:
    """BadInput for a replayed log that does not fit its targets: an I/O past a target's
    end, or, with O_DIRECT, one not aligned to 512 bytes."""
    for t, target in enumerate(opened):
        mine = trace.tgt == t
        if not mine.any():
            continue
        ends = trace.offs[mine] + trace.lens[mine]
        if int(ends.max()) > target.size:
            i = int(np.argmax(ends))
            raise BadInput(f"key 'read_iolog': {job.read_iolog}: an I/O at byte "
                           f"{int(trace.offs[mine][i])} of {target.path} runs past its end "
                           f"({target.size} bytes)")
        if job.direct and (trace.offs[mine] % 512).any():
            raise BadInput(f"key 'read_iolog': {job.read_iolog}: offsets of {target.path} that "
                           "are not multiples of 512 cannot be read with O_DIRECT; set direct = "
                           "false")


def judge_targets(job: Job, engine: type[Engine], opened: list[tg.Target],
                  regions: list[tuple[int, int]]) -> None:
    """What each target's region reaches as the job reads it (core/backing): through the
    page cache where the job is buffered (NVMe passthrough never is) or its engine reads
    through it; holes matter unless every read follows the job's own writes (a write-only
    job, or one preconditioned)."""
    reads_existing = job.reads and job.precondition == "none"
    for t, (first, blocks) in zip(opened, regions):
        backing.judge(t, offset=first, length=blocks * job.bs,
                      buffered=engine.buffered(job) and not t.lba,
                      reads_existing=reads_existing, allow_unbacked=job.allow_unbacked)


def open_job(job: Job, quiet: bool) -> tuple[type[Engine], list[tg.Target], list[tuple[int, int]]]:
    engine = all_engines()[job.engine]
    engine.refuse_if_unavailable(job.name)
    opened: list[tg.Target] = []
    try:
        paths = job_targets(job, quiet)
        if not paths:
            opened.append(tg.no_storage(job.offset + job.size))
        for path in paths:
            opened.append(tg.open_target(path, job.direct, WriteConsent.of(job),
                                         generic=engine.generic_targets(job)))
        # a job that only writes verifies by reading back what it wrote; one that reads
        # checks what was there before, so the target must carry the pattern already
        regions = [tg.check_region(t, offset=job.offset, size=job.size, bs=job.bs,
                                   direct=job.direct, need_pattern=job.verify and job.reads)
                   for t in opened]
        if job.read_iolog:
            check_trace(job, iolog.read(job.read_iolog), opened)
        if engine.touches_storage:
            judge_targets(job, engine, opened, regions)
    except BaseException:
        for t in opened:
            t.close()
        raise
    return engine, opened, regions
