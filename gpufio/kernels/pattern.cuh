// The data pattern on the GPU, word for word as gpufio/core/pattern.py writes it: the word at byte
// offset x of a target is a function of (seed, x). The first header_words words of every
// block_bytes block are magic, the block's own offset, the seed and a check word; every
// other word is splitmix64(x ^ seed_mix), seed_mix = seed * golden ratio.
#pragma once

#define PATTERN_GOLDEN 0x9E3779B97F4A7C15ULL  // gpufio.pattern.GOLDEN

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
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
