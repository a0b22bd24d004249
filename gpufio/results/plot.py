"""``gpufio plot``: pictures of result files, drawn headless with matplotlib (extra 'plot').

One figure with four panels: IOPS and bandwidth over time per job (from the interval
samples), latency against percentile per job (fio's percentile list, on a "nines" axis so
that p99, p99.9 and p99.99 are apart), and grouped IOPS bars, one group per job and one bar
per result file, for engine or drive comparisons. A result timed in stages (a GNN
iteration's sampling, aggregation, training: the document's ``stages``) is drawn as the
seed article draws it: a bar per job, its stages stacked, in seconds over the timed
iterations, each drive model's "emulated: ..." label under the figure.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gpufio.core.errors import BadInput
from gpufio.core.job import directions
from gpufio.results.load import emulated_labels, headline_iops, stage_seconds

FIGSIZE = (12, 13)
NINES = (50.0, 90.0, 99.0, 99.9, 99.99)


def _nines(p: float) -> float:
    """Percentile on a log-of-the-tail axis: 90 -> 1, 99 -> 2, 99.9 -> 3."""
    return -math.log10(1 - p / 100)
DPI = 100


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise BadInput("plot needs matplotlib: pip install 'gpufio[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(docs: list[dict[str, Any]], labels: list[str], output: str) -> None:
    """Write the figure for ``docs`` to ``output`` (.png or .svg)."""
    if not output.endswith((".png", ".svg")):
        raise BadInput(f"-o {output}: give a .png or .svg file name")
    plt = _matplotlib()
    if any("stages" in d for d in docs):
        _save(_draw_stages(plt, docs, labels), output, plt)
        return
    if any("metric_info" in d for d in docs):
        _save(_draw_headline(plt, docs, labels), output, plt)
        return
    fig, (ax_t, ax_w, ax_p, ax_b) = plt.subplots(4, 1, figsize=FIGSIZE, dpi=DPI)
    multi = len(docs) > 1
    for label, doc in zip(labels, docs):
        for job in doc["jobs"]:
            name = f"{label}: {job['jobname']}" if multi else job["jobname"]
            samples = job.get("samples", [])
            if samples:
                t = [s["t_ms"] / 1000 for s in samples]
                ax_t.plot(t, [s["iops"] for s in samples], marker=".", label=name)
                ax_w.plot(t, [s["bw_bytes"] / 1e6 for s in samples], marker=".", label=name)
            for rw in directions(job):
                pct = job[rw]["lat_ns"]["percentile"]
                points = sorted((float(p), v / 1e3) for p, v in pct.items())
                ax_p.plot([_nines(p) for p, _ in points], [v for _, v in points], marker="o",
                          label=f"{name} ({rw})" if rw == "write" else name)
    ax_t.set(title="IOPS over time", xlabel="seconds into the measured run", ylabel="IOPS")
    ax_w.set(title="bandwidth over time", xlabel="seconds into the measured run",
             ylabel="MB/s")
    ax_p.set(title="latency by percentile", xlabel="percentile", ylabel="latency (us)",
             yscale="log")
    ax_p.set_xticks([_nines(p) for p in NINES], [f"p{p:g}" for p in NINES])
    _bars(ax_b, docs, labels, headline_iops)
    ax_b.set(title="IOPS per job", ylabel="IOPS")
    _finish(fig, (ax_t, ax_w, ax_p, ax_b))
    _save(fig, output, plt)


def _bars(ax: Any, docs: list[dict[str, Any]], labels: list[str],
          value: Callable[[dict[str, Any]], float]) -> None:
    """Grouped bars: a group per job name, a bar per result file."""
    jobs = list(dict.fromkeys(j["jobname"] for d in docs for j in d["jobs"]))
    width = 0.8 / len(docs)
    for i, (label, doc) in enumerate(zip(labels, docs)):
        values = {j["jobname"]: value(j) for j in doc["jobs"]}
        ax.bar([x + i * width for x in range(len(jobs))], [values.get(n, 0) for n in jobs],
               width=width, label=label)
    ax.set_xticks([x + width * (len(docs) - 1) / 2 for x in range(len(jobs))], jobs,
                  rotation=15, ha="right")


def _draw_headline(plt: Any, docs: list[dict[str, Any]], labels: list[str]) -> Any:
    """A workload's results: a bar panel per headline metric its documents name."""
    if not all("metric_info" in d for d in docs):
        raise BadInput("plot: these files mix I/O results with a workload's results; plot "
                       "them apart")
    names = list(dict.fromkeys(n for d in docs for n in d.get("headline", d["metric_info"])))
    fig, axes = plt.subplots(len(names), 1, figsize=(FIGSIZE[0], 4 * len(names)), dpi=DPI,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        unit = next(d["metric_info"][name]["unit"] for d in docs if name in d["metric_info"])
        _bars(ax, docs, labels, lambda j, n=name: j.get("metrics", {}).get(n, 0))
        ax.set(title=f"{name} per job", ylabel=unit)
    _finish(fig, axes[:, 0])
    return fig


def _draw_stages(plt: Any, docs: list[dict[str, Any]], labels: list[str]) -> Any:
    """Results timed in stages: a bar per job (per file and job), its stages stacked."""
    if not all("stages" in d for d in docs) or len({tuple(d["stages"]) for d in docs}) > 1:
        raise BadInput("plot: these files mix results timed in stages with others; plot "
                       "them apart")
    stages = docs[0]["stages"]
    multi = len(docs) > 1
    jobs = [(f"{label}: {j['jobname']}" if multi else j["jobname"], j)
            for label, d in zip(labels, docs) for j in d["jobs"]]
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], 6), dpi=DPI)
    bottom = [0.0] * len(jobs)
    for st in stages:
        secs = [stage_seconds(j, stages)[st] for _, j in jobs]
        ax.bar(range(len(jobs)), secs, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, secs)]
    ax.set_xticks(range(len(jobs)), [name for name, _ in jobs], rotation=30, ha="right")
    ax.set(title="time per stage over the timed iterations", ylabel="seconds")
    emulated = emulated_labels(j for _, j in jobs)
    if emulated:  # beside the numbers, as a compat cuFile run says compat
        fig.text(0.01, 0.005, "\n".join(emulated), fontsize="small")
    _finish(fig, [ax])
    if emulated:
        fig.subplots_adjust(bottom=0.25 + 0.03 * len(emulated))
    return fig


def _finish(fig: Any, axes: Any) -> None:
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()


def _save(fig: Any, output: str, plt: Any) -> None:
    try:
        fig.savefig(output)
    except OSError as e:
        raise BadInput(f"-o {output}: {e.strerror}") from None
    finally:
        plt.close(fig)
