// The data pattern on the GPU, word for word as gpufio/core/pattern.py writes it: the word at byte
// offset x of a target is a function of (seed, x). The first header_words words of every
// block_bytes block are magic, the block's own offset, the seed and a check word; every
// other word is splitmix64(x ^ seed_mix), seed_mix = seed * golden ratio.
#pragma once

// PATTERN_GOLDEN, PATTERN_M1 and PATTERN_M2 come from gpufio/core/pattern.py through
// gpufio/io/gio/contract.py, as NVRTC macros
#ifndef PATTERN_GOLDEN
#error "compile through gpufio.io.cuda (module or raw_module): it defines the pattern's constants"
#endif

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z)
{
    z += PATTERN_GOLDEN;
    z = (z ^ (z >> 30)) * PATTERN_M1;
    z = (z ^ (z >> 27)) * PATTERN_M2;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long pattern_word(
    unsigned long long x, unsigned long long seed, unsigned long long magic,
    unsigned long long block_bytes, unsigned long long header_words)
{
    const unsigned long long slot = (x % block_bytes) / 8;
    if (slot >= header_words) {
        return splitmix64(x ^ (seed * PATTERN_GOLDEN));
    }
    const unsigned long long block_off = x - 8 * slot;
    return slot == 0 ? magic : slot == 1 ? block_off : slot == 2 ? seed
         : (block_off ^ seed ^ magic);
}
