"""The checkpoint workload: a model state in GPU (or host) memory saved to the
targets through the job's engine, made durable, dropped from the page cache and restored
into fresh memory, compared where it lives, beside the naive path users write today.
Registered as workload 'checkpoint' here."""

from gpufio.workloads import Workload, register
from gpufio.workloads.checkpoint import driver, report
from gpufio.workloads.checkpoint.options import (
    CHECKPOINT_DEFAULTS,
    CHECKPOINT_OPTIONS,
    CheckpointSettings,
    check,
)

register(Workload(
    name="checkpoint", summary="model state saved from GPU memory and restored, per engine",
    options=CHECKPOINT_OPTIONS, settings=CheckpointSettings, check=check,
    formats=report.FORMATS, run=driver.run_workload,
    render=report.render, problems=report.problems, targets=driver.targets,
    scratch=r"gpufio-ckpt.*\.dat",
    metrics=report.METRICS,
    # it writes existing files and devices where the write guard lets it
    job_keys=frozenset({"overwrite", "write_device"}),
    defaults=CHECKPOINT_DEFAULTS))
