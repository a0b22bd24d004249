"""Profile keys of the checkpoint workload (``workload = "checkpoint"``), and their checks.

A model state of ``state_size`` bytes in ``shards`` tensors is saved to the targets through
the job's engine, made durable, dropped from the page cache and restored into fresh memory,
``iterations`` times. The I/O size of each piece is the job's ``bs`` (4 MiB unless the
profile says otherwise), its queue ``iodepth``.
"""

from __future__ import annotations

from typing import Any

from gpufio.core.errors import BadInput
from gpufio.core.options import Option, settings_class
from gpufio.core.units import parse_size
from gpufio.engines import all_engines

# A checkpoint moves whole tensors, each one contiguous extent of megabytes to gigabytes:
# the block benchmark's 4 KiB default would cut every one into small I/Os that each pay a
# system call (or a KvikIO task) and a completion, so the movers would spend CPU per byte
# where one large sequential transfer is the work. 4 MiB is KvikIO's own task size, the
# piece most drives and the block layer take in few requests, and small enough that the
# pinned pieces in flight (2 x iodepth x bs for cpu-gpu) stay a modest amount of memory.
CHECKPOINT_DEFAULTS = {"bs": 4 << 20}

CHECKPOINT_OPTIONS: tuple[Option, ...] = (
    Option("state_size", "size", 1 << 30, "bytes of model state saved and restored "
           "(MLPerf Storage checkpoints: 105 GB and up)", minimum=4096),
    Option("shards", "strlist", (), "tensor sizes, repeated in order until state_size is "
           "reached, e.g. [\"256m\", \"8k\"] (default: the tensors of a Llama layer stack, "
           "see docs/tutorial/06-checkpoints.md)"),
    Option("layout", "str", "files", "'files': a file per shard in each target directory; "
           "'single': one file (or block device) per target, shards at 4 KiB-aligned offsets",
           choices=("files", "single")),
    Option("iterations", "int", 3, "save and restore rounds (each saves a new state)",
           minimum=1),
    Option("device", "str", "gpu", "where the state lives: 'gpu', or 'cpu' (host memory: "
           "the CPU engines, and a correctness check on machines without a GPU)",
           choices=("gpu", "cpu")),
    Option("naive", "bool", True, "also time the path users write today on the same state "
           "and files, as the baseline row: each tensor copied to host memory (.get()) and "
           "written with file.write, read back with readinto and copied up (what torch.save "
           "and torch.load do)"),
)
# a job's checkpoint keys, typed (its workload_settings)
CheckpointSettings = settings_class("CheckpointSettings", CHECKPOINT_OPTIONS, __name__)


def shard_sizes(values: Any, where: str = "") -> tuple[int, ...]:
    """The ``shards`` key's sizes in bytes (empty: the default mix); BadInput naming a bad one."""
    sizes = [parse_size(text, f"{where}key 'shards'") for text in values.shards]
    if any(size <= 0 for size in sizes):
        raise BadInput(f"{where}key 'shards': a shard needs at least one byte, got "
                       f"{list(values.shards)}")
    return tuple(sizes)


def _offering(*memories: str) -> str:
    """The engines whose channels move shards in any of ``memories`` ('host', 'gpu')."""
    return ", ".join(n for n, c in all_engines().items()
                     if c.tensor_support() and any(getattr(c.tensor_support(), m)
                                                   for m in memories))


def check(where: str, engine: str, values: Any) -> None:
    """Cross-field checks; where the mover finds shards through an engine comes from its
    ``tensor_support`` (its channel's capability)."""
    support = all_engines()[engine].tensor_support()
    if support is None:
        raise BadInput(f"{where}engine '{engine}' does not save tensors (workload "
                       f"'checkpoint' supports: {_offering('host', 'gpu')})")
    memory = "host" if values.device == "cpu" else "gpu"
    if not getattr(support, memory):
        raise BadInput(f"{where}engine '{engine}': moves shards in "
                       f"{'GPU' if memory == 'host' else 'host'} memory only, so it needs "
                       f"device = \"{'gpu' if memory == 'host' else 'cpu'}\" (device = "
                       f"\"{values.device}\" runs with: {_offering(memory)})")
    shard_sizes(values, where)
