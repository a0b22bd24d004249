"""The GNN workload's data: the cached graph and the feature files on the targets.

Generated feature files are laid out on the job's targets (or files gpufio creates in its
scratch directory) and reused when they already have the right size; existing files given
by ``feature_file`` are checked for size against ``nodes`` before anything runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufio.core import events, space
from gpufio.core import targets as tg
from gpufio.core.errors import BadInput
from gpufio.core.job import Job
from gpufio.core.rows import RowTable
from gpufio.workloads.gnn import features, graph, igb


@dataclass
class Dataset:
    graph: graph.Graph
    paths: list[str]
    layout: features.Layout
    generated: bool  # rows carry the generator's values (else they are checked against the files)
    seeds: int = 0  # mini-batch seeds are drawn from nodes 0..seeds-1 (0: every node)
    type_offsets: dict[str, int] | None = None  # IGBH: each node type's first global id

    @property
    def table(self) -> RowTable:
        """The feature table as the engines' row fetchers read it."""
        return RowTable(tuple(self.paths), self.layout, self.graph.nodes)


def _feature_paths(job: Job) -> list[str]:
    """Where generated features go: a file per target directory (or the given file paths),
    else one file in the scratch directory."""
    g = job.workload_settings
    if job.targets and g.stripes not in (1, len(job.targets)):
        raise BadInput(f"key 'stripes': {g.stripes} files, but the job names "
                       f"{len(job.targets)} targets (a file each)")
    n = len(job.targets) or g.stripes

    k = features.stripe_rows(g.feature_dim * 4, g.stripe)

    def name(i: int) -> str:  # a stripe of n holds other rows than the whole table
        part = (f"-part{i}of{n}" + (f"-stripe{k}" if k > 1 else "")) if n > 1 else ""
        return f"gnn-features-{g.nodes}x{g.feature_dim}-seed{job.randseed}{part}.f32"

    if not job.targets:
        return [os.path.join(job.directory or tg.default_scratch_dir(), name(i))
                for i in range(n)]
    paths = []
    for i, t in enumerate(job.targets):
        if os.path.isdir(t):
            paths.append(os.path.join(t, name(i)))
        elif os.path.exists(t) and not os.path.isfile(t):
            raise BadInput(f"target {t}: gpufio writes generated features only to files or "
                           "directories; use feature_file to read a device as it is")
        else:
            if not os.path.exists(t):
                tg.check_creatable(t)
            paths.append(t)
    return paths


def target_paths(job: Job) -> list[str]:
    """The files the job reads its features from (IGB: the data set's directory), without
    building anything."""
    g = job.workload_settings
    if g.dataset == "igb":
        return [str(Path(g.igb_root).expanduser() / g.igb_size / "processed")]
    if g.feature_file:
        return list(g.feature_file)
    return _feature_paths(job)


def prepare(job: Job, xp: Any = np) -> Dataset:
    """Graph and feature files for ``job``, built or checked; BadInput if they do not fit.
    ``xp`` computes generated feature values (CuPy on a GPU job)."""
    g = job.workload_settings
    nodes, dim = g.nodes, g.feature_dim
    scratch = Path(job.directory or tg.default_scratch_dir())
    if g.dataset == "igb":
        data = igb.load(g.igb_root, g.igb_size, dim, scratch, g.igb_hetero,
                        job.allow_large_layout)
        if g.batch_size > data.seeds:
            raise BadInput(f"key 'batch_size': {g.batch_size} is more than the "
                           f"{data.seeds} papers of IGB {g.igb_size}")
        return Dataset(data.graph, [data.features], features.Layout(1, dim * 4, data.header),
                       generated=False, seeds=data.seeds, type_offsets=data.offsets)
    gr = graph.cached(nodes, g.avg_degree, job.randseed, scratch)
    if g.feature_file:
        paths = list(g.feature_file)
        header = g.feature_offset
        if paths[0].endswith(".npy"):
            header, shape, dtype = features.npy_header(paths[0])
            row = dtype.itemsize * (shape[1] if len(shape) > 1 else 1)
            if row != dim * 4:
                raise BadInput(f"feature file {paths[0]}: rows of {row} bytes, not {dim} "
                               "float32 (key 'feature_dim')")
        layout = features.Layout(len(paths), dim * 4, header,
                                 features.stripe_rows(dim * 4, g.stripe))
        for t, path in enumerate(paths):
            features.check_file(path, layout, t, nodes)
        # gpufio's generated table copied there (onto a device, say) is checked against the
        # generator: an engine that takes the device away leaves no file to read rows from
        ours = all(features.holds_generated(path, t, layout, dim, job.randseed)
                   for t, path in enumerate(paths))
        return Dataset(gr, paths, layout, generated=ours)
    paths = _feature_paths(job)
    layout = features.Layout(len(paths), dim * 4, 0, features.stripe_rows(dim * 4, g.stripe))
    space.check_layouts([(path, layout.bytes_needed(t, nodes)) for t, path in enumerate(paths)
                         if not os.path.exists(path)], job.allow_large_layout)
    for t, path in enumerate(paths):
        if os.path.exists(path):
            if (os.path.getsize(path) == layout.bytes_needed(t, nodes)
                    and features.holds_generated(path, t, layout, dim, job.randseed)):
                continue
            raise BadInput(f"target {path}: exists and does not hold gpufio's generated "
                           "features for these nodes; remove it, or read it with feature_file")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        size = layout.bytes_needed(t, nodes)
        events.emit("layout", f"gpufio: writing generated features to {path} "
                    f"({size / 1e9:.1f} GB, once; later runs reuse the file)")
        try:
            features.write_share(path, t, layout, nodes, dim, job.randseed, xp)
        except BaseException as e:
            # a half-written table has the right size and first row: never leave one behind
            Path(path).unlink(missing_ok=True)
            if isinstance(e, OSError):  # a full or read-only target is the user's to fix
                raise BadInput(f"target {path}: cannot write the generated features: "
                               f"{e.strerror}") from None
            raise
    return Dataset(gr, paths, layout, generated=True)
