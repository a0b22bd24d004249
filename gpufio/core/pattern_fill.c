/* The data pattern of gpufio/core/pattern.py, compiled: every 8-byte word at byte offset x of
 * a target is splitmix64(x ^ seed * golden), and the first four words of each 4 KiB block are
 * its header (magic, the block's offset, the seed, a check word). Python's NumPy version is
 * the reference; tests compare the two word for word. */
#include <stddef.h>
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define M1 0xBF58476D1CE4E5B9ULL
#define M2 0x94D049BB133111EBULL
#define BLOCK 4096ULL

static inline uint64_t splitmix64(uint64_t z)
{
    z += GOLDEN;
    z = (z ^ (z >> 30)) * M1;
    z = (z ^ (z >> 27)) * M2;
    return z ^ (z >> 31);
}

/* n rows of `words` words, `stride` words apart in `out`: row i is the pattern of seed
 * seeds[i] from byte offsets[i] on (8-byte aligned). */
static inline uint64_t header_word(uint64_t x, uint64_t seed, uint64_t magic)
{
    const uint64_t pos = (x & (BLOCK - 1)) >> 3, block = x - pos * 8;
    return pos == 0 ? magic : pos == 1 ? block : pos == 2 ? seed : block ^ (seed ^ magic);
}

/* n rows of `words` words, `stride` words apart in `out`: row i is the pattern of seed
 * seeds[i] from byte offsets[i] on (8-byte aligned). The words of a block past its header
 * are one branch-free loop, which the compiler unrolls. */
void gpufio_fill(uint64_t *out, size_t stride, size_t n, size_t words,
                 const uint64_t *offsets, const uint64_t *seeds, uint64_t magic)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t *row = out + i * stride;
        const uint64_t seed = seeds[i], mix = seed * GOLDEN;
        const uint64_t start = offsets[i], end = start + 8 * words;
        uint64_t x = start;
        while (x < end) {
            const uint64_t block_end = (x | (BLOCK - 1)) + 1;
            const uint64_t stop = block_end < end ? block_end : end;
            while (x < stop && ((x & (BLOCK - 1)) >> 3) < 4) {
                row[(x - start) >> 3] = header_word(x, seed, magic);
                x += 8;
            }
            uint64_t *dst = row + ((x - start) >> 3);
            const size_t count = (stop - x) >> 3;
            for (size_t w = 0; w < count; w++)
                dst[w] = splitmix64((x + 8 * w) ^ mix);
            x = stop;
        }
    }
}
