"""The interval samples divide each worker's published counts by the time they cover (its
stamps), so a worker that publishes once per batch gives steady samples of a steady rate."""

import pytest

from gpufio.run.jobrun import WorkerRate

MS = 1_000_000


def test_a_steady_worker_publishing_per_batch_samples_its_rate_exactly():
    # 1000 I/Os a batch, one batch per 11 ms: 90.9 K IOPS; samples every 100 ms see 9 or 10
    # batches, which divided by 100 ms jumped by a batch (10 K IOPS) from sample to sample
    rate, t, ios = WorkerRate(0), 0, 0
    samples = []
    for tick in range(100 * MS, 2000 * MS + 1, 100 * MS):
        while t + 11 * MS <= tick:
            t, ios = t + 11 * MS, ios + 1000
        samples.append(rate.update(ios, ios * 4096, t, tick))
    assert all(s[0] == pytest.approx(1000 / 0.011) for s in samples)
    assert all(s[1] == pytest.approx(4096 * 1000 / 0.011) for s in samples)


def test_a_worker_publishing_less_often_than_the_samples_keeps_its_rate_until_it_stops():
    rate = WorkerRate(0)
    assert rate.update(0, 0, 0, 100 * MS) == (0.0, 0.0)  # nothing published yet
    assert rate.update(500, 500, 500 * MS, 500 * MS)[0] == pytest.approx(1000)
    assert rate.update(500, 500, 500 * MS, 600 * MS)[0] == pytest.approx(1000)  # between
    assert rate.update(1000, 1000, 1000 * MS, 1000 * MS)[0] == pytest.approx(1000)
    assert rate.update(1000, 1000, 1000 * MS, 2001 * MS) == (0.0, 0.0)  # silent 2 windows
