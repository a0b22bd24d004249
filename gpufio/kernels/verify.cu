// Pattern check in GPU memory: one thread per 8-byte word, grid-stride.
// Each word at byte offset x of a target is a function of (seed, x) (pattern.cuh). A word
// that differs adds one to bad[io] for the I/O that holds it.

#include "pattern.cuh"

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
        const unsigned long long expect =
            pattern_word(x, seeds[io], seed_mix[io], magic, block_bytes, header_words);
        if (data[w] != expect) {
            atomicAdd(&bad[io], 1u);
        }
    }
}
