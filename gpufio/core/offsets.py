"""Seeded, vectorised offset streams: which target and which offset each I/O goes to.

Offsets are produced in numpy batches so that engines never pay a Python object per I/O
for addressing. Skewed distributions follow fio's definitions (zipf theta, pareto h,
normal sigma as a percentage of the range) and, as fio does by default, hot ranks are
scattered over the region with a hash so that the hot set is not one contiguous extent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from gpufio.core.errors import BadInput

_MIX = np.uint64(0x9E3779B97F4A7C15)
# the seed of offset streams and of created files where a profile gives none
DEFAULT_SEED = 0x89
CHUNK = 16384


@dataclass(frozen=True)
class Distribution:
    """fio's random_distribution: 'random', 'zipf:THETA', 'pareto:H' or 'normal:SIGMA'."""

    kind: str
    param: float | None = None

    @classmethod
    def parse(cls, text: str, what: str) -> "Distribution":
        """Validate the text a profile gives; errors name ``what`` (file, job, key)."""
        kind, _, arg = text.partition(":")
        kind = "normal" if kind == "gauss" else kind
        if kind == "random" and not arg:
            return cls("random")
        if kind not in ("zipf", "pareto", "normal"):
            raise BadInput(f"{what}: unknown distribution {text!r} "
                           "(use random, zipf:THETA, pareto:H, normal:SIGMA)")
        try:
            value = float(arg)
        except ValueError:
            raise BadInput(f"{what}: {kind} needs a number, as in {kind}:"
                           f"{ {'zipf': '1.2', 'pareto': '0.2', 'normal': '10'}[kind] }") from None
        ok = {"zipf": value > 0, "pareto": 0 < value < 1, "normal": 0 < value <= 100}[kind]
        if not ok:
            rule = {"zipf": "theta > 0", "pareto": "0 < h < 1", "normal": "0 < sigma <= 100 (%)"}
            raise BadInput(f"{what}: {text!r} is out of range ({rule[kind]})")
        return cls(kind, value)

    def __str__(self) -> str:
        return self.kind if self.param is None else f"{self.kind}:{self.param:g}"


def _hash(values: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of values ^ salt: scatters hot ranks over the region (fio's __hash_u64)."""
    z = values ^ np.uint64(salt & ((1 << 64) - 1))
    z = z + _MIX
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_ZIPF_EXACT_RANKS = 1 << 16


@lru_cache(maxsize=16)
def _zipf_head(theta: float, nblocks: int) -> tuple[np.ndarray, float]:
    """Exact CDF of the hottest ranks and the normalising sum (tail by integral)."""
    k = min(nblocks, _ZIPF_EXACT_RANKS)
    head = np.arange(1, k + 1, dtype=np.float64) ** -theta
    tail = _power_integral(theta, k + 0.5, nblocks + 0.5) if nblocks > k else 0.0
    total = float(head.sum()) + tail
    return np.cumsum(head) / total, total


def _power_integral(theta: float, a: float, b: float) -> float:
    """Integral of x**-theta from a to b."""
    if math.isclose(theta, 1.0):
        return math.log(b / a)
    return (b ** (1 - theta) - a ** (1 - theta)) / (1 - theta)


def _zipf_ranks(theta: float, nblocks: int, u: np.ndarray) -> np.ndarray:
    """Zipf ranks: exact for the hottest 64 Ki ranks, continuous inverse for the tail."""
    cdf, total = _zipf_head(theta, nblocks)
    ranks = np.searchsorted(cdf, u, side="right").astype(np.float64)
    tail = ranks >= len(cdf)
    if tail.any():
        mass = (u[tail] - cdf[-1]) * total
        a = len(cdf) + 0.5
        if math.isclose(theta, 1.0):
            x = a * np.exp(mass)
        else:
            x = np.power(a ** (1 - theta) + mass * (1 - theta), 1 / (1 - theta))
        ranks[tail] = np.floor(x - 0.5)
    return ranks


def sample_ranks(dist: Distribution, rng: np.random.Generator, nblocks: int, n: int) -> np.ndarray:
    """``n`` block ranks in [0, nblocks) drawn from ``dist``; rank 0 is the hottest."""
    if dist.kind == "random":
        return rng.integers(0, nblocks, n, dtype=np.uint64)
    u = rng.random(n)
    if dist.kind == "zipf":
        ranks = _zipf_ranks(dist.param, nblocks, u)
    elif dist.kind == "pareto":
        h = dist.param
        ranks = np.floor((nblocks - 1) * np.power(u, math.log(h) / math.log(1.0 - h)))
    else:
        sigma = dist.param / 100.0 * nblocks
        ranks = np.rint(nblocks / 2 + rng.standard_normal(n) * sigma)
    return np.clip(ranks, 0, nblocks - 1).astype(np.uint64)


class OffsetStream:
    """One worker's stream of (target index, byte offset) batches for one job.

    ``regions`` gives, per target, the first byte and the number of ``bs`` blocks the job may
    touch. ``budget`` is the number of I/Os this worker issues before it is done (None: no
    limit, for time-based jobs).
    """

    def __init__(self, *, random: bool, bs: int, regions: list[tuple[int, int]],
                 dist: Distribution, file_service: str, seed: tuple[int, ...],
                 budget: int | None, write_fraction: float = 0.0,
                 subset: tuple[int, ...] | None = None) -> None:
        """``subset``: the only targets (indexes) this worker reads (its GPU's gpu_targets)."""
        self._random = random
        self._bs = bs
        self._starts = np.array([r[0] for r in regions], dtype=np.uint64)
        self._nblocks = [r[1] for r in regions]
        self._dist = dist
        self._file_random = file_service == "random"
        self._rng = np.random.default_rng(list(seed))
        self._salt = int(self._rng.integers(0, 1 << 63))
        self._cursor = [0] * len(regions)
        self._rr = 0
        self._subset = np.array(subset if subset else range(len(regions)), dtype=np.int32)
        self.remaining = budget
        self._tgt = np.empty(0, np.int32)
        self._offs = np.empty(0, np.uint64)
        self._pos = self._last = 0
        # a mixed job draws each I/O's direction from its own stream, so that its offsets
        # are those of the same job reading only
        self._write_fraction = write_fraction
        self._mixed = 0.0 < write_fraction < 1.0
        self._dir_rng = np.random.default_rng([*seed, 1])
        self._wr = np.empty(0, bool)

    def next(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` I/Os as (target indices int32, offsets uint64); empty when done.

        Offsets are generated CHUNK at a time and handed out as slices, so a worker that asks
        for a few I/Os at a time does not pay numpy's per-call cost for each small batch.
        """
        if self.remaining is not None:
            n = min(n, self.remaining)
            self.remaining -= n
        if self._pos + n > len(self._offs):
            tail_t, tail_o = self._tgt[self._pos:], self._offs[self._pos:]
            k = max(CHUNK, n)
            new_t, new_o = self._generate(k)
            if len(tail_o):
                new_t, new_o = np.concatenate((tail_t, new_t)), np.concatenate((tail_o, new_o))
            self._tgt, self._offs = new_t, new_o
            if self._mixed:
                self._wr = np.concatenate((self._wr[self._pos:],
                                           self._dir_rng.random(k) < self._write_fraction))
            self._pos = 0
        self._last, self._pos = self._pos, self._pos + n
        return self._tgt[self._last:self._pos], self._offs[self._last:self._pos]

    def last_writes(self) -> np.ndarray | bool:
        """Whether the I/Os of the last ``next`` batch write (an array for a mixed job)."""
        if self._mixed:
            return self._wr[self._last:self._pos]
        return self._write_fraction == 1.0

    def region_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(first byte, number of bs blocks) of each target's region as uint64 arrays, for
        engines whose offsets are generated elsewhere (GPU threads pick their own)."""
        return self._starts.copy(), np.array(self._nblocks, dtype=np.uint64)

    def _generate(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ntargets = len(self._subset)
        if ntargets == 1 and not self._file_random:
            # the common job, one target: the same offsets as below in fewer array passes
            # (a worker's ring is drained while Python makes them)
            t = int(self._subset[0])
            offs = self._blocks_for(t, n)
            offs *= np.uint64(self._bs)
            offs += self._starts[t]
            return np.full(n, t, dtype=np.int32), offs
        if self._file_random:
            tgt = self._subset[self._rng.integers(0, ntargets, n)]
        else:
            tgt = self._subset[(self._rr + np.arange(n)) % ntargets]
            self._rr = (self._rr + n) % ntargets
        blocks = np.empty(n, dtype=np.uint64)
        for t in self._subset.tolist():
            mask = tgt == t if ntargets > 1 else slice(None)
            k = int(np.count_nonzero(mask)) if ntargets > 1 else n
            blocks[mask] = self._blocks_for(t, k)
        return tgt, self._starts[tgt] + blocks * np.uint64(self._bs)

    def _blocks_for(self, t: int, k: int) -> np.ndarray:
        nblocks = self._nblocks[t]
        if not self._random:
            blocks = (self._cursor[t] + np.arange(k, dtype=np.uint64)) % np.uint64(nblocks)
            self._cursor[t] = (self._cursor[t] + k) % nblocks
            return blocks
        ranks = sample_ranks(self._dist, self._rng, nblocks, k)
        if self._dist.kind == "random":
            return ranks
        return _hash(ranks, self._salt + t) % np.uint64(nblocks)


class ReplayStream:
    """One worker's replay of an iolog (core/iolog.Trace): its I/Os in its order, ``budget``
    of them (None: over and over, for a time-based job). OffsetStream's interface but for
    region_arrays: engines that draw their own offsets refuse replays. ``writes`` False reads
    where the log writes: the read-back of a replay that wrote."""

    def __init__(self, trace: Any, *, budget: int | None, writes: bool = True) -> None:
        self._tgt, self._offs = trace.tgt, trace.offs
        self._wr = trace.writes if writes else np.zeros(len(trace.tgt), bool)
        self._pos = 0
        self._idx = np.zeros(0, np.int64)
        self.remaining = budget
        self._mixed = bool(self._wr.any() and not self._wr.all())

    def next(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` of the trace's next I/Os; empty once a single replay is done."""
        if self.remaining is not None:
            n = min(n, self.remaining)
            self.remaining -= n
        self._idx = (self._pos + np.arange(n, dtype=np.int64)) % len(self._tgt)
        self._pos = (self._pos + n) % len(self._tgt)
        return self._tgt[self._idx], self._offs[self._idx]

    def last_writes(self) -> np.ndarray | bool:
        if self._mixed:
            return self._wr[self._idx]
        return bool(self._wr[0])
