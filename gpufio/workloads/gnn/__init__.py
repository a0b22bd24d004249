"""The GNN feature-aggregation workload (issue 6): an IGB-shaped graph and feature table, a
neighbour sampler, a GraphSAGE model, and stage timing, written once for NumPy and CuPy
(``xp``), so the same code runs on the GPU and is tested on the CPU."""
