"""Profile keys of the GNN workload (``workload = "gnn"``), and their cross-checks.

The experiment's defaults: 1100 iterations of which the first 1000 are warm-up, batch 1024,
fanout [10, 5, 5], 1024 float32 features (4 KiB per node), 19 classes as in IGB.
"""

from __future__ import annotations

from typing import Any

from gpufio.core.errors import BadInput
from gpufio.core.options import Option, settings_class
from gpufio.engines import all_engines

GNN_OPTIONS: tuple[Option, ...] = (
    Option("nodes", "int", 558_000, "nodes of the synthetic graph (IGBH-tiny 558 k, small "
           "3.15 M; more than memory holds for the out-of-core case)", minimum=2),
    Option("avg_degree", "int", 10, "average neighbours per node of the generated graph",
           minimum=1),
    Option("feature_dim", "int", 1024, "float32 features per node (1024 = 4 KiB rows)",
           minimum=1),
    Option("dataset", "str", "generated", "'generated': a synthetic IGB-shaped graph and "
           "feature table; 'igb': the paper nodes of a real IGB download (igb_root, igb_size)",
           choices=("generated", "igb")),
    Option("igb_root", "str", None, "dataset = \"igb\": the directory holding IGB's <size>/"
           "processed/ trees"),
    Option("igb_size", "str", "tiny", "dataset = \"igb\": which IGB data set",
           choices=("tiny", "small", "medium", "large", "full")),
    Option("igb_hetero", "bool", False, "dataset = \"igb\": every node type of IGBH (paper, "
           "author, fos, institute; journal and conference where present) with GIDS's global "
           "ids, their features as one table built once in the scratch directory"),
    Option("feature_file", "strlist", (), "existing feature files (raw rows or .npy), one per "
           "target, instead of generated ones"),
    Option("feature_offset", "size", 0, "bytes before the first row of a raw feature file "
           "(.npy files: read from their header)", minimum=0),
    Option("stripe", "str", "page", "how a table over several targets (or feature files) is "
           "striped: 'page' (BaM's: 4 KiB page i on target i % n), 'row' (row i on target "
           "i % n); the same for rows of 4 KiB or more", choices=("page", "row")),
    Option("stripes", "int", 1, "with no targets: stripe the generated table over this many "
           "files in the scratch directory (each a drive of its own to engine 'bam''s "
           "software controller); with targets, one file per target", minimum=1),
    Option("batch_size", "int", 1024, "seed nodes per mini-batch", minimum=1),
    Option("fanout", "intlist", (10, 5, 5), "neighbours sampled per node, per layer"),
    Option("model", "str", "sage", "what trains on the fetched rows: gpufio's own GraphSAGE "
           "('sage', CuPy or NumPy) or PyG's SAGEConv layers ('pyg-sage', needs torch and "
           "torch_geometric)", choices=("sage", "pyg-sage")),
    Option("hidden", "int", 256, "hidden width of the GraphSAGE layers", minimum=1),
    Option("classes", "int", 19, "output classes (IGB: 19)", minimum=2),
    Option("iterations", "int", 1100, "mini-batches in all", minimum=1),
    Option("warmup", "int", 1000, "mini-batches before the timed ones", minimum=0),
    Option("learning_rate", "str", "0.01", "SGD step size"),
    Option("device", "str", "gpu", "'gpu', or 'cpu' to run the whole pipeline with NumPy "
           "(a correctness check on machines without a GPU; not a measurement of a GPU path)",
           choices=("gpu", "cpu")),
    Option("memory_limit", "size_or_share", None, "run the iterations in a memory cgroup "
           "whose page cache is capped at this many bytes, or at this share of the feature "
           "table (\"25%\"), \"none\": no cap (the process's own new memory comes on top), so "
           "the features cannot all be cached; the feature files' cached pages are dropped "
           "first"),
    Option("mmap_advice", "str", "normal", "engines that map the features: madvise of the "
           "mapping: "
           "'normal' (the kernel's read-around, as DGL's loader leaves it) or 'random' (a fault "
           "reads only its page: the tuned loader)", choices=("normal", "random")),
    Option("cache_size", "size", 0, "engines with a GPU cache: a software cache of feature "
           "rows in GPU memory of this many bytes in front of the reads (CLOCK replacement, as BaM's), "
           "warmed by the warm-up iterations; 0: none", minimum=0),
    Option("verify_rows", "int", 64, "aggregated rows per iteration compared with the "
           "generator's values, or with the feature files' own rows (0: none)", minimum=0),
    Option("gnn_iolog", "str", None, "write every aggregation read (each row asked for: file, "
           "offset, row length, in order, iteration after iteration) to this file as an fio "
           "iolog (version 2), for fio's read_iolog or gpufio's"),
)
# a job's GNN keys, typed (its workload_settings)
GnnSettings = settings_class("GnnSettings", GNN_OPTIONS, __name__)
# the rows' reads in flight: the engine picks (core/rows.row_depth) unless the job says
GNN_DEFAULTS = {"iodepth": None}


def _offering(what: str) -> str:
    """"engine 'x'" or "engines 'x', 'y'": those whose rows offer ``what`` (a RowSupport
    field), for messages."""
    names = [f"'{n}'" for n, c in all_engines().items()
             if c.row_support() and getattr(c.row_support(), what)]
    return ("engine " if len(names) == 1 else "engines ") + ", ".join(names)


def check(where: str, engine: str, gnn: Any) -> None:
    """Cross-field checks that one key alone cannot make; ``where`` names file and job. What
    the rows through an engine offer comes from its ``row_support`` (its channel's
    capability and extras), so this names none."""
    rows = all_engines()[engine].row_support()
    if rows is None:
        fetching = ", ".join(n for n, c in all_engines().items() if c.row_support())
        raise BadInput(f"{where}engine '{engine}' does not aggregate GNN features yet "
                       f"(workload 'gnn' supports: {fetching})")
    if rows.gpu_only and gnn.device == "cpu":
        raise BadInput(f"{where}engine '{engine}': reads into GPU memory, so it needs "
                       "device = \"gpu\"")
    if gnn.mmap_advice != "normal" and not rows.advice:
        raise BadInput(f"{where}key 'mmap_advice': only {_offering('advice')} maps the "
                       f"features, not '{engine}'")
    if gnn.cache_size and not rows.cache:
        raise BadInput(f"{where}key 'cache_size': the GPU cache sits in front of "
                       f"{_offering('cache')}, not '{engine}'")
    if gnn.feature_dim % rows.dim_multiple:
        raise BadInput(f"{where}key 'feature_dim': {engine} copies rows in "
                       f"{rows.dim_multiple * 4}-byte words, so it needs a multiple of "
                       f"{rows.dim_multiple}, got {gnn.feature_dim}")
    if not gnn.fanout:
        raise BadInput(f"{where}key 'fanout': needs at least one layer, e.g. [10, 5, 5]")
    if any(f < 1 for f in gnn.fanout):
        raise BadInput(f"{where}key 'fanout': every layer needs at least 1, got "
                       f"{list(gnn.fanout)}")
    if gnn.warmup >= gnn.iterations:
        raise BadInput(f"{where}key 'warmup': {gnn.warmup} leaves no timed iteration of "
                       f"{gnn.iterations}")
    if gnn.igb_hetero and gnn.dataset != "igb":
        raise BadInput(f"{where}key 'igb_hetero': needs dataset = \"igb\"")
    if gnn.dataset == "igb":
        if not gnn.igb_root:
            raise BadInput(f"{where}key 'igb_root': dataset = \"igb\" needs the directory of "
                           "the IGB download")
        if gnn.feature_file:
            raise BadInput(f"{where}keys 'feature_file' and dataset = \"igb\": give one")
        return  # the nodes are the data's: batch_size is checked against them when loaded
    if gnn.batch_size > gnn.nodes:
        raise BadInput(f"{where}key 'batch_size': {gnn.batch_size} is more than the "
                       f"{gnn.nodes} nodes")
    try:
        if float(gnn.learning_rate) <= 0:
            raise ValueError
    except ValueError:
        raise BadInput(f"{where}key 'learning_rate': expected a positive number, got "
                       f"{gnn.learning_rate!r}") from None
