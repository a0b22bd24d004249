"""The live table against the result: a finished job's live row shows the numbers of the
result's row, so one job never has two numbers on screen."""

import io
import re

import pytest
from rich.console import Console

from gpufio.profile import from_dict
from gpufio.workloads.block import document, runner
from gpufio.workloads.block.live import LiveDisplay


class Tty(io.StringIO):
    def isatty(self):
        return True


def _last_table(text: str) -> tuple[str, list[dict[str, str]]]:
    """The title and rows (by header) of the last Rich table drawn in ``text``."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    top = text.rindex("┏")
    title = text[:top].rstrip().splitlines()[-1].strip()
    text = text[top:]
    lines = [ln for ln in text.splitlines() if ln.startswith(("│", "┃"))]
    cells = [[c.strip() for c in ln.strip("│┃").split("│" if ln[0] == "│" else "┃")]
             for ln in lines]
    return title, [dict(zip(cells[0], row)) for row in cells[1:]]


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.parametrize("rw,state", [("randread", "done"), ("randrw", "done r+w")])
def test_a_finished_jobs_live_row_shows_its_results_numbers(monkeypatch, pattern_file, rw,
                                                            state):
    monkeypatch.setenv("COLUMNS", "200")
    extra = {"verify": False, "overwrite": True} if rw == "randrw" else {}
    prof = from_dict({"global": {"targets": [str(pattern_file)], "rw": rw, "size": "4m",
                                 "io_size": "8m", "iodepth": 4, **extra}}, "live.toml", {})
    tty = Tty()
    with LiveDisplay(tty) as live:
        doc = document.build_document(runner.run_profile(prof, on_tick=live.update), prof)
    title, [row] = _last_table(tty.getvalue())
    assert title == "gpufio: finished"
    assert row["state"] == state and row["ETA"] == "-"
    final = io.StringIO()
    document.render(doc, "table", Console(file=final, width=200))
    _, result = _last_table(final.getvalue())
    job = doc["jobs"][0]
    directions = [d for d in ("read", "write") if job[d]["total_ios"]]
    assert len(result) == len(directions)
    iops = sum(job[d]["iops"] for d in directions)
    assert _number(row["IOPS"]) == round(iops)
    if len(directions) == 1:  # one row each: the same numbers, as printed
        assert _number(row["IOPS"]) == _number(result[0]["IOPS"])
        assert _number(row["MB/s"]) == _number(result[0]["MB/s"])
        assert _number(row["p50 us"]) == _number(result[0]["p50_us"])
        assert _number(row["p99 us"]) == _number(result[0]["p99_us"])


def test_each_run_of_a_repeat_says_on_its_live_table_that_the_result_is_the_median(
        monkeypatch, pattern_file):
    from gpufio.workloads.block import driver

    monkeypatch.setenv("COLUMNS", "200")
    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    prof = from_dict({"global": {"targets": [str(pattern_file)], "size": "1m"}}, "r.toml", {})
    driver.run(prof, quiet=False, repeat=2)
    title, _ = _last_table(tty.getvalue())
    assert title == "gpufio: finished (run 2 of 2; the result reports each job's median run)"


def test_a_jobs_first_live_line_has_no_rate_until_a_sample_covers_an_interval(pattern_file):
    """The first tick starts the job and takes no sample: its first line shows "-" for the
    rates, never iops=0; the finished job's last snapshot carries its result's."""
    prof = from_dict({"global": {"targets": [str(pattern_file)], "size": "4m",
                                 "runtime": "1s", "time_based": True}}, "first.toml", {})
    plain = io.StringIO()
    with LiveDisplay(plain) as live:
        seen = []
        runner.run_profile(prof, on_tick=lambda snaps: (seen.append(snaps[0]),
                                                         live.update(snaps)))
    first = seen[0]
    assert first.state in ("ramp", "run") and first.iops is None and first.bw_bytes is None
    assert " iops=- MB/s=- " in plain.getvalue().splitlines()[0]
    assert seen[-1].state == "done" and seen[-1].iops > 0  # the result's numbers


def test_a_row_without_numbers_yet_shows_dashes(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    from gpufio.run.records import Snapshot

    tty = Tty()
    with LiveDisplay(tty) as live:
        live.update([Snapshot("j", "uring", "run", None, None, None, None, 0.0, None)])
    _, [row] = _last_table(tty.getvalue())
    cells = [row[k] for k in ("IOPS", "MB/s", "p50 us", "p99 us", "progress", "ETA")]
    assert cells == ["-", "-", "-", "-", "0%", "-"]
