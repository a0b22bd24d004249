"""The seed experiment's report from a synthetic GNN result document: the article's table
(seconds per stage, aggregation share, bam over mmap, each drive's IOPS beside its model's
rating), the "emulated: <model>, rates from <source>" label wherever its numbers show, and
`gpufio plot`'s stacked bars of the stages. No run: the document is built here."""

import json

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.io.nvme import drives
from gpufio.workloads.gnn import report

cli = CliRunner()


def _job(name, engine, ms, targets, drive=None, per=(), baseline=False):
    stages = {"sampling_ms": ms[0], "aggregation_ms": ms[1], "training_ms": ms[2],
              "total_ms": sum(ms), "aggregation_share": ms[1] / sum(ms),
              "accelerator_utilisation": ms[2] / sum(ms), "timed_iterations": 100}
    fetch = {"drive": drives.describe(drives.model(drive))} if drive else {}
    return {"jobname": name, "engine": engine, "engine_mode": None, "batch_size": 1024,
            "feature_dim": 1024,
            "targets": [f"/t/{k}" for k in range(targets)], "device": "gpu",
            "fanout": [10, 5, 5], "stages": stages, "baseline": baseline, "fetch": fetch,
            "aggregation": {"rows": 1000, "bytes": 4096000, "iops": sum(per), "bw_bytes": 0.0,
                            "per_target": [{"target": f"/t/{k}", "rows": 500, "iops": v}
                                           for k, v in enumerate(per)]},
            "verify": {"rows_checked": 10, "mismatches": 0}, "error": 0, "memory_limit": None}


@pytest.fixture
def doc():
    jobs = [_job("mmap", "mmap", (5.0, 2000.0, 15.0), 1, per=(20_000.0,), baseline=True),
            _job("bam-gen4-1", "bam", (5.0, 60.0, 15.0), 1, "dapustor-r5101", (1.5e6,)),
            _job("bam-gen5-2", "bam", (5.0, 35.0, 15.0), 2, "micron-9550", (1.2e6, 1.3e6))]
    return report.document(jobs, "profiles/seed-bam.toml", False)


def test_the_articles_table_gives_seconds_shares_speedups_and_rated_iops(doc):
    rows = {r["job"]: r for r in report.article_rows(doc)}
    mmap, gen4, gen5 = rows["mmap"], rows["bam-gen4-1"], rows["bam-gen5-2"]
    # seconds over the 100 timed iterations: ms per iteration x 100 / 1000
    assert (gen4["sampling_s"], gen4["aggregation_s"], gen4["training_s"], gen4["total_s"]) \
        == (0.5, 6.0, 1.5, 8.0)
    assert mmap["total_s"] == 202.0 and mmap["agg_share"] == "99%"
    assert gen4["agg_share"] == "75%" and gen4["vs_mmap"] == "25.25x"
    assert gen4["agg_vs_mmap"] == f"{2000 / 60:.2f}x" and mmap["vs_mmap"] == "1.00x"
    assert gen4["drives"] == "1 x dapustor-r5101" and gen4["rated_IOPS"] == "unpublished"
    assert gen5["drives"] == "2 x micron-9550" and gen5["rated_IOPS"] == "3,300,000"
    assert gen5["IOPS/drive"] == "1,200,000 / 1,300,000"
    assert mmap["drives"] == "1" and mmap["rated_IOPS"] == "" and mmap["of_rated"] == ""
    assert gen5["of_rated"] == f"{100 * 1.3e6 / 3.3e6:.0f}%" and gen4["of_rated"] == ""
    link = drives.model("dapustor-r5101").link_bw
    assert gen4["of_link"] == f"{100 * 1.5e6 * 4096 / link:.0f}%"


def test_the_bound_names_the_rate_a_drive_came_near_else_not_the_drives(doc):
    rows = {r["job"]: r for r in report.article_rows(doc)}
    assert rows["mmap"]["bound"] == ""
    # 1.5 M 4 KiB rows/s on a Gen4 x4 link: under 90% of it, and no other rate published
    link = drives.model("dapustor-r5101").link_bw
    assert rows["bam-gen4-1"]["bound"] == (f"not the drives, at {100 * 1.5e6 * 4096 / link:.0f}"
                                           "% of their link")
    fast = report.document([dict(doc["jobs"][1], fetch={
        **doc["jobs"][1]["fetch"], "queue_pairs": 4}, aggregation={
        **doc["jobs"][1]["aggregation"], "per_target": [{"target": "/t/0", "rows": 1,
                                                         "iops": 0.95 * link / 4096}]})],
        "p", False)
    assert report.article_rows(fast)[0]["bound"] == "the drives' link (95%)"
    slow = dict(doc["jobs"][2], fetch={**doc["jobs"][2]["fetch"], "queue_pairs": 4})
    (row,) = report.article_rows(report.document([slow], "p", False))
    # micron-9550: 1.3 M of its 3.3 M rated IOPS is the nearest of its rates
    assert row["bound"] == ("not the drives: GPU side or controller (4 queue pairs), at "
                            f"{100 * max(1.3e6 / 3.3e6, 1.3e6 * 4096 / 14e9):.0f}% of their "
                            "rated IOPS")


@pytest.mark.parametrize("busy_ns, bound", [
    # 4 threads over 8 s of aggregation (every iteration's): 30.4 s busy of their 32
    (30.4e9, "the controller's 4 poller threads (95% busy)"),
    (9.6e9, "neither the drives nor the pollers (30% busy): the GPU side, at {share}% of "
            "the drives' rated IOPS"),
])
def test_where_the_controller_measured_itself_the_bound_is_its_pollers_or_the_agents(
        doc, busy_ns, bound):
    job = dict(doc["jobs"][2], aggregation_all_ms=8000.0, fetch={
        **doc["jobs"][2]["fetch"], "queue_pairs": 4, "controller_busy_ns": busy_ns,
        "controller_threads": 4})
    (row,) = report.article_rows(report.document([job], "p", False))
    share = f"{100 * max(1.3e6 / 3.3e6, 1.3e6 * 4096 / 14e9):.0f}"
    assert row["bound"] == bound.format(share=share)
    # the drives' own rate still comes first
    near = dict(job, aggregation={**job["aggregation"], "per_target": [
        {"target": "/t/0", "rows": 1, "iops": 3.2e6}]})
    (row,) = report.article_rows(report.document([near], "p", False))
    assert row["bound"] == "the drives' rated IOPS (97%)"


def test_every_table_of_a_modelled_drive_says_emulated_and_its_source(doc):
    text = report.render(doc, "markdown")
    r5101, m9550 = drives.model("dapustor-r5101"), drives.model("micron-9550")
    for m in (r5101, m9550):
        label = f"emulated: {m.key}, rates from {m.source}"
        assert text.count(label) == 2  # the stage table's title and the article table's
    assert "the article's table" in text and "aggregation_s" in text
    plain = dict(doc, jobs=[doc["jobs"][0]])
    assert "emulated" not in report.render(plain, "markdown")
    assert "article" not in report.render(plain, "markdown")


def test_plot_stacks_the_stages_of_each_job_in_seconds(doc, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpufio.results import plot

    fig = plot._draw_stages(plt, [doc], ["seed"])
    ax = fig.axes[0]
    bars = [(round(p.get_x() + p.get_width() / 2), round(p.get_y(), 6), round(p.get_height(), 6))
            for p in ax.patches]
    # job 1 (bam-gen4-1): sampling from 0, aggregation on top of it, training on top of both
    assert [b[1:] for b in bars if b[0] == 1] == [(0.0, 0.5), (0.5, 6.0), (6.5, 1.5)]
    assert [b[1:] for b in bars if b[0] == 0] == [(0.0, 0.5), (0.5, 200.0), (200.5, 1.5)]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mmap", "bam-gen4-1", "bam-gen5-2"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["sampling", "aggregation", "training"]
    assert any("emulated: micron-9550, rates from https://" in t.get_text() for t in fig.texts)
    plt.close(fig)
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "seed.svg"
    res = cli.invoke(app, ["plot", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert "bam-gen5-2" in svg and "aggregation" in svg and "emulated: dapustor-r5101" in svg


def test_plot_refuses_a_gnn_result_without_stages_in_one_line(doc, tmp_path):
    doc["jobs"][0].pop("stages")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    res = cli.invoke(app, ["plot", str(path), "-o", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "lacks 'jobname' or 'stages'" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_gpu_run_s_result_names_its_gpus_and_a_merge_keeps_the_runs_machine(monkeypatch,
                                                                             tmp_path):
    """An H100's seconds are not an H200's: a result of jobs on a GPU names the GPUs; show
    merges sections of one machine (GPUs included), never probing the machine it runs on."""
    monkeypatch.setattr(report, "gpu_facts", lambda: [{"name": "NVIDIA H100 80GB HBM3"}])
    jobs = [_job("mmap", "mmap", (5.0, 2000.0, 15.0), 1, per=(20_000.0,), baseline=True),
            _job("bam-gen4-1", "bam", (5.0, 60.0, 15.0), 1, "dapustor-r5101", (1.5e6,))]
    first = report.document([jobs[0]], "seed.toml", False)
    second = report.document([jobs[1]], "seed.toml", False)
    assert first["host"]["gpus"] == ["NVIDIA H100 80GB HBM3"]
    assert "speedup_vs_mmap" not in second["jobs"][0]

    def probed():
        raise AssertionError("show probed this machine's GPUs")

    monkeypatch.setattr(report, "gpu_facts", probed)
    merged = report.merge([json.loads(json.dumps(d)) for d in (first, second)])
    assert merged["host"] == first["host"] and len(merged["jobs"]) == 2
    assert merged["jobs"][1]["speedup_vs_mmap"]["aggregation"] == pytest.approx(2000.0 / 60.0)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps({**second, "host": {**second["host"], "gpus": ["NVIDIA H200"]}}))
    res = cli.invoke(app, ["show", str(a), str(b)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert f"{b}: ran on another machine" in res.stderr


def test_show_merges_sections_from_two_lent_machines_of_one_kind(monkeypatch, tmp_path):
    """Sections run on two machines alike but for their hostnames (a lent GPU machine is a
    new one after each idle spell) show as one table that names both hosts; another memory
    size is another kind of machine."""
    monkeypatch.setattr(report, "gpu_facts", lambda: [{"name": "NVIDIA H200"}])
    jobs = [_job("mmap", "mmap", (5.0, 2000.0, 15.0), 1, per=(20_000.0,), baseline=True),
            _job("bam-gen4-1", "bam", (5.0, 60.0, 15.0), 1, "dapustor-r5101", (1.5e6,))]
    first = report.document([jobs[0]], "seed.toml", False)
    second = report.document([jobs[1]], "seed.toml", False)
    second["host"] = {**first["host"], "hostname": "lent-2"}
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    res = cli.invoke(app, ["show", str(a), str(b), "-f", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["host"]["hostname"] == f"{first['host']['hostname']}, lent-2"
    assert doc["jobs"][1]["speedup_vs_mmap"]["aggregation"] == pytest.approx(2000.0 / 60.0)
    shown = cli.invoke(app, ["show", str(a), str(b), "-f", "markdown"])
    assert shown.exit_code == 0 and "lent-2" in shown.output
    # a kernel's reservations move memory a little: still one kind of machine
    near = {**second["host"], "memory_bytes": first["host"]["memory_bytes"] - (64 << 20)}
    b.write_text(json.dumps({**second, "host": near}))
    assert cli.invoke(app, ["show", str(a), str(b)]).exit_code == 0
    big = {**second["host"], "memory_bytes": 2 * first["host"]["memory_bytes"]}
    b.write_text(json.dumps({**second, "host": big}))
    res = cli.invoke(app, ["show", str(a), str(b)])
    assert res.exit_code == 2 and f"{b}: ran on another machine" in res.stderr
