// Pattern check in GPU memory: one thread per 8-byte word, grid-stride.
// Each word at byte offset x of a target is a function of (seed, x) (pattern.cuh). A thread
// that finds a wrong word sets bad[io] = mark for the I/O holding it. Every such store
// writes the same value, so none needs an atomic, and bad needs no clearing between checks
// when each check brings a new mark: bad may be host memory mapped into the GPU, which the
// host reads once the stream has passed the check, with no copy back.

#include "pattern.cuh"

extern "C" __global__ void mark_mismatches(
    const unsigned long long* data, const unsigned long long* offsets,
    const unsigned long long* seeds, unsigned long long magic, unsigned long long io_words,
    unsigned long long block_bytes, unsigned long long header_words,
    unsigned long long total_words, unsigned int mark, unsigned int* bad)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long w = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         w < total_words; w += stride) {
        const unsigned long long io = w / io_words;
        const unsigned long long x = offsets[io] + 8 * (w % io_words);
        const unsigned long long seed = seeds[io];
        const unsigned long long expect = pattern_word(x, seed, magic, block_bytes, header_words);
        if (data[w] != expect) {
            bad[io] = mark;
        }
    }
}

// The pattern written on the GPU: I/O i's words go to row rows[i] of data (io_words words a
// row), so a write from GPU memory carries the bytes a later read of its offset proves.
extern "C" __global__ void fill_pattern(
    unsigned long long* data, const unsigned long long* rows, const unsigned long long* offsets,
    const unsigned long long* seeds, unsigned long long magic, unsigned long long io_words,
    unsigned long long block_bytes, unsigned long long header_words,
    unsigned long long total_words)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long w = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         w < total_words; w += stride) {
        const unsigned long long io = w / io_words, i = w % io_words;
        data[rows[io] * io_words + i] =
            pattern_word(offsets[io] + 8 * i, seeds[io], magic, block_bytes, header_words);
    }
}
