"""compare, check and --repeat on hand-made result files: ratios, gates, JUnit, medians."""

import copy
import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core.errors import BadInput
from gpufio.profile import from_dict
from gpufio.results import check as gate
from gpufio.results import load as results
from gpufio.results import repeat
from gpufio.results.compare import compare_rows

cli = CliRunner()


def job(name, iops, p99_ns=100_000, bs=4096, cpu=2.0, **opts):
    pct = {f"{p:f}": p99_ns // 2 for p in (1.0, 50.0)}
    pct.update({"99.000000": p99_ns, "99.900000": 2 * p99_ns})
    return {"jobname": name, "error": 0, "engine": "uring",
            "read": {"iops": iops, "bw_bytes": iops * bs,
                     "lat_ns": {"mean": p99_ns / 2, "percentile": pct}},
            "cpu_us_per_io": cpu, "resolved options": {"bs": bs, "iodepth": 32, **opts},
            "targets": [{"path": "/dev/nvme0n1", "model": "Drive X", "current_pcie_gen": 4,
                         "current_link_width": "4"}]}


def doc(*jobs, kernel="6.18", model=None):
    d = {"host": {"cpu": "CPU", "cpus": 16, "kernel": kernel}, "gpus": [], "jobs": list(jobs),
         "interrupted": False}
    if model:
        for j in d["jobs"]:
            j["targets"][0]["model"] = model
    return d


def test_compare_ratios_and_missing_jobs():
    base = doc(job("a", 1000, 100_000), job("only-base", 5))
    new = doc(job("a", 1500, 80_000), job("only-new", 7))
    rows = {(r["job"], r["metric"]): r for r in compare_rows([base, new], ["gen4", "gen5"])}
    iops = rows[("a", "iops")]
    assert (iops["gen4"], iops["gen5"], iops["gen5 ratio"]) == (1000, 1500, 1.5)
    assert iops["gen5 change %"] == pytest.approx(50.0)
    assert rows[("a", "lat_p99")]["gen5 ratio"] == pytest.approx(0.8)
    assert rows[("only-base", "iops")]["gen5"] is None
    assert rows[("only-new", "iops")]["gen4"] is None and rows[("only-new", "iops")]["gen5 ratio"] is None
    with pytest.raises(BadInput, match="at least two result files"):
        compare_rows([base], ["x"])


@pytest.mark.parametrize("fmt,marker", [("table", "baseline: gen4"), ("markdown", "| job "),
                                        ("csv", "job,metric,unit,gen4,gen5"), ("json", '"baseline"')])
def test_compare_cli_formats_show_the_setups(fmt, marker, write_json):
    a = write_json("gen4.json", doc(job("a", 1000)))
    b = write_json("gen5.json", doc(job("a", 1200), model="Drive Y"))
    res = cli.invoke(app, ["compare", str(a), str(b), "-f", fmt])
    assert res.exit_code == 0, res.output
    assert marker in res.stdout
    if fmt != "csv":
        assert "Drive X Gen4x4" in res.stdout and "Drive Y" in res.stdout


def test_gate_passes_and_fails_at_the_limit():
    base = doc(job("a", 1000, 100_000))
    limits = {"iops": 0.05, "lat_p99": 0.10}
    ok = gate.check(doc(job("a", 951, 109_000)), base, limits)
    assert all(f.passed for f in ok) and len(ok) == 2
    bad = {f.metric: f for f in gate.check(doc(job("a", 949, 111_000)), base, limits)}
    assert not bad["iops"].passed and bad["iops"].why == "iops fell 5.1% (limit 5%)"
    assert not bad["lat_p99"].passed and bad["lat_p99"].change_pct == pytest.approx(11.0)
    better = gate.check(doc(job("a", 2000, 50_000)), base, limits)
    assert all(f.passed for f in better)
    missing = gate.check(doc(job("b", 1000)), base, {"iops": 0.05})
    assert [(f.job, f.passed, f.why) for f in missing] == [
        ("a", False, "job missing from the result"), ("b", False, "job missing from the baseline")]


def test_limit_parsing_errors():
    assert gate.parse_limits(["iops=5%", "bw=2.5"], "--max-drop", rising=False) == \
        {"iops": 0.05, "bw": 0.025}
    with pytest.raises(BadInput, match=r"unknown metric 'iop' \(did you mean 'iops'\?\)"):
        gate.parse_limits(["iop=5%"], "--max-drop", rising=False)
    with pytest.raises(BadInput, match="'lat_p99' is better lower; limit it with --max-rise"):
        gate.parse_limits(["lat_p99=5%"], "--max-drop", rising=False)
    with pytest.raises(BadInput, match="'iops' is better higher; limit it with --max-drop"):
        gate.parse_limits(["iops=5%"], "--max-rise", rising=True)
    with pytest.raises(BadInput, match="not a percentage"):
        gate.parse_limits(["iops=lots"], "--max-drop", rising=False)


def test_check_cli_exit_codes_junit_and_warnings(tmp_path, write_json):
    base = write_json("base.json", doc(job("a", 1000), job("b", 1000)))
    good = write_json("good.json", doc(job("a", 990), job("b", 1010)))
    bad = write_json("bad.json", doc(job("a", 800), job("b", 1000), kernel="6.19"))
    junit = tmp_path / "junit.xml"
    res = cli.invoke(app, ["check", str(good), "-b", str(base), "--max-drop", "iops=5%"])
    assert res.exit_code == 0 and "WARNING" not in res.stderr
    res = cli.invoke(app, ["check", str(bad), "-b", str(base), "--max-drop", "iops=5%",
                           "--max-rise", "lat_p99=10%", "--junit", str(junit)])
    assert res.exit_code == 1
    assert "WARNING: not like for like: kernel differs: baseline '6.18', result '6.19'" in res.stderr
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("4", "1")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    message = cases[("a", "iops")].find("failure").get("message")
    assert message.startswith("a iops: -20.0%, no interval (limit 5%; 1 baseline run): "
                              "iops fell 20.0%, past the limit; no noise estimate")
    assert cases[("b", "iops")].find("failure") is None


def test_check_warns_when_options_differ(tmp_path):
    base = doc(job("a", 1000))
    other = doc(job("a", 1000, iodepth=64))
    assert gate.mismatches(other, base) == ["job 'a': options differ: iodepth"]


def test_check_uses_the_profiles_table_and_needs_some_limit(write_json):
    base = write_json("base.json", doc(job("a", 1000)))
    with_table = doc(job("a", 900))
    with_table["check"] = {"iops": 0.05}
    res = cli.invoke(app, ["check", str(write_json("r.json", with_table)), "-b", str(base)])
    assert res.exit_code == 1 and "FAIL a iops" in res.stdout
    res = cli.invoke(app, ["check", str(write_json("n.json", doc(job("a", 900)))), "-b", str(base)])
    assert res.exit_code == 2 and "no limits" in res.stderr


def test_profile_check_table_is_validated():
    p = from_dict({"check": {"max_drop": {"iops": "5%"}, "max_rise": {"lat_p99": "10%"}}},
                  "p.toml", {})
    assert p.limits == {"iops": 0.05, "lat_p99": 0.10}
    with pytest.raises(BadInput, match=r"\[check\]: unknown key 'max_dorp'"):
        from_dict({"check": {"max_dorp": {}}}, "p.toml", {})
    with pytest.raises(BadInput, match=r"\[check\] max_rise: 'iops' is better higher"):
        from_dict({"check": {"max_rise": {"iops": "5%"}}}, "p.toml", {})


def test_repeat_keeps_the_median_run_and_the_spread():
    docs = [doc(job("a", v, p99_ns=p)) for v, p in ((1000, 300_000), (3000, 100_000), (2000, 200_000))]
    docs[0]["jobs"][0]["error"] = 1
    out = repeat.combine(copy.deepcopy(docs))
    j = out["jobs"][0]
    assert j["read"]["iops"] == 2000 and j["repeat"]["n"] == 3
    assert j["repeat"]["median"]["iops"] == 2000 and j["repeat"]["min"]["iops"] == 1000
    assert j["repeat"]["max"]["lat_p99"] == 300.0
    assert j["error"] == 1  # a failure in any repetition fails the job
    assert results.job_metrics(j)["iops"] == 2000
    from gpufio.workloads.block.document import render, summary_rows

    j.update(usr_cpu=1.0, sys_cpu=2.0, cpu_us_per_io=3.0)
    (row,) = summary_rows(out)
    assert row["IOPS"] == 2000 and row["IOPS min-max"] == "1,000-3,000 (n=3)"
    out.update({"gpufio version": "0", "profile": "p.toml"})
    assert "| IOPS min-max" in render(out, "markdown") and "IOPS min-max" in render(out, "csv")


def test_bad_result_files(tmp_path):
    for content, message in [("{", "not JSON"), ("[]", "not a gpufio result"),
                             ('{"jobs": [{}]}', "lacks 'jobname'")]:
        p = tmp_path / "r.json"
        p.write_text(content)
        with pytest.raises(BadInput, match=message):
            results.load(str(p))
    res = cli.invoke(app, ["compare", str(tmp_path / "none.json"), str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "no such result file" in res.stderr


def test_run_repeat_end_to_end(write_profile, tmp_path):
    path = write_profile('[global]\nsize = "1m"\nruntime = "150ms"\ntime_based = true\n')
    out = tmp_path / "r.json"
    res = cli.invoke(app, ["run", str(path), "-q", "-f", "json", "-o", str(out), "--repeat", "3"])
    assert res.exit_code == 0, res.output
    j = json.loads(out.read_text())["jobs"][0]
    runs = j["repeat"]["runs"]
    assert len(runs) == 3 and sorted(r["iops"] for r in runs)[1] == j["repeat"]["median"]["iops"]
    assert j["read"]["iops"] == pytest.approx(j["repeat"]["median"]["iops"])
