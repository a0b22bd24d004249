"""The block workload: fio's I/O benchmark over the engines. Its keys (options), the run of a
profile (driver: repeats, MPI ranks; runner: limits, phases, the jobs in turn over run/),
its fio-shaped result document (document), live view (live) and the merge of MPI ranks'
documents (merge) live here. Registered as workload 'block' here."""

from gpufio.core import rate
from gpufio.core import targets as tg
from gpufio.results.load import METRICS
from gpufio.workloads import RunKeys, Workload, register
from gpufio.workloads.block import document, driver
from gpufio.workloads.block.options import JOB_OPTIONS, BlockSettings, check, settle

register(Workload(
    name="block", summary="the I/O benchmark", options=rate.OPTIONS, settings=BlockSettings,
    check=check,
    formats=document.FORMATS, run=driver.run, render=document.render,
    problems=document.problems, targets=driver.targets,
    scratch=tg.SCRATCH_NAMES.pattern, metrics=tuple(METRICS.values()),
    job_keys=None,  # the I/O run's keys are block's own
    run_keys=RunKeys(JOB_OPTIONS, settle)))
