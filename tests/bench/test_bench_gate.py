"""bench/gate: a slowed candidate counts only when its achieved slowdown is within 3 points of
its target; the catch goals are shares of the valid cases, and any invalid case is a miss."""

import pytest

from bench import gate


@pytest.mark.parametrize("target,cand,valid", [
    (0.10, 90.0, True), (0.10, 93.0, True), (0.10, 87.0, True), (0.10, 93.2, False),
    (0.10, 50.0, False), (0.25, 74.0, True), (0.25, 79.0, False), (0.0, 80.0, True),
    (0.0, 120.0, True)])
def test_an_achieved_slowdown_is_valid_within_three_points(target, cand, valid):
    slowdown, ok = gate.achieved(target, 100.0, cand)
    assert slowdown == pytest.approx(1 - cand / 100)
    assert ok is valid


def verdict(case, failed, valid=True):
    return {"case": case, "failed": failed, "valid": valid}


def test_goals_count_the_valid_cases_and_miss_on_an_invalid_one():
    pairs = 2
    verdicts = [verdict("identical", False), verdict("identical", False),
                verdict("slowed 10%", True), verdict("slowed 10%", False, valid=False),
                verdict("slowed 25%", True), verdict("slowed 25%", True)]
    counts = gate.tally(verdicts, gate.CASES)
    assert counts["slowed 10%"] == {"valid": 1, "failed": 1, "invalid": 1}
    met = gate.goals(counts, pairs, one_run_note=True)
    assert met["slowed 10% caught"][2] and met["slowed 25% caught"][2]
    assert not met["slowdowns as asked (within 3 points)"][2]
    verdicts[3] = verdict("slowed 10%", False)  # valid, and missed: 1 of 2 is not 19 of 20
    met = gate.goals(gate.tally(verdicts, gate.CASES), pairs, one_run_note=True)
    assert not met["slowed 10% caught"][2] and met["slowdowns as asked (within 3 points)"][2]
    assert met["false failures (identical)"][2]


def test_rounds_interleave_the_baseline_abba_and_rotate_the_cases():
    """Each candidate's runs and the baseline's go B C C B B C: one of each side in every
    consecutive two, so check pairs them by time and an order effect cancels."""
    order = gate.rounds(5)
    assert order[0] == ["base", *gate.CASES] and order[1][-1] == "base"
    assert [r[0] if i % 2 == 0 else r[-1] for i, r in enumerate(order)] == ["base"] * 5
    assert [r[1] for r in order[::2]] == [gate.CASES[0], gate.CASES[2], gate.CASES[1]]
    for case in gate.CASES:
        seq = [name for r in order for name in r if name in ("base", case)]
        assert seq == ["base", case, case, "base", "base", case, case, "base", "base", case]


def test_the_noise_floor_is_the_known_noise_bound_and_its_inverse():
    """(z_0.995 + z_0.95) sigma / sqrt(n): with sigma 0.1 and 5 pairs the mean of the log
    ratios must fall by 0.1887 to clear the bound 19 times in 20; sigma_for inverts it."""
    drop = gate.floor(0.1, 5)
    assert drop == pytest.approx(1 - 2.718281828 ** -((2.5758293 + 1.6448536) * 0.1 / 5 ** 0.5),
                                 rel=1e-6)
    assert gate.floor(0.1, 20) < drop  # more pairs, a smaller floor
    assert gate.floor(gate.sigma_for(0.10, 5), 5) == pytest.approx(0.10)
    assert gate.sigma_for(0.25, 5) > gate.sigma_for(0.10, 5)


def test_noise_is_the_spread_of_identical_pairs_log_ratios():
    assert gate.noise([(100.0, 100.0)]) is None  # one pair has no spread
    assert gate.noise([(100.0, 100.0), (100.0, 100.0)]) == 0.0
    pairs = [(100.0, 110.0), (100.0, 90.0), (200.0, 200.0)]
    logs = [0.0953102, -0.1053605, 0.0]
    mean = sum(logs) / 3
    sd = (sum((x - mean) ** 2 for x in logs) / 2) ** 0.5
    assert gate.noise(pairs) == pytest.approx(sd, rel=1e-5)


def test_the_noise_floor_lines_name_each_tool_and_skip_a_missing_one():
    out = gate.noise_floor({"gpufio": 0.12, "fio": None}, 5)
    assert set(out["noise"]["floor"]) == {"gpufio"}
    assert out["noise"]["sigma_needed"]["10%"] == pytest.approx(gate.sigma_for(0.10, 5))
    assert len(out["lines"]) == 2 and out["lines"][1].startswith("gpufio identical pairs")
    assert f"{100 * gate.floor(0.12, 5):.0f}%" in out["lines"][1]


def test_the_floor_uses_checks_default_confidence():
    from gpufio.results.check import DEFAULT_CONFIDENCE

    assert gate.DEFAULT_CONFIDENCE == DEFAULT_CONFIDENCE
