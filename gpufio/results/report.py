"""What CI systems read of a ``check``: a line per finding, JUnit XML, GitHub Actions
annotations and a Markdown summary for a pull-request comment."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from gpufio.results.check import Finding
from gpufio.results.render import render as render_rows


def _pct(value: float) -> str:
    return f"{value:+.1f}%"


def interval_text(f: Finding) -> str:
    """The change's interval, and where it came from."""
    if f.interval is None:
        return "no interval"
    where = "" if f.noise else " within one run"
    return (f"{100 * f.confidence:g}% interval{where} "
            f"{_pct(f.interval[0])}..{_pct(f.interval[1])}")


def noise_text(f: Finding) -> str:
    """What noise the interval is against: the pairs' ratios, or the baseline's spread."""
    if f.pair_ratios:
        lo, hi = min(f.pair_ratios), max(f.pair_ratios)
        return f"{len(f.pair_ratios)} interleaved pairs, ratios {_pct(100 * lo)}..{_pct(100 * hi)}"
    if f.spread:
        return f"baseline spread {f.spread}"
    return f"{f.runs[0]} baseline run{'s' * (f.runs[0] != 1)}"


def _reason(f: Finding) -> str:
    if f.change_pct is None:
        return f.why
    said = ""
    if not f.passed:
        moved = "fell" if f.change_pct < 0 else "rose"
        beyond = (", beyond the pairs' noise" if f.pair_ratios else
                  ", beyond the baseline's noise" if f.noise else
                  ", beyond the runs' own samples"
                  if f.note.startswith("no noise estimate between") else "")
        said = f"{f.metric} {moved} {abs(f.change_pct):.1f}%, past the limit{beyond}"
    return "; ".join(p for p in (said, f.note) if p)


def line(f: Finding) -> str:
    """One finding as the line ``check`` prints: verdict, change, interval, limit, the
    baseline's spread, and why."""
    head = f"{f.verdict:<4} {f.job} {f.metric}: "
    if f.change_pct is None:
        return head + f.why
    runs = noise_text(f)
    basis = f"; from the {f.basis}" if f.basis else ""
    reason = _reason(f)
    return (head + f"{_pct(f.change_pct)}, {interval_text(f)} (limit {f.limit_pct:g}%; "
            f"{runs}{basis})" + (f": {reason}" if reason else ""))


def junit_xml(findings: list[Finding], suite: str = "gpufio check") -> str:
    """JUnit XML: one test case per (job, metric); a failure element for each regression,
    its message the change, its interval and the limit."""
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(findings)),
                       failures=str(sum(not f.passed for f in findings)))
    for f in findings:
        case = ET.SubElement(ts, "testcase", classname=f.job, name=f.metric)
        out = ET.SubElement(case, "system-out")
        out.text = line(f)
        if not f.passed:
            ET.SubElement(case, "failure", message=line(f)[5:], type="regression")
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def _escape(text: str) -> str:
    """A workflow command's message: GitHub reads %, CR and LF as escapes."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotations(findings: list[Finding], warnings: list[str]) -> list[str]:
    """GitHub Actions workflow commands: ::error for each regression, ::warning for each
    warning and for each finding past its limit that was let through (noise, or no noise
    estimate)."""
    out = []
    for f in findings:
        title = f"gpufio check: {f.job} {f.metric}"
        if not f.passed:
            out.append(f"::error title={_escape(title)}::{_escape(line(f)[5:])}")
        elif f.note and (f.verdict == "ok (noise)" or not f.noise):
            out.append(f"::warning title={_escape(title)}::{_escape(line(f))}")
    out += [f"::warning title=gpufio check::{_escape(w)}" for w in warnings]
    return out


def markdown(findings: list[Finding], warnings: list[str]) -> str:
    """The verdict for a pull-request comment: a heading, a table, the warnings."""
    failed = sum(not f.passed for f in findings)
    head = (f"### gpufio check: {failed} regression{'s' * (failed != 1)}" if failed
            else "### gpufio check: no regression")
    rows: list[dict[str, Any]] = []
    for f in findings:
        rows.append({
            "verdict": f.verdict, "job": f.job, "metric": f.metric,
            "baseline": "missing" if f.baseline is None else f"{f.baseline:,.4g}",
            "result": "missing" if f.value is None else f"{f.value:,.4g}",
            "change": "n/a" if f.change_pct is None else _pct(f.change_pct),
            "interval": "" if f.interval is None else
            f"{_pct(f.interval[0])}..{_pct(f.interval[1])}"
            + ("" if f.noise else " (within one run)"),
            "limit": f"{f.limit_pct:g}%",
            "noise": noise_text(f),
            "from": f.basis or "runs",
            "note": _reason(f)})
    modes = {f.job: f.mode for f in findings if f.mode}
    said = "".join(f"- job `{job}`: {mode}\n" for job, mode in modes.items())
    text = head + "\n\n" + (said + "\n" if said else "") + render_rows(rows, "markdown")
    if warnings:
        text += "\n" + "".join(f"- {w}\n" for w in warnings)
    return text
