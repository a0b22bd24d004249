import numpy as np
import pytest

from gpufio.core.errors import BadInput
from gpufio.core.offsets import Distribution, OffsetStream, sample_ranks


def stream(random=True, dist="random", regions=((0, 1000),), fs="roundrobin", seed=(1, 0),
           budget=None, bs=4096):
    return OffsetStream(random=random, bs=bs, regions=list(regions),
                        dist=Distribution.parse(dist, "d"), file_service=fs, seed=seed,
                        budget=budget)


def test_random_offsets_are_aligned_in_range_and_reproducible():
    regions = [(1 << 20, 1000), (0, 10)]
    a = stream(regions=regions)
    tgt, offs = a.next(50_000)
    starts = np.array([1 << 20, 0])[tgt]
    nblocks = np.array([1000, 10])[tgt]
    assert np.all(offs % 4096 == 0)
    assert np.all(offs >= starts) and np.all(offs < starts + nblocks * 4096)
    b = stream(regions=regions)
    assert np.array_equal(b.next(50_000)[1], offs)
    c = stream(regions=regions, seed=(2, 0))
    assert not np.array_equal(c.next(50_000)[1], offs)


def test_one_target_offsets_are_its_start_plus_its_blocks(monkeypatch):
    # one target takes a shorter way through the arrays than several: its offsets are
    # still the region's start plus each drawn block times bs, its targets all 0
    for random, dist in ((True, "random"), (True, "zipf:1.2"), (False, "random")):
        s = stream(random=random, dist=dist, regions=[(8192, 1000)])
        drawn = []
        blocks_for = s._blocks_for
        monkeypatch.setattr(s, "_blocks_for",
                            lambda t, k: drawn.append(blocks_for(t, k).copy()) or drawn[-1].copy())
        tgt, offs = zip(*(s.next(n) for n in (7, 20_000, 4096)))
        tgt, offs = np.concatenate(tgt), np.concatenate(offs)
        blocks = np.concatenate(drawn)[:len(offs)]
        assert tgt.dtype == np.int32 and not tgt.any()
        assert offs.dtype == np.uint64
        assert np.array_equal(offs, np.uint64(8192) + blocks * np.uint64(4096))


def test_workers_get_different_streams():
    assert not np.array_equal(stream(seed=(1, 0)).next(100)[1], stream(seed=(1, 1)).next(100)[1])


def test_sequential_wraps_and_round_robin_alternates():
    s = stream(random=False, regions=[(0, 3), (8192, 2)])
    tgt, offs = s.next(8)
    assert tgt.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert offs.tolist() == [0, 8192, 4096, 12288, 8192, 8192, 0, 12288]


def test_random_file_service_spreads_over_targets():
    tgt, _ = stream(fs="random", regions=[(0, 10)] * 4).next(40_000)
    counts = np.bincount(tgt, minlength=4)
    assert counts.min() > 9_000


def test_budget_limits_the_stream():
    s = stream(budget=10)
    assert len(s.next(6)[1]) == 6
    assert len(s.next(6)[1]) == 4
    assert len(s.next(6)[1]) == 0


def _ranks(dist: str, nblocks: int, n: int = 400_000) -> np.ndarray:
    rng = np.random.default_rng(0)
    return sample_ranks(Distribution.parse(dist, "d"), rng, nblocks, n)


def test_uniform_is_flat():
    _, offs = stream(regions=[(0, 100)]).next(200_000)
    counts = np.bincount((offs // 4096).astype(np.int64), minlength=100)
    assert counts.min() > 1700 and counts.max() < 2300


@pytest.mark.parametrize("theta", [0.8, 1.0, 1.2])
@pytest.mark.parametrize("nblocks", [10_000, 1 << 20])
def test_zipf_matches_its_theory(theta, nblocks):
    ranks = np.arange(1, nblocks + 1, dtype=np.float64)
    p = ranks ** -theta / np.sum(ranks ** -theta)
    got = _ranks(f"zipf:{theta}", nblocks)
    for top in (0.01, 0.2):
        k = int(nblocks * top)
        assert np.mean(got < k) == pytest.approx(p[:k].sum(), abs=0.005)
    assert got.max() < nblocks


def test_pareto_80_20():
    # fio's pareto:0.2 puts 80% of accesses on the hottest 20% of the blocks
    assert np.mean(_ranks("pareto:0.2", 10_000) < 2_000) == pytest.approx(0.8, abs=0.005)


def test_skewed_streams_scatter_the_hot_set():
    _, offs = stream(dist="zipf:1.2", regions=[(0, 10_000)]).next(200_000)
    counts = np.bincount((offs // 4096).astype(np.int64), minlength=10_000)
    hottest = np.argsort(counts)[::-1][:100]
    assert counts[hottest].sum() > 0.5 * len(offs)
    # hashed like fio: the hot blocks are spread over the region, not packed at its start
    assert hottest.max() - hottest.min() > 5_000


def test_normal_concentrates_around_the_middle_before_scattering():
    rng = np.random.default_rng(0)
    ranks = sample_ranks(Distribution.parse("normal:10", "d"), rng, 10_000, 100_000)
    assert abs(np.mean(ranks) - 5000) < 50
    assert np.std(ranks) == pytest.approx(1000, rel=0.05)


@pytest.mark.parametrize("text", ["zipf", "zipf:x", "zipf:0", "pareto:1", "pareto:0",
                                  "normal:0", "normal:101", "poisson:3", "random:2"])
def test_bad_distributions(text):
    with pytest.raises(BadInput, match="random_distribution"):
        Distribution.parse(text, "key 'random_distribution'")


def test_distribution_round_trips_to_text():
    assert str(Distribution.parse("zipf:1.2", "d")) == "zipf:1.2"
    assert str(Distribution.parse("gauss:5", "d")) == "normal:5"
    assert str(Distribution.parse("random", "d")) == "random"
