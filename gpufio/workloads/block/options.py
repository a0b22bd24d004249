"""The block workload's keys: those of a job's I/O run (``JOB_OPTIONS``: its direction,
phases, syncs, checks and reporting), checked together and settled (``settle``), and its
own typed keys (the rate cap, ``BlockSettings``).

The I/O run's keys are core/job.Job's fields beyond the common keys, which the engines and
the run read, so every job carries them, at their defaults where its workload does not use
them; the loader refuses one that a job of another workload gives (``Workload.job_keys``).
"""

from __future__ import annotations

from typing import Any

from gpufio.core import rate
from gpufio.core.errors import BadInput
from gpufio.core.job import RW_MODES
from gpufio.core.offsets import Distribution
from gpufio.core.options import Option, settings_class
from gpufio.core.stats import PERCENTILES
from gpufio.engines import all_engines

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
    Option("allow_unbacked", "bool", False, "read a target whose range has holes or "
           "unwritten (fallocated) extents, whose reads return zeros without reaching the "
           "drive (the result says so)"),
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
    Option("invalidate", "bool", True, "drop the targets' pages from the page cache before "
           "a buffered (direct = false) job runs, so its reads reach storage: posix_fadvise "
           "DONTNEED on files, the buffer cache flushed (BLKFLSBUF) on block devices, as fio's "
           "invalidate"),
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


def settle(values: dict[str, Any], raw: dict[str, Any], where: str) -> None:
    """Check one job's I/O-run keys together, beside the common keys they refer to, and
    settle them in place: the offset distribution parsed, a replayed iolog's targets, block
    size and direction taken, rwmixwrite folded into rwmixread."""
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
    if values["time_based"] and values["runtime"] is None:
        raise BadInput(f"{where}key 'time_based': needs a runtime")
    _check_writes(values, raw, where)


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


# a block job's own keys, typed (its workload_settings)
BlockSettings = settings_class("BlockSettings", rate.OPTIONS, __name__)


def check(where: str, engine: str, values: Any) -> None:
    """A rate cap needs an engine whose host loop spaces the I/Os."""
    if values.rate_iops and not all_engines()[engine].paced:
        raise BadInput(f"{where}key 'rate_iops': engine '{engine}' issues its I/Os from the "
                       "GPU, where no rate cap applies; use a host-driven engine")
    if values.rate_process != "linear" and not values.rate_iops:
        raise BadInput(f"{where}key 'rate_process': needs a rate_iops to space")
