"""bench/overlay.py's arithmetic: the lat ratio is paired by round, a depth's products are
IOPS x mean lat, and --check's goals are 5% on the ratio and on gpufio's product."""

from __future__ import annotations

import pytest

from bench import overlay


def run(iops: float, lat_us: float, slat_us: float = 1.0) -> dict:
    return {"iops": iops, "lat": lat_us * 1e3, "slat": slat_us * 1e3}


def test_a_depths_row_pairs_each_round_and_names_what_it_misses():
    # round 2 ran at half speed for both tools: its ratio is still 1.0
    g = [run(40_000, 800), run(20_000, 1600), run(40_000, 800)]
    f = [run(40_000, 800), run(20_000, 1600), run(41_000, 780)]
    missed: list[str] = []
    row = overlay.row(32, g, f, missed)
    assert missed == [] and row[-1] == "ok"
    assert row[4] == "1.000"  # the median of 1.0, 1.0 and 800/780
    assert row[5] == "32.00" and row[6] == "32.00"  # IOPS x lat, gpufio's and fio's
    # a gpufio whose stamps miss a tenth of each I/O's life: 28.8 of 32, and 0.9x fio's lat
    short = [run(40_000, 720)] * 3
    missed = []
    row = overlay.row(32, short, [run(40_000, 800)] * 3, missed)
    assert missed == ["qd 32: lat 0.900x fio's", "qd 32: IOPS x lat 28.80 at qd 32"]


@pytest.mark.parametrize("ratio,product,misses", [(1.049, 32.0, 0), (0.951, 33.5, 0),
                                                  (1.06, 32.0, 1), (1.0, 30.3, 1),
                                                  (0.9, 30.0, 2)])
def test_the_goals_are_five_percent(ratio, product, misses):
    assert len(overlay.verdict(32, ratio, product)) == misses
