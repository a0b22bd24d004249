"""The GNN feature-aggregation workload: an IGB-shaped graph and feature table, a
neighbour sampler, a GraphSAGE model, and stage timing, written once for NumPy and CuPy
(``xp``), so the same code runs on the GPU and is tested on the CPU. Registered as workload
'gnn' here."""

from gpufio.workloads import Workload, register
from gpufio.workloads.gnn import driver, report
from gpufio.workloads.gnn.options import GNN_DEFAULTS, GNN_OPTIONS, GnnSettings, check

register(Workload(
    name="gnn", summary="GNN training with feature aggregation through the engine",
    options=GNN_OPTIONS, settings=GnnSettings, check=check, formats=report.FORMATS,
    run=driver.run_workload,
    render=report.render, problems=report.problems, targets=driver.targets,
    merge=report.merge,
    scratch=r"gnn-features-.*\.f32|gnn-graph-.*\.npz", defaults=GNN_DEFAULTS))
