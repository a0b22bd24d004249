"""Workloads: what a job does with the engines (the block benchmark, GNN training)."""
