// Pattern check in GPU memory: one thread per 8-byte word, grid-stride.
// Each word at byte offset x of a target is a function of (seed, x) (see gpufio/pattern.py):
// the first header_words words of every block_bytes block are magic, the block's own offset,
// the seed and a check word; every other word is splitmix64(x ^ seed_mix). A word that
// differs adds one to bad[io] for the I/O that holds it.

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void count_mismatches(
    const unsigned long long* data, const unsigned long long* offsets,
    const unsigned long long* seeds, const unsigned long long* seed_mix,
    unsigned long long magic, unsigned long long io_words, unsigned long long block_bytes,
    unsigned long long header_words, unsigned long long total_words, unsigned int* bad)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long w = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         w < total_words; w += stride) {
        const unsigned long long io = w / io_words;
        const unsigned long long x = offsets[io] + 8 * (w % io_words);
        const unsigned long long slot = (x % block_bytes) / 8;
        unsigned long long expect;
        if (slot < header_words) {
            const unsigned long long block_off = x - 8 * slot;
            const unsigned long long seed = seeds[io];
            expect = slot == 0 ? magic : slot == 1 ? block_off : slot == 2 ? seed
                   : (block_off ^ seed ^ magic);
        } else {
            expect = splitmix64(x ^ seed_mix[io]);
        }
        if (data[w] != expect) {
            atomicAdd(&bad[io], 1u);
        }
    }
}
