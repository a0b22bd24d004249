"""Every loop that drives the engines' two primitives (core/requests): a Channel a host
thread submits to, or a request queue GPU threads submit to (DeviceQueue). Above the
engines, below the job in flight (run/) and the workloads; no module here names an engine.

- block: ``block`` picks one from (primitive, memory); ``block_host`` (host memory, with
  ``block_compiled`` over io/loops.c), ``block_staged`` (host buffers copied to GPU memory),
  ``block_gpu_slots`` (GPU buffers), ``block_device`` (GPU threads, kernels/gio_bench.cu).
- rows: ``rows`` (the GNN gather over a channel, and the choice), ``rows_device`` (on the
  GPU over a queue, kernels/gnn_gather.cu).
- tensors: ``tensors`` (the checkpoint mover over a channel).
- ``steps``: the one stall rule (StallWatch) and one batch through a channel (move_all).
"""
