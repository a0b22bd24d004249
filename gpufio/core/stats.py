"""Latency statistics the way fio computes them, so numbers are comparable with fio's.

The histogram is fio's log-linear layout: values in ns, 64 buckets per power of two
(FIO_IO_U_PLAT_BITS = 6), 29 groups (1856 buckets), values below 128 ns exact, a bucket
reported at its midpoint (error <= 1/128). Histograms add bucket by bucket, so workers,
jobs, targets and GPUs merge exactly. min/max/mean/stddev come from the exact samples.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

import numpy as np

from gpufio.native import build

PLAT_BITS = 6
PLAT_VAL = 1 << PLAT_BITS
PLAT_GROUP_NR = 29
PLAT_NR = PLAT_GROUP_NR * PLAT_VAL

PERCENTILES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0,
               95.0, 99.0, 99.5, 99.9, 99.95, 99.99)


def bucket_index(values_ns: np.ndarray) -> np.ndarray:
    """fio's plat_val_to_idx, vectorised over non-negative int64 latencies."""
    v = np.asarray(values_ns, dtype=np.int64)
    # frexp is exact for integers below 2**53 ns (104 days): msb = exponent - 1
    msb = np.frexp(v.astype(np.float64))[1].astype(np.int64) - 1
    error_bits = np.maximum(msb - PLAT_BITS, 0)
    base = (error_bits + 1) << PLAT_BITS
    offset = (PLAT_VAL - 1) & (v >> error_bits)
    idx = np.where(msb <= PLAT_BITS, v, base + offset)
    return np.minimum(idx, PLAT_NR - 1)


def bucket_value(idx: np.ndarray) -> np.ndarray:
    """fio's plat_idx_to_val: the midpoint of each bucket, in ns."""
    idx = np.asarray(idx, dtype=np.int64)
    error_bits = np.maximum((idx >> PLAT_BITS) - 1, 0)
    base = np.left_shift(np.int64(1), error_bits + PLAT_BITS)
    k = idx % PLAT_VAL
    mid = base + ((k + 0.5) * np.left_shift(np.int64(1), error_bits)).astype(np.int64)
    return np.where(idx < (PLAT_VAL << 1), idx, mid)


@dataclass
class LatencyStats:
    """A mergeable latency summary: fio's histogram plus exact moments and extremes."""

    hist: np.ndarray = field(default_factory=lambda: np.zeros(PLAT_NR, dtype=np.int64))
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: int = 0
    max: int = 0

    def add(self, lat_ns: np.ndarray) -> None:
        """Record a batch of latencies (ns)."""
        if len(lat_ns) == 0:
            return
        lat = np.ascontiguousarray(lat_ns, dtype=np.int64)
        fn = build.lat_function()
        h = self.hist
        if (fn is not None and h.dtype == np.int64 and h.size == PLAT_NR
                and h.flags.c_contiguous and h.flags.writeable):
            # compiled: every recorded I/O is binned here, and NumPy's passes over the
            # batch are time the worker's ring spends drained
            moments, extremes = np.empty(2), np.empty(2, np.int64)
            fn(lat.ctypes.data, len(lat), h.ctypes.data, moments.ctypes.data,
               extremes.ctypes.data)
            batch = LatencyStats(n=len(lat), mean=float(moments[0]), m2=float(moments[1]),
                                 min=int(extremes[0]), max=int(extremes[1]))
        else:
            self.hist += np.bincount(bucket_index(lat), minlength=PLAT_NR)
            batch = LatencyStats(n=len(lat), mean=float(lat.mean()),
                                 m2=float(((lat - lat.mean()) ** 2).sum()),
                                 min=int(lat.min()), max=int(lat.max()))
        self._merge_moments(batch)

    def merge(self, other: "LatencyStats") -> None:
        """Fold another summary into this one (exact for the histogram)."""
        self.hist += other.hist
        self._merge_moments(other)

    def _merge_moments(self, o: "LatencyStats") -> None:
        if o.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2, self.min, self.max = o.n, o.mean, o.m2, o.min, o.max
            return
        n = self.n + o.n
        delta = o.mean - self.mean
        self.mean += delta * o.n / n
        self.m2 += o.m2 + delta * delta * self.n * o.n / n
        self.n = n
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)

    @property
    def stddev(self) -> float:
        """Sample standard deviation, as fio reports it."""
        return (self.m2 / (self.n - 1)) ** 0.5 if self.n > 1 else 0.0

    def percentiles(self, plist: tuple[float, ...] = PERCENTILES) -> dict[float, int]:
        """fio's calc_clat_percentiles: first bucket whose running count reaches p% of N."""
        if self.n == 0:
            return {p: 0 for p in plist}
        cum = np.cumsum(self.hist)
        total = int(cum[-1])
        thresholds = np.array(plist, dtype=np.float64) / 100.0 * total
        idx = np.minimum(np.searchsorted(cum, thresholds, side="left"), PLAT_NR - 1)
        return dict(zip(plist, bucket_value(idx).tolist()))


@dataclass
class CpuTimes:
    """User and system CPU seconds of this process, io_uring's kernel threads included."""

    usr: float
    sys: float

    @classmethod
    def now(cls) -> "CpuTimes":
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return cls(ru.ru_utime, ru.ru_stime)

    def __sub__(self, other: "CpuTimes") -> "CpuTimes":
        return CpuTimes(self.usr - other.usr, self.sys - other.sys)
