"""Plots are written, decode, and have the size asked for; failures are one-line errors."""

import builtins
import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.results import plot

cli = CliRunner()
pytest.importorskip("matplotlib")


def result(tmp_path, name, scale):
    pct = {f"{p:f}": int(scale * 1000 * (1 + p)) for p in (1.0, 50.0, 90.0, 99.0, 99.9, 99.99)}

    def job(n, iops):
        return {"jobname": n, "error": 0,
                "read": {"iops": iops, "bw_bytes": iops * 4096,
                         "lat_ns": {"mean": 5e4, "percentile": pct}},
                "cpu_us_per_io": 2.0,
                "samples": [{"t_ms": 500.0 * i, "iops": iops * (1 + 0.01 * i),
                             "bw_bytes": 4096 * iops} for i in range(1, 6)]}

    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"host": {}, "jobs": [job("psync", 1000 * scale),
                                                     job("uring", 3000 * scale)]}))
    return path


def test_png_decodes_at_the_figure_size(tmp_path):
    import matplotlib.image

    out = tmp_path / "cmp.png"
    res = cli.invoke(app, ["plot", str(result(tmp_path, "gen4", 1)), str(result(tmp_path, "gen5", 2)),
                           "-o", str(out)])
    assert res.exit_code == 0, res.output
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (plot.FIGSIZE[1] * plot.DPI, plot.FIGSIZE[0] * plot.DPI)
    assert pixels.std() > 0.05  # not a blank canvas


def test_svg_is_valid_xml_with_the_labels(tmp_path):
    out = tmp_path / "one.svg"
    res = cli.invoke(app, ["plot", str(result(tmp_path, "run", 1)), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert ET.parse(out).getroot().tag.endswith("svg")
    assert "IOPS over time" in out.read_text()


def test_bad_output_name_and_missing_matplotlib(tmp_path, monkeypatch):
    src = str(result(tmp_path, "run", 1))
    res = cli.invoke(app, ["plot", src, "-o", str(tmp_path / "x.jpg")])
    assert res.exit_code == 2 and "give a .png or .svg file name" in res.stderr
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    res = cli.invoke(app, ["plot", src, "-o", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "pip install 'gpufio[plot]'" in res.stderr
