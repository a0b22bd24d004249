/* fio's latency histogram (gpufio/core/stats.py), compiled: a batch of latencies binned into
 * fio's log-linear buckets and summed into the histogram, with the batch's moments. The
 * NumPy version in stats.py is the reference; tests compare the two bucket for bucket. A
 * worker bins every latency it records, so this is per-I/O cost: NumPy takes about ten
 * array passes for what is here two. */
#include <stddef.h>
#include <stdint.h>

#define PLAT_BITS 6
#define PLAT_VAL (1 << PLAT_BITS)
#define PLAT_NR (29 * PLAT_VAL)

/* fio's plat_val_to_idx: values below 2 * PLAT_VAL are their own bucket (a negative one,
 * which a monotonic clock never gives, goes in bucket 0 rather than out of the array). */
static inline int64_t bucket(int64_t v)
{
    if (v < 2 * PLAT_VAL)
        return v < 0 ? 0 : v;
    const int64_t msb = 63 - __builtin_clzll((uint64_t)v);
    const int64_t error_bits = msb - PLAT_BITS;
    const int64_t idx = ((error_bits + 1) << PLAT_BITS) + ((PLAT_VAL - 1) & (v >> error_bits));
    return idx < PLAT_NR ? idx : PLAT_NR - 1;
}

/* Add the n latencies (ns) of `lat` into `hist` (PLAT_NR counts); `moments` gets the batch's
 * mean and sum of squared deviations from it, `extremes` its min and max. n > 0. */
void gpufio_lat_add(const int64_t *lat, size_t n, int64_t *hist, double *moments,
                    int64_t *extremes)
{
    int64_t lo = lat[0], hi = lat[0];
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const int64_t v = lat[i];
        hist[bucket(v)]++;
        sum += (double)v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const double mean = sum / (double)n;
    double m2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)lat[i] - mean;
        m2 += d * d;
    }
    moments[0] = mean;
    moments[1] = m2;
    extremes[0] = lo;
    extremes[1] = hi;
}
